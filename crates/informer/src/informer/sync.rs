//! Sync signals: what can tell whether it has synced, and waiting for several at once
//! (client-go's `WaitForCacheSync`).

use std::time::Duration;

use tokio::sync::watch;

use crate::error::Error;

/// Something that can tell whether it has synced: an informer, a handler registration.
pub trait HasSynced: Send + Sync {
    /// True once synced; never goes back to false.
    fn has_synced(&self) -> bool;

    /// A receiver whose value turns `true` once synced (for awaiting without polling).
    fn synced_receiver(&self) -> watch::Receiver<bool>;
}

/// Waits until every item has synced (client-go's `WaitForCacheSync`), awaiting their
/// sync signals (no polling).
///
/// # Errors
///
/// [`Error::SyncTimeout`] when `timeout` passes first.
pub async fn wait_for_cache_sync(items: &[&dyn HasSynced], timeout: Duration) -> Result<(), Error> {
    let receivers: Vec<_> = items.iter().map(|i| i.synced_receiver()).collect();
    let all = async move {
        for mut rx in receivers {
            if rx.wait_for(|s| *s).await.is_err() {
                // The sender is gone (handler removed before syncing): it will never sync.
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::time::timeout(timeout, all)
        .await
        .map_err(|_| Error::SyncTimeout(timeout))
}
