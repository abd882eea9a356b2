//! Bounded waits: every wait in these tests ends, so a hang fails with what it waited for.

use std::{
    future::Future,
    time::{Duration, Instant},
};

/// Generous bound for conditions that take seconds; hitting it means a hang.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Awaits `fut`; panics, naming `what`, if it takes longer than [`PATIENCE`].
pub async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out after {PATIENCE:?} waiting for {what}"))
}

/// Polls `condition` every 50 ms until it holds; panics after [`PATIENCE`].
///
/// For conditions on local state (a cache, a counter): checking them is cheap, so they are
/// checked often.
pub async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(
            started.elapsed() < PATIENCE,
            "timed out after {PATIENCE:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls the asynchronous `check` every 100 ms until it returns `Some`, and returns that
/// value; panics after [`PATIENCE`].
///
/// For conditions that take a request to check (the API server, an HTTP endpoint), which
/// are polled less often than [`eventually`]'s.
pub async fn eventually_some<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    eventually_some_within(PATIENCE, what, check).await
}

/// [`eventually_some`] with a bound other than [`PATIENCE`], for setups slower than the
/// control plane alone (a proxy and a second etcd started per test).
pub async fn eventually_some_within<T, F, Fut>(patience: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            started.elapsed() < patience,
            "timed out after {patience:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
