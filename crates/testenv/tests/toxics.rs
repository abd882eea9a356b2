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

/// Toxiproxy files each connection under its client's address and forgets one whose
/// client took the address of a connection that had just closed, when that one's late
/// cleanup removes the entry: its own cut would leave the newcomer open. Each round closes
/// a connection at once (a reset, so its port is free again) and connects again from the
/// same port, the way a busy client's ports come round; a cut must close that connection
/// all the same.
#[tokio::test]
async fn a_cut_closes_a_connection_whose_client_port_was_just_used() {
    let proxy = proxied_echo().await;
    for round in 0..40 {
        let first = tokio::net::TcpSocket::new_v4().unwrap();
        first.set_reuseaddr(true).unwrap();
        first.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let client = first.local_addr().unwrap();
        let mut first = within("connecting", first.connect(proxy.listen_addr()))
            .await
            .expect("connecting through the proxy");
        ping(&mut first).await;
        first.set_zero_linger().unwrap();
        drop(first);

        let mut second = within("connecting again", connect_from(client, &proxy)).await;
        ping(&mut second).await;

        within("the cut", proxy.cut()).await.expect("cutting");
        let _ = second.write_all(b"?").await;
        let mut byte = [0; 1];
        let after_cut = within("the connection to close", second.read(&mut byte)).await;
        assert!(
            !matches!(after_cut, Ok(1)),
            "round {round}: a connection from {client} still reached the server after the cut"
        );
        within("the restore", proxy.restore())
            .await
            .expect("restoring");
    }
}

/// A connection through `proxy` from the port of `client`, which a connection that was
/// reset has just given up: the kernel may refuse it for a moment.
async fn connect_from(client: SocketAddr, proxy: &FaultProxy) -> TcpStream {
    loop {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_reuseaddr(true).unwrap();
        socket.bind(client).unwrap();
        match socket.connect(proxy.listen_addr()).await {
            Ok(stream) => return stream,
            Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable => {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Err(e) => panic!("connecting again from {client}: {e}"),
        }
    }
}

/// One byte there and back.
async fn ping(socket: &mut TcpStream) {
    socket.write_all(b"!").await.unwrap();
    let mut byte = [0; 1];
    within("the echo", socket.read_exact(&mut byte))
        .await
        .expect("the echo");
}

/// A cut stops toxiproxy-server; the toxics in force then, and those changed while it is
/// cut, are in force again once it is restored.
#[tokio::test]
async fn toxics_outlast_a_cut() {
    let proxy = proxied_echo().await;
    let before = proxy.pid().expect("running");
    within(
        "latency",
        proxy.latency(Duration::from_millis(300), Duration::ZERO),
    )
    .await
    .unwrap();
    within("bandwidth", proxy.bandwidth(1000)).await.unwrap();
    within("the cut", proxy.cut()).await.unwrap();
    assert_eq!(proxy.pid(), None, "toxiproxy-server stopped");
    let refused = TcpStream::connect(proxy.listen_addr()).await;
    assert!(refused.is_err(), "a connection while cut: {refused:?}");
    within(
        "removing bandwidth",
        proxy.remove_toxic("bandwidth_downstream"),
    )
    .await
    .unwrap();
    assert_eq!(
        within("listing", proxy.toxics()).await.unwrap(),
        ["latency_downstream"]
    );
    within("the restore", proxy.restore()).await.unwrap();
    assert_ne!(proxy.pid(), Some(before), "a new toxiproxy-server");
    assert_eq!(
        within("listing", proxy.toxics()).await.unwrap(),
        ["latency_downstream"]
    );
    let ping = fastest_ping(&proxy).await;
    assert!(
        ping >= Duration::from_millis(300),
        "the latency is in force again: {ping:?}"
    );
}
