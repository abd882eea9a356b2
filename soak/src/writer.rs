//! The load: creates, updates, label changes and deletes over a fixed set of Pods and
//! widgets across namespaces, each recorded as the server answered it.
//!
//! Each object is changed by one worker at a time, so the order the writer records is
//! the order the server applied. A write whose answer is lost (the API server killed
//! under it, etcd restarting) is settled by reading the object back before anything else
//! touches it: the history then holds whatever the server really did.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::Context;
use dashmap::DashSet;
use k8s_openapi::api::core::v1::Pod;
use kube_client::{
    Api, Client,
    api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams},
    core::{ApiResource, GroupVersionKind},
};
use rand::{Rng, SeedableRng, rngs::StdRng, seq::IndexedRandom};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::record::{MARKER, ObjectId, Resource, ServerHistory, ServerState, unix_nanos};

/// The custom resource's group.
pub const WIDGET_GROUP: &str = "soak.kube-informer.dev";

/// What the writer changes, and how fast.
#[derive(Clone, Debug)]
pub struct Load {
    pub namespaces: Vec<String>,
    pub pods: usize,
    pub widgets: usize,
    /// Writes per second, all workers together.
    pub rate: f64,
    pub workers: usize,
}

impl Load {
    fn ids(&self) -> Vec<ObjectId> {
        let mut ids = Vec::with_capacity(self.pods + self.widgets);
        for (resource, count, prefix) in [
            (Resource::Pods, self.pods, "p"),
            (Resource::Widgets, self.widgets, "w"),
        ] {
            for i in 0..count {
                let namespace = &self.namespaces[i % self.namespaces.len()];
                ids.push(ObjectId {
                    resource,
                    key: format!("{namespace}/{prefix}-{i:05}"),
                });
            }
        }
        ids
    }
}

/// The widgets' API resource.
pub fn widget_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(WIDGET_GROUP, "v1", "Widget"),
        "widgets",
    )
}

/// The widgets' CustomResourceDefinition.
pub fn widget_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": format!("widgets.{WIDGET_GROUP}") },
        "spec": {
            "group": WIDGET_GROUP,
            "scope": "Namespaced",
            "names": { "plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList" },
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": { "openAPIV3Schema": {
                    "type": "object",
                    "properties": { "spec": { "type": "object", "x-kubernetes-preserve-unknown-fields": true } }
                }}
            }]
        }
    })
}

/// The writer's record of the server, shared with the driver.
#[derive(Clone, Default)]
pub struct Recorded {
    history: Arc<Mutex<ServerHistory>>,
    writes: Arc<AtomicU64>,
    unanswered: Arc<AtomicU64>,
}

impl Recorded {
    pub fn history(&self) -> ServerHistory {
        self.history
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// Writes whose answer was lost and that were settled by reading back.
    pub fn unanswered(&self) -> u64 {
        self.unanswered.load(Ordering::Relaxed)
    }

    fn last(&self, id: &ObjectId) -> Option<ServerState> {
        self.history
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .last(id)
            .cloned()
    }

    /// Records a state the server holds, as it answered a write or a read.
    fn record(
        &self,
        id: &ObjectId,
        (marker, resource_version): (Option<u64>, Option<u64>),
        how: Answer,
    ) {
        self.push(
            id,
            ServerState {
                marker,
                resource_version,
                known_at_ns: unix_nanos(),
                answered: how == Answer::Answered,
            },
        );
    }

    fn push(&self, id: &ObjectId, state: ServerState) {
        let mut history = self.history.lock().unwrap_or_else(PoisonError::into_inner);
        let states = history.states.entry(id.clone()).or_default();
        // A read-back that finds what is already recorded adds nothing.
        if states.last().is_some_and(|last| {
            last.marker == state.marker
                && (state.resource_version.is_none()
                    || last.resource_version == state.resource_version)
        }) {
            return;
        }
        states.push(state);
    }
}

/// How the writer learned of a state.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// The write's own answer.
    Answered,
    /// A read after a write whose answer was lost.
    ReadBack,
}

/// The writer: `workers` tasks changing random objects until `stop` fires.
pub struct Writer {
    pods: BTreeMap<String, Api<Pod>>,
    widgets: BTreeMap<String, Api<DynamicObject>>,
    load: Load,
    recorded: Recorded,
    busy: DashSet<ObjectId>,
    next_marker: AtomicU64,
}

enum Op {
    Create,
    Annotate,
    Relabel,
    Delete,
}

