//! Who uses a cache. An [`InformerFactory`](crate::InformerFactory) stops the informer that
//! feeds a cache once nothing holds a [`Usage`] of it any more.

use std::{
    any::Any,
    sync::{Arc, Weak},
};

/// A share in an informer's use, held by each handle, handler and store a factory hands
/// out. What it wraps does the bookkeeping when the last share is dropped.
#[derive(Clone)]
pub(crate) struct Usage(Arc<dyn Any + Send + Sync>);

impl Usage {
    /// The first share; `count` is dropped with the last one.
    pub(crate) fn new(count: impl Any + Send + Sync) -> Self {
        Self(Arc::new(count))
    }

    /// A reference that does not count as a use.
    pub(crate) fn downgrade(&self) -> WeakUsage {
        WeakUsage(Arc::downgrade(&self.0))
    }
}

/// A [`Usage`] that does not keep the informer in use.
#[derive(Clone)]
pub(crate) struct WeakUsage(Weak<dyn Any + Send + Sync>);

impl WeakUsage {
    /// A share, while anything still holds one.
    pub(crate) fn upgrade(&self) -> Option<Usage> {
        self.0.upgrade().map(Usage)
    }

    /// The shares held.
    pub(crate) fn count(&self) -> usize {
        self.0.strong_count()
    }
}
