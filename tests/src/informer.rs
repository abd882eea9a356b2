//! Running informers, and recording what they tell handlers and hooks.

use std::{collections::BTreeMap, sync::Arc};

use kube_client::core::Resource;
use kube_informer::{
    DeletedObject, Delivery, Error, InformerHandle, RunningInformer, SharedInformer, error::Verb,
    handler_fn, informer::HandlerRegistration,
};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::{
    fixtures::{name, rv},
    wait::within,
};

/// A running informer that stops (and is checked not to have panicked) at the end.
///
/// The one place the tests start and stop informers, so that a change to the informer's
/// lifecycle API is made here alone.
/// Dereferences to the informer's handle.
pub struct Running<K> {
    informer: RunningInformer<K>,
}

/// Runs `informer` until [`Running::stop`].
pub fn run<K: Resource + Send + Sync + 'static>(informer: SharedInformer<K>) -> Running<K> {
    Running {
        informer: informer.spawn(CancellationToken::new()),
    }
}

impl<K> Running<K> {
    /// Stops the informer and waits for its tasks to end; panics if it panicked or does not
    /// end within [`PATIENCE`](crate::PATIENCE).
    pub async fn stop(self) {
        within("the informer to stop", self.informer.stop()).await;
    }
}

impl<K> std::ops::Deref for Running<K> {
    type Target = InformerHandle<K>;

    fn deref(&self) -> &InformerHandle<K> {
        &self.informer
    }
}

/// `name -> resourceVersion` of what the informer's cache holds now.
pub fn cache_state<K: Resource + Send + Sync + 'static>(
    informer: &InformerHandle<K>,
) -> BTreeMap<String, String> {
    informer
        .store()
        .list()
        .iter()
        .map(|o| (name(&**o), rv(&**o)))
        .collect()
}

/// What a handler was told.
#[derive(Debug)]
pub enum Ev<K> {
    /// `on_add`: the object, and whether it came with the initial list.
    Add(Arc<K>, bool),
    /// `on_update`: the old and the new object.
    Update(Arc<K>, Arc<K>),
    /// `on_delete`.
    Delete(DeletedObject<K>),
}

impl<K: Resource> Ev<K> {
    /// The name of the object the event is about (the new one for an update).
    pub fn name(&self) -> String {
        match self {
            Ev::Add(o, _) | Ev::Update(_, o) => name(&**o),
            Ev::Delete(d) => name(&**d.object()),
        }
    }
}

/// Adds a handler to `informer` that sends every event it is told to the returned channel.
pub fn recorder<K: Resource + Send + Sync + 'static>(
    informer: &InformerHandle<K>,
) -> (HandlerRegistration, mpsc::UnboundedReceiver<Ev<K>>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let (t1, t2, t3) = (tx.clone(), tx.clone(), tx);
    let registration = informer.add_handler(
        handler_fn::<K>()
            .on_add(move |o, delivery| {
                let _ = t1.send(Ev::Add(o.clone(), delivery == Delivery::InitialList));
            })
            .on_update(move |old, new, _| {
                let _ = t2.send(Ev::Update(old.clone(), new.clone()));
            })
            .on_delete(move |d| {
                let _ = t3.send(Ev::Delete(d.clone()));
            }),
    );
    (registration.expect("the informer has not stopped"), rx)
}

/// The next event of a [`recorder`], waited for as `what`.
pub async fn next_event<K>(rx: &mut mpsc::UnboundedReceiver<Ev<K>>, what: &str) -> Ev<K> {
    within(what, rx.recv())
        .await
        .expect("the handler's channel stays open")
}

/// An error the watch-error hook received.
#[derive(Clone, Debug)]
pub struct SeenError {
    /// Its message.
    pub text: String,
    /// [`Error::is_gone`].
    pub gone: bool,
    /// [`Error::is_forbidden`].
    pub forbidden: bool,
    /// `(resource, verb)` of an [`Error::Decode`].
    pub decode: Option<(String, Verb)>,
    /// The key of an [`Error::UndecodableObject`].
    pub undecodable: Option<String>,
    /// An [`Error::IdleTimeout`]: a watch silent for too long.
    pub idle: bool,
}

/// Every error an [`error_log`]'s hook received, in order.
pub type ErrorLog = Arc<watch::Sender<Vec<SeenError>>>;

/// A watch-error hook (for `on_watch_error`) and the log it writes to.
pub fn error_log() -> (ErrorLog, impl Fn(&Error) + Send + Sync + 'static) {
    let log: ErrorLog = Arc::new(watch::channel(Vec::new()).0);
    let hook_log = log.clone();
    let hook = move |e: &Error| {
        let seen = SeenError {
            text: e.to_string(),
            gone: e.is_gone(),
            forbidden: e.is_forbidden(),
            decode: match e {
                Error::Decode { resource, verb, .. } => Some((resource.clone(), *verb)),
                _ => None,
            },
            undecodable: match e {
                Error::UndecodableObject { key, .. } => Some(key.clone()),
                _ => None,
            },
            idle: matches!(e, Error::IdleTimeout { .. }),
        };
        hook_log.send_modify(|v| v.push(seen));
    };
    (log, hook)
}

/// Waits, as `what`, until the errors logged so far satisfy `f`.
pub async fn wait_errors(log: &ErrorLog, what: &str, f: impl FnMut(&Vec<SeenError>) -> bool) {
    let mut rx = log.subscribe();
    within(what, rx.wait_for(f))
        .await
        .expect("the log's sender is alive");
}
