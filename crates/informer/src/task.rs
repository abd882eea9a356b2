//! Bounded waits for groups of tasks, shared by the controller's workers and the manager's
//! tasks.

use std::time::Duration;

use tokio::task::{JoinError, JoinSet};

/// Waits up to `timeout` for every task in `tasks` to end, handing each result to `ended`;
/// then aborts those still running. Returns how many were aborted.
pub(crate) async fn join_within<T: 'static>(
    tasks: &mut JoinSet<T>,
    timeout: Duration,
    mut ended: impl FnMut(Result<T, JoinError>),
) -> usize {
    let all = async {
        while let Some(done) = tasks.join_next().await {
            ended(done);
        }
    };
    if tokio::time::timeout(timeout, all).await.is_ok() {
        return 0;
    }
    let aborted = tasks.len();
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    aborted
}
