//! Plain-HTTP requests to the local components' own APIs: etcd's JSON gateway
//! and Toxiproxy's control API.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};

/// Sends `method uri` with an optional JSON `body`, and returns the status
/// and body of the answer; the error says why there was none within
/// `timeout`.
///
/// A client per request keeps no connection pooled across tokio runtimes,
/// which each `#[tokio::test]` has its own of.
pub(crate) async fn request(
    method: Method,
    uri: &str,
    body: Option<String>,
    timeout: Duration,
) -> Result<(StatusCode, String), String> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut request = http::Request::builder().method(method).uri(uri);
    if body.is_some() {
        request = request.header(http::header::CONTENT_TYPE, "application/json");
    }
    let request = request
        .body(Full::new(body.map(Bytes::from).unwrap_or_default()))
        .map_err(|e| e.to_string())?;
    let exchange = async {
        let response = client.request(request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| format!("no answer within {timeout:?}"))?
}
