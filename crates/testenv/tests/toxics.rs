//! [`FaultProxy`]'s toxics, added by name through the generic call or by the convenience
//! methods, acting on raw TCP connections through a real Toxiproxy to an echo server, so
//! that what arrives, when, and when the connection closes, is measured byte for byte.
//!
//! Each test starts its own proxy and echo server; none needs a control plane.

use std::{
    future::Future,
    net::SocketAddr,
    time::{Duration, Instant},
};

use kube_testenv::{Error, FaultProxy, ToxicStream};
use serde_json::json;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

/// How long any one step of a test may take.
const PATIENCE: Duration = Duration::from_secs(30);

/// Awaits `future`, failing the test if it takes longer than [`PATIENCE`].
async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, future)
        .await
        .unwrap_or_else(|_| panic!("{what} took longer than {PATIENCE:?}"))
}

/// A TCP server on a free loopback port that sends back every byte it receives, for as
/// long as the test's runtime lives.
async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut read, mut write) = socket.split();
                let _ = tokio::io::copy(&mut read, &mut write).await;
            });
        }
    });
    addr
}

/// A proxy in front of a fresh echo server.
async fn proxied_echo() -> FaultProxy {
    let upstream = echo_server().await;
    within("the fault proxy to start", FaultProxy::start(upstream))
        .await
        .expect("the fault proxy starts")
}

async fn connect(proxy: &FaultProxy) -> TcpStream {
    within(
        "connecting through the proxy",
        TcpStream::connect(proxy.listen_addr()),
    )
    .await
    .expect("connecting through the proxy")
}

/// Sends `message` on a new connection through `proxy` and reads until `expected` bytes
/// came back or the connection ended. Returns what came back, in how many reads, and how
/// long the round trip took.
async fn echo(proxy: &FaultProxy, message: &[u8], expected: usize) -> (Vec<u8>, usize, Duration) {
    let mut socket = connect(proxy).await;
    let started = Instant::now();
    socket.write_all(message).await.unwrap();
    let mut received = Vec::new();
    let mut reads = 0;
    let mut buffer = [0; 4096];
    while received.len() < expected {
        let n = within("the echo", socket.read(&mut buffer))
            .await
            .expect("reading the echo");
        if n == 0 {
            break;
        }
        reads += 1;
        received.extend_from_slice(&buffer[..n]);
    }
    (received, reads, started.elapsed())
}

/// The fastest of three round trips of `ping`, each on a new connection: a loaded machine
/// may slow one, not all.
async fn fastest_ping(proxy: &FaultProxy) -> Duration {
    let mut fastest = Duration::MAX;
    for _ in 0..3 {
        let (received, _, took) = echo(proxy, b"ping", 4).await;
        assert_eq!(received, b"ping");
        fastest = fastest.min(took);
    }
    fastest
}

