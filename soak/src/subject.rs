//! kube-informer's subject, in the driver's process: a factory's Pod informer shared by
//! two controllers, and a widget informer, each with a fast handler, a slow one (10 ms an
//! event) and one added late; every event and every reconcile recorded.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use k8s_openapi::api::core::v1::Pod;
use kube_client::{Api, Client, Resource as KubeResource, api::DynamicObject};
use kube_informer::{
    Action, Controller, DeletedObject, Delivery, InformerFactory, InformerHandle, ReconcileRequest,
    RunningInformer, Scope, SharedInformer, handler_fn, informer::HandlerRegistration,
    retry_with_backoff,
};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::{
    record::{EventRecord, EventType, Events, MARKER, ReconcileRecord, Resource, unix_nanos},
    writer::widget_resource,
};

/// The subject's name in records and reports.
pub const NAME: &str = "kube-informer";

/// The two controllers sharing the factory's Pod informer.
pub const CONTROLLERS: [&str; 2] = ["pods-a", "pods-b"];

/// Settings the run chooses for both subjects.
#[derive(Clone, Copy, Debug)]
pub struct Tuning {
    /// The server-side watch timeout's lower bound; `None` for the default.
    pub watch_timeout: Option<Duration>,
    /// What the slow handlers spend on each event.
    pub slow_handler_delay: Duration,
}

/// Reconciles as they finish.
#[derive(Clone, Default)]
pub struct Reconciles {
    records: Arc<Mutex<Vec<ReconcileRecord>>>,
}

