//! Requests spread over as many HTTP/2 connections as their open streams need.
//!
//! An HTTP/2 server caps the streams one connection may hold open at once (kube-apiserver
//! advertises 100 unless `--http2-max-streams-per-connection` says otherwise), and a watch
//! holds its stream for minutes. A client that puts every request on one connection queues
//! the request past the cap until some stream ends: past 100 watches, the next watch, list
//! or probe waits for a watch's timeout. Go's transport opens another connection when one is
//! full; so does this pool. Each of its connections carries at most a set number of open
//! streams (a request counts from its sending until its response body is dropped), and a
//! request that finds every connection full is sent on a new one.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
    task::{Context, Poll},
};

use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use tower::Service;
use tracing::debug;

/// kube-apiserver's advertised cap on a connection's open streams when its
/// `--http2-max-streams-per-connection` is not set.
pub(crate) const DEFAULT_STREAMS_PER_CONNECTION: usize = 100;

/// A set of clients, each with its own connection, that sends each request on the first
/// one with a free stream.
pub(crate) struct StreamPool<S> {
    connections: Arc<Mutex<Vec<Connection<S>>>>,
    connect: Arc<dyn Fn() -> S + Send + Sync>,
    streams_per_connection: usize,
}

impl<S> Clone for StreamPool<S> {
    fn clone(&self) -> Self {
        Self {
            connections: self.connections.clone(),
            connect: self.connect.clone(),
            streams_per_connection: self.streams_per_connection,
        }
    }
}

struct Connection<S> {
    client: S,
    open: Arc<AtomicUsize>,
}

impl<S> StreamPool<S> {
    /// A pool whose connections each come from `connect` (a client with its own connection
    /// pool) and carry at most `streams_per_connection` open streams (at least 1).
    pub(crate) fn new(
        streams_per_connection: usize,
        connect: impl Fn() -> S + Send + Sync + 'static,
    ) -> Self {
        Self {
            connections: Arc::default(),
            connect: Arc::new(connect),
            streams_per_connection: streams_per_connection.max(1),
        }
    }

    /// The client of the first connection with a free stream, opening a connection when
    /// none has one, and the stream it takes.
    fn checkout(&self) -> (S, OpenStream)
    where
        S: Clone,
    {
        let mut connections = self
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Taken under the lock, so two requests never both take a connection's last stream.
        let free = connections
            .iter()
            .find(|c| c.open.load(Ordering::Acquire) < self.streams_per_connection);
        let connection = match free {
            Some(connection) => connection,
            None => {
                debug!(
                    connections = connections.len() + 1,
                    streams_per_connection = self.streams_per_connection,
                    "every connection carries its most streams: opening another"
                );
                connections.push(Connection {
                    client: (self.connect)(),
                    open: Arc::default(),
                });
                connections.last().expect("just pushed")
            }
        };
        connection.open.fetch_add(1, Ordering::AcqRel);
        (
            connection.client.clone(),
            OpenStream(connection.open.clone()),
        )
    }

    /// How many connections the pool has opened, and the streams open on each.
    #[cfg(test)]
    fn open_streams(&self) -> Vec<usize> {
        self.connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|c| c.open.load(Ordering::Acquire))
            .collect()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for StreamPool<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<CountedBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // A connection is chosen per request, in `call`; each client is always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let (mut client, stream) = self.checkout();
        let response = client.call(request);
        Box::pin(async move {
            // An error drops `stream`, freeing it.
            let response = response.await?;
            Ok(response.map(|body| CountedBody { body, stream }))
        })
    }
}

/// A stream counted as open on its connection until dropped.
struct OpenStream(Arc<AtomicUsize>);

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body whose stream counts as open until the body is dropped.
pub(crate) struct CountedBody<B> {
    body: B,
    #[allow(dead_code, reason = "held for its drop, which frees the stream")]
    stream: OpenStream,
}

impl<B: Body + Unpin> Body for CountedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::{convert::Infallible, sync::atomic::AtomicUsize};

    use http_body_util::Empty;
    use tower::ServiceExt;

    use super::*;

    /// A client that answers at once and says which connection it stands for.
    #[derive(Clone)]
    struct Numbered(usize);

    impl Service<Request<()>> for Numbered {
        type Response = Response<Empty<bytes::Bytes>>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<Self::Response, Infallible>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _request: Request<()>) -> Self::Future {
            let mut response = Response::new(Empty::new());
            response.extensions_mut().insert(self.0);
            std::future::ready(Ok(response))
        }
    }

    fn pool(streams_per_connection: usize) -> StreamPool<Numbered> {
        let opened = AtomicUsize::new(0);
        StreamPool::new(streams_per_connection, move || {
            Numbered(opened.fetch_add(1, Ordering::Relaxed))
        })
    }

    async fn send(pool: &StreamPool<Numbered>) -> Response<CountedBody<Empty<bytes::Bytes>>> {
        pool.clone()
            .oneshot(Request::new(()))
            .await
            .expect("infallible")
    }

    fn connection_of<B>(response: &Response<B>) -> usize {
        *response.extensions().get::<usize>().expect("numbered")
    }

    #[tokio::test]
    async fn a_full_connection_sends_the_next_request_on_a_new_one() {
        let pool = pool(2);
        let first = send(&pool).await;
        let second = send(&pool).await;
        let third = send(&pool).await;
        assert_eq!(
            [&first, &second, &third].map(connection_of),
            [0, 0, 1],
            "two streams fill the first connection"
        );
        assert_eq!(pool.open_streams(), [2, 1]);
    }

    #[tokio::test]
    async fn a_dropped_body_frees_its_stream_for_the_next_request() {
        let pool = pool(2);
        let first = send(&pool).await;
        let second = send(&pool).await;
        drop(first);
        assert_eq!(pool.open_streams(), [1]);
        let third = send(&pool).await;
        assert_eq!(connection_of(&third), 0, "the freed stream is reused");
        drop((second, third));
        assert_eq!(pool.open_streams(), [0]);
    }

    #[tokio::test]
    async fn requests_fill_the_first_connection_with_room() {
        let pool = pool(1);
        let responses = [send(&pool).await, send(&pool).await, send(&pool).await];
        assert_eq!(responses.each_ref().map(connection_of), [0, 1, 2]);
        let [first, _, third] = responses;
        drop((first, third));
        let next = send(&pool).await;
        assert_eq!(connection_of(&next), 0, "the lowest connection with room");
        assert_eq!(pool.open_streams(), [1, 1, 0]);
    }
}
