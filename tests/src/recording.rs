//! A list-watch that records the calls the reflector makes.

use std::sync::Arc;

use kube_informer::{
    Error,
    list_watch::{ListOptions, ListPage, ListWatch, WatchOptions, WatchStream},
};
use tokio::sync::watch;

use crate::wait::within;

/// One list call seen by [`Recording`].
#[derive(Clone, Debug)]
pub struct ListCall {
    /// What the list asked for.
    pub options: ListOptions,
    /// Items, resourceVersion and whether a continue token came with the page, or the error.
    pub result: Result<(usize, String, bool), String>,
}

/// Every call a [`Recording`] has seen, in order.
#[derive(Clone, Debug, Default)]
pub struct Calls {
    /// The list calls.
    pub lists: Vec<ListCall>,
    /// The options of each watch call, recorded before it passes the gate.
    pub watches: Vec<WatchOptions>,
    /// Reads of the version the server's cache is at (`cached_version`).
    pub version_reads: usize,
}

/// A real [`ListWatch`] (normally an [`ApiListWatch`](kube_informer::list_watch::ApiListWatch) on the
/// real API server) that records every call, and can hold new watch calls back at a gate,
/// as a network partition would.
#[derive(Clone)]
pub struct Recording<L> {
    inner: L,
    calls: Arc<watch::Sender<Calls>>,
    gate: Arc<watch::Sender<bool>>,
}

impl<L> Recording<L> {
    /// Records the calls made to `inner`, with the gate open.
    pub fn new(inner: L) -> Self {
        Self {
            inner,
            calls: Arc::new(watch::channel(Calls::default()).0),
            gate: Arc::new(watch::channel(true).0),
        }
    }

    /// The calls so far.
    pub fn calls(&self) -> Calls {
        self.calls.borrow().clone()
    }

    /// Waits, as `what`, until the calls so far satisfy `f`.
    pub async fn wait_calls(&self, what: &str, f: impl FnMut(&Calls) -> bool) {
        let mut rx = self.calls.subscribe();
        within(what, rx.wait_for(f))
            .await
            .expect("the sender is alive");
    }

    /// New watch calls wait until [`release_watches`](Self::release_watches).
    pub fn hold_watches(&self) {
        self.gate.send_replace(false);
    }

    /// Lets held and new watch calls through.
    pub fn release_watches(&self) {
        self.gate.send_replace(true);
    }
}

impl<K, L> ListWatch<K> for Recording<L>
where
    K: Send + 'static,
    L: ListWatch<K>,
{
    fn resource(&self) -> String {
        self.inner.resource()
    }

    fn namespace(&self) -> Option<String> {
        self.inner.namespace()
    }

    fn selectors(&self) -> String {
        self.inner.selectors()
    }

    async fn cached_version(&self) -> Result<String, Error> {
        let version = self.inner.cached_version().await;
        self.calls.send_modify(|c| c.version_reads += 1);
        version
    }

    async fn list(&self, options: &ListOptions) -> Result<ListPage<K>, Error> {
        let result = self.inner.list(options).await;
        let call = ListCall {
            options: options.clone(),
            result: match &result {
                Ok(page) => Ok((
                    page.items.len(),
                    page.resource_version.clone(),
                    page.continue_token.is_some(),
                )),
                Err(e) => Err(e.to_string()),
            },
        };
        self.calls.send_modify(|c| c.lists.push(call));
        result
    }

    async fn watch(&self, options: &WatchOptions) -> Result<WatchStream<K>, Error> {
        self.calls.send_modify(|c| c.watches.push(options.clone()));
        let mut gate = self.gate.subscribe();
        let _ = gate.wait_for(|open| *open).await;
        self.inner.watch(options).await
    }
}