impl Reconciles {
    pub fn snapshot(&self) -> Vec<ReconcileRecord> {
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The running subject.
pub struct Subject {
    factory: InformerFactory,
    pods: InformerHandle<Pod>,
    widgets: Option<RunningInformer<DynamicObject>>,
    registrations: Vec<HandlerRegistration>,
    controllers: JoinSet<Result<(), kube_informer::Error>>,
    cancel: CancellationToken,
    pub events: Events,
    pub reconciles: Reconciles,
}

impl Subject {
    /// Starts the informers, handlers and controllers on `client` (the fault proxy's).
    ///
    /// # Errors
    ///
    /// When a handler cannot be added.
    pub fn start(client: Client, tuning: Tuning) -> anyhow::Result<Self> {
        let cancel = CancellationToken::new();
        let events = Events::default();
        let factory = InformerFactory::new(client.clone());
        let pods =
            factory.informer_with::<Pod>(Scope::all(), move |builder| match tuning.watch_timeout {
                Some(timeout) => builder.min_watch_timeout(timeout),
                None => builder,
            });
        let mut widgets =
            SharedInformer::builder(Api::<DynamicObject>::all_with(client, &widget_resource()));
        if let Some(timeout) = tuning.watch_timeout {
            widgets = widgets.min_watch_timeout(timeout);
        }
        let widgets = widgets.build().spawn(cancel.child_token());
        let mut registrations = Vec::new();
        for (handler, delay) in [("fast", None), ("slow", Some(tuning.slow_handler_delay))] {
            registrations.push(pods.add_handler(recorder::<Pod>(
                &events,
                handler,
                Resource::Pods,
                delay,
            ))?);
            registrations.push(widgets.add_handler(recorder::<DynamicObject>(
                &events,
                handler,
                Resource::Widgets,
                delay,
            ))?);
        }
        let reconciles = Reconciles::default();
        let mut controllers = JoinSet::new();
        for name in CONTROLLERS {
            let controller = Controller::new(name, pods.clone()).workers(2);
            let reconciles = reconciles.clone();
            let cancel = cancel.child_token();
            controllers.spawn(async move {
                controller
                    .run(
                        (
                            move |request, reconciles: Arc<Reconciles>| async move {
                                record_reconcile(&reconciles, name, request).await;
                                Ok::<_, std::io::Error>(Action::done())
                            },
                            retry_with_backoff(),
                            Arc::new(reconciles),
                        ),
                        cancel,
                    )
                    .await
            });
        }
        factory.start(&cancel);
        Ok(Self {
            factory,
            pods,
            widgets: Some(widgets),
            registrations,
            controllers,
            cancel,
            events,
            reconciles,
        })
    }

    pub fn has_synced(&self) -> bool {
        self.pods.has_synced() && self.widgets.as_ref().is_some_and(|w| w.has_synced())
    }

    /// Adds the late handlers: each is first handed the cache as it stands.
    ///
    /// # Errors
    ///
    /// When the informers have stopped.
    pub fn add_late_handlers(&mut self) -> anyhow::Result<()> {
        self.registrations
            .push(self.pods.add_handler(recorder::<Pod>(
                &self.events,
                "late",
                Resource::Pods,
                None,
            ))?);
        if let Some(widgets) = &self.widgets {
            self.registrations
                .push(widgets.add_handler(recorder::<DynamicObject>(
                    &self.events,
                    "late",
                    Resource::Widgets,
                    None,
                ))?);
        }
        Ok(())
    }

    /// Records when each relist starts, polling the informers' counters, until `stop`.
    pub fn record_relists(&self, stop: CancellationToken) -> tokio::task::JoinHandle<Vec<i64>> {
        let pods = self.pods.clone();
        let widgets = self.widgets.as_ref().map(|w| w.handle());
        tokio::spawn(async move {
            let lists = || {
                pods.reflector_stats().lists
                    + widgets.as_ref().map_or(0, |w| w.reflector_stats().lists)
            };
            let mut seen = lists();
            let mut started = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            while !stop.is_cancelled() {
                tick.tick().await;
                let now = lists();
                if now > seen {
                    started.push(unix_nanos());
                    seen = now;
                }
            }
            started
        })
    }

    /// Lists and watches started so far (a relist shows as one more list).
    pub fn lists(&self) -> u64 {
        self.pods.reflector_stats().lists
            + self
                .widgets
                .as_ref()
                .map_or(0, |w| w.reflector_stats().lists)
    }

    /// Stops the controllers, then the informers, and waits for every task they started.
    ///
    /// # Errors
    ///
    /// When a controller ended with an error.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.cancel.cancel();
        let mut failed = None;
        while let Some(joined) = self.controllers.join_next().await {
            if let Err(error) = joined? {
                failed = Some(error);
            }
        }
        for registration in self.registrations.drain(..) {
            registration.remove();
        }
        if let Some(widgets) = self.widgets.take() {
            widgets.stop().await;
        }
        self.factory.shutdown().await;
        match failed {
            Some(error) => Err(error.into()),
            None => Ok(()),
        }
    }
}

async fn record_reconcile<K: KubeResource>(
    reconciles: &Reconciles,
    controller: &str,
    request: ReconcileRequest<K>,
) {
    let started_ns = unix_nanos();
    let key = request.key().to_string();
    let marker = match &request {
        ReconcileRequest::Present(object) => marker_of(object.meta()),
        ReconcileRequest::Deleted { .. } => None,
    };
    // A reconcile takes a moment, as a real one would: long enough for two workers to
    // overlap on one key if the queue let them (the checks compare the spans).
    tokio::time::sleep(Duration::from_millis(1)).await;
    reconciles
        .records
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(ReconcileRecord {
            controller: controller.to_owned(),
            replica: None,
            uid: None,
            key,
            marker,
            started_ns,
            finished_ns: unix_nanos(),
        });
}

pub fn marker_of(meta: &kube_client::core::ObjectMeta) -> Option<u64> {
    meta.annotations.as_ref()?.get(MARKER)?.parse().ok()
}

fn record<K: KubeResource>(
    events: &Events,
    handler: &str,
    resource: Resource,
    kind: EventType,
    object: &K,
    delivery: Option<Delivery>,
    tombstone: bool,
) {
    let meta = object.meta();
    events.push(EventRecord {
        subject: NAME.to_owned(),
        handler: handler.to_owned(),
        resource,
        kind,
        key: format!(
            "{}/{}",
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default()
        ),
        rv: meta.resource_version.clone().unwrap_or_default(),
        marker: marker_of(meta).map(|m| m.to_string()).unwrap_or_default(),
        initial: delivery == Some(Delivery::InitialList),
        resync: delivery == Some(Delivery::Resync),
        tombstone,
        deleting: meta.deletion_timestamp.is_some(),
        at_ns: unix_nanos(),
    });
}

/// A handler that records every event, after `delay` if one is given. A handler's
/// methods run on its own task; the delay blocks that task's thread as a handler doing
/// real work would, without starving the runtime's other tasks.
fn recorder<K: KubeResource + Send + Sync + 'static>(
    events: &Events,
    handler: &'static str,
    resource: Resource,
    delay: Option<Duration>,
) -> kube_informer::informer::HandlerFn<K> {
    let work = move || {
        if let Some(delay) = delay {
            tokio::task::block_in_place(|| std::thread::sleep(delay));
        }
    };
    let (on_add, on_update, on_delete) = (events.clone(), events.clone(), events.clone());
    handler_fn::<K>()
        .on_add(move |object, delivery| {
            work();
            record(
                &on_add,
                handler,
                resource,
                EventType::Add,
                object.as_ref(),
                Some(delivery),
                false,
            );
        })
        .on_update(move |_old, new, delivery| {
            work();
            record(
                &on_update,
                handler,
                resource,
                EventType::Update,
                new.as_ref(),
                Some(delivery),
                false,
            );
        })
        .on_delete(move |deleted: &DeletedObject<K>| {
            work();
            record(
                &on_delete,
                handler,
                resource,
                EventType::Delete,
                deleted.object().as_ref(),
                None,
                deleted.is_final_state_unknown(),
            );
        })
}
