//! The tutorial's Pod controller: no CRD, it watches Pods and logs their state changes
//! (phase, IP, readiness, node, labels), and their deletion. The first step towards
//! registering what runs in Pods with a service registry.

use std::{
    collections::HashMap,
    convert::Infallible,
    sync::{Arc, Mutex, PoisonError},
};

use k8s_openapi::api::core::v1::Pod;
use kube_informer::{Action, ObjectKey, ReconcileRequest, Store};
use tracing::info;

/// The part of a Pod whose changes are logged.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodState {
    /// `Pending`, `Running`, ...
    pub phase: String,
    /// The Pod's IP, once it has one.
    pub ip: String,
    /// Whether the `Ready` condition is true.
    pub ready: bool,
    /// The node it is bound to.
    pub node: String,
    /// Its labels, as `k=v,k=v`.
    pub labels: String,
}

impl PodState {
    /// The state of `pod`.
    pub fn of(pod: &Pod) -> Self {
        let status = pod.status.as_ref();
        let labels = pod
            .metadata
            .labels
            .as_ref()
            .map(|l| {
                l.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        Self {
            phase: status.and_then(|s| s.phase.clone()).unwrap_or_default(),
            ip: status.and_then(|s| s.pod_ip.clone()).unwrap_or_default(),
            ready: status
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
            node: pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default(),
            labels,
        }
    }
}

/// The Pod sync function and the states it logged last.
#[derive(Clone, Debug)]
pub struct Reconciler {
    /// The controller's cache of Pods.
    pub store: Store<Pod>,
    last: Arc<Mutex<HashMap<ObjectKey, PodState>>>,
}

impl Reconciler {
    /// A reconciler reading `store`.
    pub fn new(store: Store<Pod>) -> Self {
        Self {
            store,
            last: Arc::default(),
        }
    }

    /// What changed about the Pod `key` since the last call: its new state, its deletion,
    /// or nothing.
    pub fn observe(&self, key: &ObjectKey) -> Option<PodChange> {
        let current = self.store.get_by_key(key).map(|pod| PodState::of(&pod));
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        match current {
            None => last.remove(key).map(|_| PodChange::Deleted),
            Some(state) if last.get(key) == Some(&state) => None,
            Some(state) => {
                last.insert(key.clone(), state.clone());
                Some(PodChange::Changed(state))
            }
        }
    }

    /// Logs the Pod `key` if its state changed since it was last logged.
    ///
    /// # Errors
    ///
    /// Never: logging cannot fail.
    pub async fn sync(&self, key: ObjectKey) -> Result<(), Infallible> {
        match self.observe(&key) {
            None => {}
            Some(PodChange::Deleted) => info!(
                namespace = key.namespace(),
                name = key.name(),
                "pod deleted"
            ),
            Some(PodChange::Changed(state)) => info!(
                namespace = key.namespace(),
                name = key.name(),
                phase = %state.phase,
                ip = %state.ip,
                ready = state.ready,
                node = %state.node,
                labels = %state.labels,
                "pod state"
            ),
        }
        Ok(())
    }
}

/// A change [`Reconciler::observe`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodChange {
    /// The Pod is new or its state changed.
    Changed(PodState),
    /// The Pod is gone.
    Deleted,
}

impl kube_informer::Reconciler<Pod> for Reconciler {
    type Error = Infallible;

    async fn reconcile(&self, request: ReconcileRequest<Pod>) -> Result<Action, Infallible> {
        self.sync(request.key()).await.map(|()| Action::done())
    }
}

#[cfg(test)]
mod tests {
    use kube_informer::testing::StoreWriter;

    use super::*;

    fn pod(phase: &str) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": "web-1", "namespace": "shop", "labels": { "app": "web" } },
                "status": { "phase": phase }
            }))
            .unwrap(),
        )
    }

    #[test]
    fn only_state_changes_are_reported() {
        let store = StoreWriter::new();
        let reconciler = Reconciler::new(store.store());
        let key = ObjectKey::new(Some("shop"), "web-1");
        store.insert(pod("Pending")).unwrap();
        let Some(PodChange::Changed(state)) = reconciler.observe(&key) else {
            panic!("a new Pod is a change");
        };
        assert_eq!(
            (state.phase.as_str(), state.labels.as_str()),
            ("Pending", "app=web")
        );
        assert_eq!(reconciler.observe(&key), None);
        store.insert(pod("Running")).unwrap();
        assert!(
            matches!(reconciler.observe(&key), Some(PodChange::Changed(s)) if s.phase == "Running")
        );
        store.remove(key.as_str());
        assert_eq!(reconciler.observe(&key), Some(PodChange::Deleted));
        assert_eq!(reconciler.observe(&key), None);
    }
}
