//! An HTTP/1.1 server written by hand, so that it can answer what no real API server would:
//! a body cut short, a line that never ends, a type the client did not ask for. Each test
//! gives it a script, a function from a request to the reply; the server records every
//! request and how each reply went, and tests wait on those records instead of on time.

use std::{collections::HashMap, sync::Arc, time::Duration};

use bytes::Bytes;
use futures::{StreamExt, future::BoxFuture, stream::BoxStream};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::watch,
    task::JoinHandle,
};

/// How long a test waits for the server to see what it expects before it fails.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// A request head, as the client sent it.
#[derive(Clone, Debug)]
pub struct Request {
    /// The path, without the query.
    pub path: String,
    /// The query's parameters, decoded.
    pub query: HashMap<String, String>,
}

impl Request {
    /// A query parameter.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query.get(name).map(String::as_str)
    }

    /// Whether this is a watch (`watch=true`) rather than a list.
    pub fn is_watch(&self) -> bool {
        matches!(self.param("watch"), Some("true" | "1"))
    }
}

/// A reply's body.
pub enum Body {
    /// Sent whole, its length said.
    Full(Vec<u8>),
    /// Sent chunk by chunk (chunked transfer) as the stream yields them; the stream's end
    /// ends the reply. A stream that never ends is a reply that never ends.
    Stream(BoxStream<'static, Bytes>),
    /// `Content-Length` says `claimed` bytes, but only `sent` are sent before the
    /// connection closes.
    CutShort { claimed: usize, sent: Vec<u8> },
}

/// A reply: a status, headers, and a body.
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Body,
}

impl Reply {
    /// 200 with a JSON body.
    pub fn json(value: &serde_json::Value) -> Self {
        Self {
            status: 200,
            headers: vec![("Content-Type", "application/json".to_owned())],
            body: Body::Full(serde_json::to_vec(value).expect("JSON")),
        }
    }

    /// 200 with a body of `content_type` sent as `body` yields it.
    pub fn streamed(content_type: &str, body: BoxStream<'static, Bytes>) -> Self {
        Self {
            status: 200,
            headers: vec![("Content-Type", content_type.to_owned())],
            body: Body::Stream(body),
        }
    }
}

/// How the server's part of one exchange ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The whole reply was written.
    Sent { body_bytes: usize },
    /// The client closed the connection (or stopped reading and reset it) first.
    ClientGone { body_bytes: usize },
}

impl Outcome {
    /// The body's bytes written before it ended.
    pub fn body_bytes(self) -> usize {
        match self {
            Outcome::Sent { body_bytes } | Outcome::ClientGone { body_bytes } => body_bytes,
        }
    }
}

/// What the server has seen: every request, in order, and the outcome of each reply that
/// ended, by the request's index.
#[derive(Clone, Debug, Default)]
pub struct Log {
    pub requests: Vec<Request>,
    pub outcomes: HashMap<usize, Outcome>,
}

impl Log {
    /// The watch requests.
    pub fn watches(&self) -> Vec<&Request> {
        self.requests.iter().filter(|r| r.is_watch()).collect()
    }

    /// The list requests, every page.
    pub fn lists(&self) -> Vec<&Request> {
        self.requests.iter().filter(|r| !r.is_watch()).collect()
    }
}

type Script = dyn Fn(Request) -> BoxFuture<'static, Reply> + Send + Sync;

/// The server; it stops when dropped.
pub struct Server {
    url: String,
    log: watch::Receiver<Log>,
    task: JoinHandle<()>,
}

