//! Reading a running part's counters.
//!
//! Every `*Stats` type of the crate is a snapshot: a plain struct of public fields, taken
//! at one moment. A handle that lives beside the running part (an
//! [`InformerHandle`](crate::InformerHandle), a [`Store`](crate::Store), a
//! [`Recorder`](crate::events::Recorder), a [`ShardRing`](crate::sharding::ShardRing)) takes
//! one with a method; a part its `run` consumes (a [`Controller`](crate::Controller), a
//! standalone [`Reflector`](crate::reflector::Reflector)) hands out a [`LiveStats`] first,
//! which takes one whenever it is asked.

use std::{fmt, sync::Arc};

/// Takes snapshots of a running part's counters; cheap to clone, every clone reads the
/// same counters, and it stays readable after the part has stopped.
///
/// # Example
///
/// ```no_run
/// # async fn example(controller: kube_informer::Controller<k8s_openapi::api::core::v1::ConfigMap>) {
/// let stats = controller.stats();
/// // … run the controller, then:
/// let now = stats.read();
/// println!("{} reconciled, {} failed", now.synced, now.failed);
/// # }
/// ```
pub struct LiveStats<S> {
    read: Arc<dyn Fn() -> S + Send + Sync>,
}

impl<S> LiveStats<S> {
    pub(crate) fn new(read: impl Fn() -> S + Send + Sync + 'static) -> Self {
        Self {
            read: Arc::new(read),
        }
    }

    /// The counters as they are now.
    #[must_use]
    pub fn read(&self) -> S {
        (self.read)()
    }
}

impl<S> Clone for LiveStats<S> {
    fn clone(&self) -> Self {
        Self {
            read: Arc::clone(&self.read),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for LiveStats<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LiveStats").field(&self.read()).finish()
    }
}