impl Writer {
    pub fn new(client: &Client, load: Load) -> Arc<Self> {
        let resource = widget_resource();
        let pods = load
            .namespaces
            .iter()
            .map(|ns| (ns.clone(), Api::namespaced(client.clone(), ns)))
            .collect();
        let widgets = load
            .namespaces
            .iter()
            .map(|ns| {
                (
                    ns.clone(),
                    Api::namespaced_with(client.clone(), ns, &resource),
                )
            })
            .collect();
        Arc::new(Self {
            pods,
            widgets,
            load,
            recorded: Recorded::default(),
            busy: DashSet::new(),
            next_marker: AtomicU64::new(1),
        })
    }

    pub fn recorded(&self) -> Recorded {
        self.recorded.clone()
    }

    /// Creates every object once, so the subjects start from a full cache.
    pub async fn populate(self: &Arc<Self>, concurrency: usize) -> anyhow::Result<()> {
        use futures::{StreamExt, TryStreamExt};
        futures::stream::iter(self.load.ids())
            .map(|id| {
                let writer = self.clone();
                async move { writer.write(&id, Op::Create).await }
            })
            .buffer_unordered(concurrency)
            .try_collect::<()>()
            .await
    }

    /// Runs the workers until `stop` fires, then waits for every write in flight to
    /// settle.
    pub async fn run(self: Arc<Self>, seed: u64, stop: CancellationToken) {
        let ids = Arc::new(self.load.ids());
        let period = Duration::from_secs_f64(self.load.workers as f64 / self.load.rate);
        let mut workers = tokio::task::JoinSet::new();
        for worker in 0..self.load.workers {
            let writer = self.clone();
            let ids = ids.clone();
            let stop = stop.clone();
            workers.spawn(async move {
                let mut rng = StdRng::seed_from_u64(seed.wrapping_add(worker as u64));
                let mut tick = tokio::time::interval(period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        _ = tick.tick() => {}
                    }
                    let Some(id) = writer.claim(&ids, &mut rng) else {
                        continue;
                    };
                    let exists = writer.recorded.last(&id).is_some_and(|s| s.exists());
                    let op = if !exists {
                        Op::Create
                    } else {
                        match rng.random_range(0..100) {
                            0..45 => Op::Annotate,
                            45..75 => Op::Relabel,
                            _ => Op::Delete,
                        }
                    };
                    if let Err(error) = writer.write(&id, op).await {
                        warn!(%error, key = %id.key, "a write could not be settled");
                    }
                    writer.busy.remove(&id);
                }
            });
        }
        while workers.join_next().await.is_some() {}
    }

    fn claim(&self, ids: &[ObjectId], rng: &mut StdRng) -> Option<ObjectId> {
        for _ in 0..8 {
            let id = ids.choose(rng)?;
            if self.busy.insert(id.clone()) {
                return Some(id.clone());
            }
        }
        None
    }

    async fn write(&self, id: &ObjectId, op: Op) -> anyhow::Result<()> {
        let marker = self.next_marker.fetch_add(1, Ordering::Relaxed);
        let (namespace, name) = id.key.split_once('/').context("a key without namespace")?;
        let color = ["red", "green", "blue"][usize::try_from(marker % 3).unwrap_or(0)];
        let answer = match (id.resource, &op) {
            (_, Op::Delete) => match self.delete(id.resource, namespace, name).await {
                // The state the deletion passed through (a Pod's deletionTimestamp is
                // written before it is removed): a real state the subjects may see.
                Ok(Some(last)) => {
                    self.recorded.record(id, last, Answer::Answered);
                    Ok(None)
                }
                Ok(None) => Ok(None),
                Err(error) => Err(error),
            },
            (Resource::Pods, Op::Create) => {
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {
                        "name": name,
                        "labels": { "app": "soak", "color": color },
                        "annotations": { MARKER: marker.to_string() }
                    },
                    "spec": { "containers": [{ "name": "c", "image": "pause" }] }
                }))?;
                self.pods[namespace]
                    .create(&PostParams::default(), &pod)
                    .await
                    .map(|p| Some(meta_of(&p.metadata)))
            }
            (Resource::Widgets, Op::Create) => {
                let mut widget = DynamicObject::new(name, &widget_resource()).data(json!({
                    "spec": { "size": marker % 100 }
                }));
                widget.metadata.labels = Some(
                    [("app", "soak"), ("color", color)]
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v.to_owned()))
                        .collect(),
                );
                widget.metadata.annotations =
                    Some([(MARKER.to_owned(), marker.to_string())].into());
                self.widgets[namespace]
                    .create(&PostParams::default(), &widget)
                    .await
                    .map(|w| Some(meta_of(&w.metadata)))
            }
            (resource, Op::Annotate | Op::Relabel) => {
                let mut patch =
                    json!({ "metadata": { "annotations": { MARKER: marker.to_string() } } });
                if matches!(op, Op::Relabel) {
                    patch["metadata"]["labels"] = json!({ "color": color });
                }
                self.patch(resource, namespace, name, &patch)
                    .await
                    .map(Some)
            }
        };
        self.recorded.writes.fetch_add(1, Ordering::Relaxed);
        match answer {
            // What the server answered it holds now, which is not always what was asked:
            // a Pod being deleted, say, keeps its last state.
            Ok(answered) => {
                let (marker, resource_version) = answered.unwrap_or((None, None));
                // An answer at a version no newer than the last one known made no new
                // state (a Pod whose deletion was cut short answers a patch with the
                // patched object at its old version, then finishes deleting): read back.
                let stale = resource_version.is_some_and(|rv| {
                    self.recorded
                        .last(id)
                        .and_then(|last| last.resource_version)
                        .is_some_and(|last| rv <= last)
                });
                if stale {
                    self.recorded.unanswered.fetch_add(1, Ordering::Relaxed);
                    self.settle(id, namespace, name).await;
                    return Ok(());
                }
                self.recorded
                    .record(id, (marker, resource_version), Answer::Answered);
                Ok(())
            }
            Err(error) => {
                debug!(%error, key = %id.key, "a write failed; reading the object back");
                self.recorded.unanswered.fetch_add(1, Ordering::Relaxed);
                self.settle(id, namespace, name).await;
                Ok(())
            }
        }
    }

    /// Reads the object until the server answers, and records what it holds.
    async fn settle(&self, id: &ObjectId, namespace: &str, name: &str) {
        let mut delay = Duration::from_millis(100);
        loop {
            let read = match id.resource {
                Resource::Pods => self.pods[namespace]
                    .get_opt(name)
                    .await
                    .map(|p| p.map(|p| meta_of(&p.metadata))),
                Resource::Widgets => self.widgets[namespace]
                    .get_opt(name)
                    .await
                    .map(|w| w.map(|w| meta_of(&w.metadata))),
            };
            match read {
                Ok(found) => {
                    let state = found.unwrap_or((None, None));
                    self.recorded.record(id, state, Answer::ReadBack);
                    return;
                }
                Err(error) => {
                    debug!(%error, key = %id.key, "reading back failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    async fn delete(
        &self,
        resource: Resource,
        namespace: &str,
        name: &str,
    ) -> kube_client::Result<Option<(Option<u64>, Option<u64>)>> {
        let params = DeleteParams::default();
        Ok(match resource {
            Resource::Pods => self.pods[namespace]
                .delete(name, &params)
                .await?
                .left()
                .map(|p| meta_of(&p.metadata)),
            Resource::Widgets => self.widgets[namespace]
                .delete(name, &params)
                .await?
                .left()
                .map(|w| meta_of(&w.metadata)),
        })
    }

    async fn patch(
        &self,
        resource: Resource,
        namespace: &str,
        name: &str,
        patch: &Value,
    ) -> kube_client::Result<(Option<u64>, Option<u64>)> {
        let params = PatchParams::default();
        match resource {
            Resource::Pods => self.pods[namespace]
                .patch(name, &params, &Patch::Merge(patch))
                .await
                .map(|p| meta_of(&p.metadata)),
            Resource::Widgets => self.widgets[namespace]
                .patch(name, &params, &Patch::Merge(patch))
                .await
                .map(|w| meta_of(&w.metadata)),
        }
    }
}

/// The marker and resourceVersion of an object as the server answered it.
fn meta_of(meta: &kube_client::core::ObjectMeta) -> (Option<u64>, Option<u64>) {
    (
        marker_of(meta.annotations.as_ref()),
        rv_of(meta.resource_version.as_deref()),
    )
}

fn rv_of(resource_version: Option<&str>) -> Option<u64> {
    resource_version.and_then(|rv| rv.parse().ok())
}

fn marker_of(annotations: Option<&BTreeMap<String, String>>) -> Option<u64> {
    annotations?.get(MARKER)?.parse().ok()
}