impl Server {
    /// Listens on a port of the loopback interface, answering each request as `script`
    /// says.
    pub async fn start(
        script: impl Fn(Request) -> BoxFuture<'static, Reply> + Send + Sync + 'static,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
        let url = format!("http://{}", listener.local_addr().expect("bound"));
        let (log, reader) = watch::channel(Log::default());
        let log = Arc::new(log);
        let script: Arc<Script> = Arc::new(script);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                tokio::spawn(serve(stream, script.clone(), log.clone()));
            }
        });
        Self {
            url,
            log: reader,
            task,
        }
    }

    /// The base URL to point a client at.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// What the server has seen so far.
    pub fn log(&self) -> Log {
        self.log.borrow().clone()
    }

    /// Waits until what the server has seen satisfies `condition`; panics naming `what`
    /// after [`PATIENCE`].
    pub async fn wait_for(&self, what: &str, condition: impl Fn(&Log) -> bool) -> Log {
        let mut log = self.log.clone();
        let seen = tokio::time::timeout(PATIENCE, log.wait_for(|l| condition(l)))
            .await
            .unwrap_or_else(|_| panic!("{what}: not within {PATIENCE:?}; saw {:#?}", self.log()))
            .expect("the server runs as long as it is held");
        seen.clone()
    }

    /// The outcome of the reply to the request of index `request`, once it has ended.
    pub async fn outcome(&self, request: usize) -> Outcome {
        let log = self
            .wait_for(&format!("the end of reply {request}"), |l| {
                l.outcomes.contains_key(&request)
            })
            .await;
        log.outcomes[&request]
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves one connection: one request, one reply, then the connection closes (every reply
/// says `Connection: close`), so a reply cut short never leaves a connection behind it.
async fn serve(mut stream: TcpStream, script: Arc<Script>, log: Arc<watch::Sender<Log>>) {
    let Some(request) = read_head(&mut stream).await else {
        return;
    };
    let mut index = 0;
    log.send_modify(|l| {
        index = l.requests.len();
        l.requests.push(request.clone());
    });
    let reply = script(request).await;
    let outcome = write_reply(&mut stream, reply).await;
    log.send_modify(|l| {
        l.outcomes.insert(index, outcome);
    });
}

/// Reads a request's head; `None` for a connection that closed or sent no HTTP.
async fn read_head(stream: &mut TcpStream) -> Option<Request> {
    let mut head = Vec::new();
    let mut buf = [0; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await.ok()?;
        if n == 0 || head.len() > 64 << 10 {
            return None;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&head);
    let target = head.lines().next()?.split(' ').nth(1)?;
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let query = query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(name), decode(value))
        })
        .collect();
    Some(Request {
        path: path.to_owned(),
        query,
    })
}

/// A query component, `+` and `%XX` decoded.
fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(byte) => {
                        out.push(byte);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            byte => out.push(byte),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Writes `reply`; how far it got.
async fn write_reply(stream: &mut TcpStream, reply: Reply) -> Outcome {
    let mut body_bytes = 0;
    let written = write_parts(stream, reply, &mut body_bytes).await;
    let _ = stream.shutdown().await;
    match written {
        Ok(()) => Outcome::Sent { body_bytes },
        Err(_) => Outcome::ClientGone { body_bytes },
    }
}

async fn write_parts(
    stream: &mut TcpStream,
    reply: Reply,
    sent: &mut usize,
) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {} Hostile\r\nConnection: close\r\n", reply.status);
    for (name, value) in &reply.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    match reply.body {
        Body::Full(body) => {
            head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
            stream.write_all(head.as_bytes()).await?;
            stream.write_all(&body).await?;
            *sent += body.len();
        }
        Body::CutShort {
            claimed,
            sent: part,
        } => {
            head.push_str(&format!("Content-Length: {claimed}\r\n\r\n"));
            stream.write_all(head.as_bytes()).await?;
            stream.write_all(&part).await?;
            *sent += part.len();
        }
        Body::Stream(mut chunks) => {
            head.push_str("Transfer-Encoding: chunked\r\n\r\n");
            stream.write_all(head.as_bytes()).await?;
            while let Some(chunk) = chunks.next().await {
                if chunk.is_empty() {
                    continue;
                }
                let mut framed = Vec::with_capacity(chunk.len() + 16);
                framed.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                framed.extend_from_slice(&chunk);
                framed.extend_from_slice(b"\r\n");
                stream.write_all(&framed).await?;
                *sent += chunk.len();
            }
            stream.write_all(b"0\r\n\r\n").await?;
        }
    }
    stream.flush().await
}
