//! What a run records: the server's history as the writer saw it, every event each
//! subject's handlers saw, and every reconcile. The client-go subject writes its events in
//! the same JSON form, one per line.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, PoisonError},
};

use serde::{Deserialize, Serialize};

/// The annotation every write sets to its own sequence number, so that an object's state
/// names the write that made it.
pub const MARKER: &str = "soak.kube-informer.dev/write";

/// The two kinds the writer changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Resource {
    /// Core v1 Pods.
    Pods,
    /// The run's own custom resource, `widgets.soak.kube-informer.dev`.
    Widgets,
}

impl Resource {
    pub fn name(self) -> &'static str {
        match self {
            Resource::Pods => "pods",
            Resource::Widgets => "widgets",
        }
    }
}

/// One object, across its lives (a deleted object may be created again under its key).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ObjectId {
    pub resource: Resource,
    /// `namespace/name`.
    pub key: String,
}

/// One state the server held for an object: the write that made it, and the
/// resourceVersion the server gave it; `None` for a deletion.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerState {
    pub marker: Option<u64>,
    pub resource_version: Option<u64>,
    /// When the writer learned of it (the write's answer, or the read after a write
    /// whose answer was lost), Unix nanoseconds.
    pub known_at_ns: i64,
    /// Whether the writer saw the write answered (as opposed to learned by reading back).
    pub answered: bool,
}

impl ServerState {
    pub fn exists(&self) -> bool {
        self.marker.is_some()
    }
}

/// Every object's states, in the order the server applied them (the writer changes one
/// object at a time, so its own order is the server's).
#[derive(Clone, Debug, Default)]
pub struct ServerHistory {
    pub states: BTreeMap<ObjectId, Vec<ServerState>>,
}

impl ServerHistory {
    /// The object's last state; `None` if the writer never wrote it.
    pub fn last(&self, id: &ObjectId) -> Option<&ServerState> {
        self.states.get(id).and_then(|s| s.last())
    }
}

/// What a handler was told.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventType {
    Add,
    Update,
    Delete,
}

/// One event one handler saw.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventRecord {
    pub subject: String,
    pub handler: String,
    pub resource: Resource,
    #[serde(rename = "type")]
    pub kind: EventType,
    pub key: String,
    pub rv: String,
    /// The object's [`MARKER`], empty if it has none.
    pub marker: String,
    /// An add of the initial list (or of a late handler's replay).
    pub initial: bool,
    /// An update that re-delivers the cached object.
    pub resync: bool,
    /// A delete whose final state is unknown (the object's last known state).
    pub tombstone: bool,
    /// The object has a deletionTimestamp: the server is deleting it (a Pod passes
    /// through such states, which the writer's answers do not show, before it is gone).
    #[serde(default)]
    pub deleting: bool,
    pub at_ns: i64,
}

impl EventRecord {
    pub fn marker(&self) -> Option<u64> {
        self.marker.parse().ok()
    }

    pub fn resource_version(&self) -> Option<u64> {
        self.rv.parse().ok()
    }

    pub fn stream(&self) -> Stream {
        Stream {
            subject: self.subject.clone(),
            handler: self.handler.clone(),
            resource: self.resource,
        }
    }
}

/// One handler's events of one resource: the unit the checks read.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Stream {
    pub subject: String,
    pub handler: String,
    pub resource: Resource,
}

impl std::fmt::Display for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}/{}",
            self.subject,
            self.handler,
            self.resource.name()
        )
    }
}

/// One reconcile of one controller.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReconcileRecord {
    pub controller: String,
    /// Which replica of the controller ran it, for one run as several processes.
    #[serde(default)]
    pub replica: Option<String>,
    /// The object's UID (its last state's, for a deletion), where the replica knew it.
    #[serde(default)]
    pub uid: Option<String>,
    pub key: String,
    /// The marker of the object the reconcile was handed; `None` for a deleted object.
    pub marker: Option<u64>,
    pub started_ns: i64,
    pub finished_ns: i64,
}

/// Events, shared by every handler of the in-process subjects.
#[derive(Clone, Debug, Default)]
pub struct Events(Arc<Mutex<Vec<EventRecord>>>);

impl Events {
    pub fn push(&self, record: EventRecord) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(record);
    }

    pub fn snapshot(&self) -> Vec<EventRecord> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Unix time in nanoseconds.
pub fn unix_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}