#[tokio::test]
async fn a_generic_toxic_is_listed_acts_and_is_removed_by_name() {
    let proxy = proxied_echo().await;
    assert!(
        fastest_ping(&proxy).await < Duration::from_millis(200),
        "the echo is fast without toxics"
    );

    proxy
        .add_toxic(
            "slow",
            "latency",
            ToxicStream::Downstream,
            1.0,
            json!({ "latency": 300, "jitter": 0 }),
        )
        .await
        .unwrap();
    assert_eq!(proxy.toxics().await.unwrap(), vec!["slow".to_owned()]);
    let (received, _, took) = echo(&proxy, b"ping", 4).await;
    assert_eq!(received, b"ping");
    assert!(
        took >= Duration::from_millis(300),
        "an echo with 300 ms of latency took {took:?}"
    );

    proxy.remove_toxic("slow").await.unwrap();
    assert!(
        proxy.toxics().await.unwrap().is_empty(),
        "the removed toxic is still listed"
    );
    assert!(
        fastest_ping(&proxy).await < Duration::from_millis(200),
        "the echo is still slow after the latency was removed"
    );

    // Removed already is removed: a removal sent again after Toxiproxy's API timed out
    // finds the toxic gone.
    proxy
        .remove_toxic("slow")
        .await
        .expect("removing a toxic that is not there");
    assert!(proxy.toxics().await.unwrap().is_empty());
    let unknown = proxy
        .add_toxic(
            "odd",
            "no_such_toxic",
            ToxicStream::Upstream,
            1.0,
            json!({}),
        )
        .await;
    assert!(
        matches!(&unknown, Err(Error::Toxiproxy { reason, .. }) if reason.contains("400")),
        "adding a toxic of an unknown type: {unknown:?}"
    );
    assert!(proxy.toxics().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_toxic_added_under_a_taken_name_replaces_it() {
    let proxy = proxied_echo().await;
    proxy
        .add_toxic(
            "fault",
            "latency",
            ToxicStream::Downstream,
            1.0,
            json!({ "latency": 300, "jitter": 0 }),
        )
        .await
        .unwrap();
    // The same type and stream: updated in place.
    proxy
        .add_toxic(
            "fault",
            "latency",
            ToxicStream::Downstream,
            1.0,
            json!({ "latency": 0, "jitter": 0 }),
        )
        .await
        .unwrap();
    assert_eq!(proxy.toxics().await.unwrap(), vec!["fault".to_owned()]);
    assert!(
        fastest_ping(&proxy).await < Duration::from_millis(200),
        "the latency was not updated to 0"
    );

    // Another type: replaced. At most 2 bytes come back, then the connection closes.
    proxy
        .add_toxic(
            "fault",
            "limit_data",
            ToxicStream::Downstream,
            1.0,
            json!({ "bytes": 2 }),
        )
        .await
        .unwrap();
    assert_eq!(proxy.toxics().await.unwrap(), vec!["fault".to_owned()]);
    let (received, _, _) = echo(&proxy, b"ping", 4).await;
    assert_eq!(received, b"pi", "limit_data of 2 bytes let through");
}

#[tokio::test]
async fn timeout_drops_data_and_closes_the_connection_after_the_timeout() {
    let proxy = proxied_echo().await;
    let (received, _, _) = echo(&proxy, b"ping", 4).await;
    assert_eq!(received, b"ping", "the echo works before the toxic");

    let timeout = Duration::from_millis(800);
    proxy.timeout(timeout).await.unwrap();
    let mut toxics = proxy.toxics().await.unwrap();
    toxics.sort();
    assert_eq!(toxics, ["timeout_downstream", "timeout_upstream"]);

    // The clock starts when the proxy accepts, after the connect began.
    let started = Instant::now();
    let mut socket = connect(&proxy).await;
    socket.write_all(b"ping").await.unwrap();
    let mut received = Vec::new();
    let end = within("the connection to close", socket.read_to_end(&mut received)).await;
    let took = started.elapsed();
    // A close (EOF) or, if the proxy closes with data unread, a reset.
    if let Err(e) = end {
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
    }
    assert!(
        received.is_empty(),
        "data passed a timeout toxic: {received:?}"
    );
    assert!(
        took >= timeout,
        "the connection closed after {took:?}, before the {timeout:?} timeout"
    );
    assert!(
        took < timeout + Duration::from_secs(3),
        "the connection closed only after {took:?}, long after the {timeout:?} timeout"
    );

    proxy.clear().await.unwrap();
    let (received, _, _) = echo(&proxy, b"ping", 4).await;
    assert_eq!(
        received, b"ping",
        "the echo works after the toxics are cleared"
    );
}

#[tokio::test]
async fn slicer_delivers_a_response_in_delayed_slices() {
    let proxy = proxied_echo().await;
    let message: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
    let (received, _, took) = echo(&proxy, &message, message.len()).await;
    assert_eq!(received, message);
    assert!(
        took < Duration::from_millis(300),
        "1000 bytes echoed in {took:?} without toxics"
    );

    // About ten slices of 100 bytes, 60 ms apart: nine gaps before the last arrives.
    proxy
        .slicer(100, 10, Duration::from_millis(60))
        .await
        .unwrap();
    assert_eq!(proxy.toxics().await.unwrap(), vec!["slicer_downstream"]);
    let (received, reads, took) = echo(&proxy, &message, message.len()).await;
    assert_eq!(received, message, "the slices add up to the message");
    assert!(
        took >= Duration::from_millis(400),
        "1000 bytes in slices of 100 with 60 ms between arrived in {took:?}"
    );
    assert!(
        reads >= 3,
        "1000 bytes in slices of 100 with 60 ms between arrived in {reads} reads"
    );
}
