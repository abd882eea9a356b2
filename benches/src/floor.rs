//! The floor under a subject's sync: the same list read bare by the default subject's
//! client, the body read and discarded, timed from the request to its last byte.

use std::time::Instant;

use anyhow::{Context, bail};
use futures::AsyncBufReadExt;

/// What a streaming list's end looks like on the wire: the bookmark carrying this
/// annotation (its bytes appear in no benchmark Pod).
const INITIAL_EVENTS_END: &[u8] = b"k8s.io/initial-events-end";

/// Protobuf, which both kube-informer and client-go prefer for built-in kinds.
const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// One unpaged protobuf list of the Pods of `namespace`; returns (ms, body bytes).
///
/// # Errors
///
/// When the request fails or the body breaks off.
pub async fn list(client: &kube_client::Client, namespace: &str) -> anyhow::Result<(f64, u64)> {
    let uri = format!("/api/v1/namespaces/{namespace}/pods");
    warm(client).await?;
    let started = Instant::now();
    let body = client
        .request_stream(request(&uri, PROTOBUF)?)
        .await
        .with_context(|| format!("GET {uri}"))?;
    let bytes = drain(body, None)
        .await
        .with_context(|| format!("reading {uri}"))?;
    Ok((started.elapsed().as_secs_f64() * 1000.0, bytes))
}

/// One streaming list (a watch with `sendInitialEvents=true`) of the Pods of `namespace`
/// in protobuf, read until the bookmark that ends the initial events; returns (ms, bytes
/// read).
///
/// # Errors
///
/// When the request fails, or the stream ends before that bookmark.
pub async fn streaming_list(
    client: &kube_client::Client,
    namespace: &str,
) -> anyhow::Result<(f64, u64)> {
    let uri = format!(
        "/api/v1/namespaces/{namespace}/pods?watch=true&sendInitialEvents=true\
         &allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=600"
    );
    warm(client).await?;
    let started = Instant::now();
    let body = client
        .request_stream(request(&uri, &format!("{PROTOBUF};stream=watch"))?)
        .await
        .with_context(|| format!("GET {uri}"))?;
    let bytes = drain(body, Some(INITIAL_EVENTS_END))
        .await
        .with_context(|| format!("reading {uri}"))?;
    // Dropping the body closes the watch.
    Ok((started.elapsed().as_secs_f64() * 1000.0, bytes))
}

/// One small request first, so every timed read starts on an open connection: a streaming
/// read ends by dropping its connection mid-body, and the next read would otherwise pay
/// for a new one (the floor is the read, not the connection).
async fn warm(client: &kube_client::Client) -> anyhow::Result<()> {
    client
        .apiserver_version()
        .await
        .context("GET /version before a floor read")?;
    Ok(())
}

fn request(uri: &str, accept: &str) -> anyhow::Result<http::Request<Vec<u8>>> {
    http::Request::get(uri)
        .header(http::header::ACCEPT, accept)
        .body(Vec::new())
        .with_context(|| format!("building GET {uri}"))
}

/// Reads `body` to its end, or until `until` has been read; returns the bytes read.
async fn drain(body: impl futures::AsyncBufRead, until: Option<&[u8]>) -> anyhow::Result<u64> {
    let mut body = Box::pin(body);
    let finder = until.map(memchr::memmem::Finder::new);
    let mut total = 0u64;
    // The end of the previous chunk, so a needle split across two chunks is found.
    let mut tail: Vec<u8> = Vec::new();
    loop {
        let chunk = body.fill_buf().await?;
        if chunk.is_empty() {
            if finder.is_some() {
                bail!("the stream ended before the initial-events-end bookmark");
            }
            return Ok(total);
        }
        let len = chunk.len();
        total += len as u64;
        if let Some(finder) = &finder {
            let needle = finder.needle().len();
            let head = &chunk[..len.min(needle)];
            tail.extend_from_slice(head);
            if finder.find(&tail).is_some() || finder.find(chunk).is_some() {
                return Ok(total);
            }
            tail.clear();
            tail.extend_from_slice(&chunk[len.saturating_sub(needle - 1)..]);
        }
        body.as_mut().consume(len);
    }
}
