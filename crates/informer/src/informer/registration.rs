//! Registering event handlers on an informer: each gets its own buffer and task, a resync
//! period of its own if asked, and a registration that says when it has synced.

use std::{
    sync::{Arc, Mutex, Weak},
    time::Duration,
};

use futures::FutureExt;
use kube_core::Resource;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{
    EventHandler, HandlerRegistration, HandlerStats, InformerHandle, Lifecycle, MIN_RESYNC_PERIOD,
    ProcessingStats,
    handler::{Keys, Registered},
    listener::run_listener,
    processor::{Processor, lock},
    until_cancelled,
};
use crate::{error::Error, key::ObjectKey};

impl<K: Resource + Send + Sync + 'static> InformerHandle<K> {
    /// Registers a handler. It gets its own buffer and task, and runs once the informer
    /// runs. If the informer has already synced, it first receives every cached object as
    /// an initial add; its registration's
    /// [`has_synced`](HandlerRegistration::has_synced) turns true once those are processed.
    /// The same call on a [`SharedInformer`](super::SharedInformer) that has not run yet, through its handle.
    ///
    /// # Errors
    ///
    /// [`Error::InformerStopped`] once the informer has stopped: the handler would never run.
    pub fn add_handler(&self, handler: impl EventHandler<K>) -> Result<HandlerRegistration, Error> {
        self.register(None, Registered::objects(handler), self.inner.resync)
    }

    /// [`add_handler`](Self::add_handler), under a name its
    /// [lag](Self::handler_stats) is reported by (on a manager's `/metrics` too).
    ///
    /// # Errors
    ///
    /// [`Error::InformerStopped`] once the informer has stopped.
    pub fn add_named_handler(
        &self,
        name: impl Into<String>,
        handler: impl EventHandler<K>,
    ) -> Result<HandlerRegistration, Error> {
        self.register(
            Some(name.into()),
            Registered::objects(handler),
            self.inner.resync,
        )
    }

    /// Registers `f`, called with the object's key on every add, update (resyncs included)
    /// and delete: the usual way to feed a workqueue, whose workers then read the object
    /// back with [`Store::get_by_key`](crate::Store::get_by_key) (absent = deleted). Objects
    /// a [warm restart](crate::reflector::WarmRestart) restores are not decoded for it, only
    /// their keys handed over.
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube_informer::{ObjectKey, SharedInformer, testing::FakeListWatch};
    ///
    /// let informer = SharedInformer::builder(FakeListWatch::<ConfigMap>::new("configmaps")).build();
    /// let queue: Arc<Mutex<Vec<ObjectKey>>> = Arc::default();
    /// let q = queue.clone();
    /// informer.add_key_handler(move |key| q.lock().unwrap().push(key)).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InformerStopped`] once the informer has stopped.
    pub fn add_key_handler(
        &self,
        f: impl Fn(ObjectKey) + Send + Sync + 'static,
    ) -> Result<HandlerRegistration, Error>
    where
        K: Resource,
    {
        let f = Arc::new(f);
        let initial = f.clone();
        let handler = Registered::keys(Keys(f), move |key: &ObjectKey| initial(key.clone()));
        self.register(None, handler, self.inner.resync)
    }

    /// [`add_named_handler`](Self::add_named_handler) for the library's own handlers that
    /// queue keys: the initial list's undecoded objects reach `initial_key` by key.
    pub(crate) fn add_named_keyed_handler(
        &self,
        name: impl Into<String>,
        handler: impl EventHandler<K>,
        initial_key: impl Fn(&ObjectKey) + Send + Sync + 'static,
    ) -> Result<HandlerRegistration, Error> {
        self.register(
            Some(name.into()),
            Registered::keys(handler, initial_key),
            self.inner.resync,
        )
    }

    /// How far behind each registered handler is: events waiting in its buffer, the age of
    /// the oldest, events delivered or coalesced, and the time spent in it. Each handler has
    /// a buffer of its own (a slow handler delays no other), which coalesces per object past
    /// [`HANDLER_COALESCE_AFTER`] events, so a stuck handler holds at most a few events per
    /// object; a backlog past [`HANDLER_BACKLOG_WARNING`] events is logged, again each time
    /// it doubles, and once it drains.
    ///
    /// [`HANDLER_BACKLOG_WARNING`]: crate::informer::HANDLER_BACKLOG_WARNING
    /// [`HANDLER_COALESCE_AFTER`]: crate::informer::HANDLER_COALESCE_AFTER
    pub fn handler_stats(&self) -> Vec<HandlerStats> {
        self.inner.processor.handler_stats()
    }

    /// How long the informer took over each watch event before any handler saw it:
    /// applying it to the store and putting it in each handler's buffer (client-go's
    /// `informer_processing_latency_seconds`). A handler's own time is in
    /// [`handler_stats`](Self::handler_stats).
    pub fn processing_stats(&self) -> ProcessingStats {
        self.inner.processor.processing.processing_stats()
    }

    /// Registers a handler with a resync period of its own (client-go's
    /// `AddEventHandlerWithResyncPeriod`): every cached object is re-delivered to it as
    /// `on_update(obj, obj, Delivery::Resync)` that often, whatever the informer's
    /// [`resync_period`](super::InformerBuilder::resync_period). Zero turns resyncs off for it;
    /// periods under [`MIN_RESYNC_PERIOD`] are raised to it.
    ///
    /// # Errors
    ///
    /// [`Error::InformerStopped`] once the informer has stopped.
    pub fn add_handler_with_resync(
        &self,
        handler: impl EventHandler<K>,
        period: Duration,
    ) -> Result<HandlerRegistration, Error> {
        self.register(None, Registered::objects(handler), resync_period(period))
    }

    fn register(
        &self,
        name: Option<String>,
        handler: Registered<K>,
        resync: Option<Duration>,
    ) -> Result<HandlerRegistration, Error> {
        let mut lifecycle = lock(&self.inner.lifecycle);
        if matches!(*lifecycle, Lifecycle::Stopped) {
            return Err(Error::InformerStopped);
        }
        let processor = &self.inner.processor;
        let (synced_tx, synced_rx) = watch::channel(false);
        let own_token = CancellationToken::new();
        let (id, rx, lag) = processor.add_listener(name, resync, handler.initial_adds());
        let listener = run_listener(handler, rx, synced_tx, own_token.clone());
        // A registered handler uses the informer until it is removed (also while its task
        // has not been spawned yet) or its task ends.
        let usage = Arc::new(Mutex::new(self.usage.clone()));
        let task_usage = usage.clone();
        let task = async move {
            let _usage = task_usage;
            listener.await;
        }
        .boxed();
        match &mut *lifecycle {
            Lifecycle::NotStarted { pending } => pending.push(task),
            Lifecycle::Running {
                handle,
                tracker,
                token,
            } => {
                tracker.spawn_on(until_cancelled(task, token.clone()), handle);
            }
            Lifecycle::Stopped => unreachable!("checked above, under the same lock"),
        }
        drop(lifecycle);
        let weak: Weak<Processor<K>> = Arc::downgrade(processor);
        Ok(HandlerRegistration::new(
            synced_rx,
            Box::new(move || {
                own_token.cancel();
                if let Some(p) = weak.upgrade() {
                    p.remove_listener(id);
                }
                lock(&usage).take();
            }),
            lag,
        ))
    }
}

/// A handler's resync period as given: zero is none, and none is shorter than the minimum.
fn resync_period(period: Duration) -> Option<Duration> {
    Some(period)
        .filter(|p| !p.is_zero())
        .map(|p| p.max(MIN_RESYNC_PERIOD))
}
