//! The sweep: routes left in etcd by objects deleted while no operator ran. Informers see
//! only what exists, so nothing else would ever remove those routes. It looks only at the
//! routes this operator instance owns in its namespace scope (see
//! [`ownership`](super::ownership)): other operators' routes, and routes written by hand,
//! are not its business.

use std::{sync::Arc, time::Duration};

use kube_core::Resource;
use kube_informer::{Controller, FactoryScope, ObjectKey, Store, TypedResource};
use prometheus_client::{
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};
use tracing::{info, warn};

use super::ownership::Ownership;

/// What every controller's sweep shares: the ownership records, the namespace scope, and
/// the counters `traefik_operator_route_sweeps_total{controller}`.
#[derive(Clone, Debug)]
pub struct Sweeps {
    ownership: Arc<Ownership>,
    namespace: Option<String>,
    counters: Family<Vec<(&'static str, &'static str)>, Counter>,
}

impl Sweeps {
    /// Sweeps of the routes `ownership` owns in `namespace` (all for `None`), counted in
    /// `registry`.
    pub fn new(
        registry: &mut Registry,
        ownership: Arc<Ownership>,
        namespace: Option<&str>,
    ) -> Self {
        let counters = Family::default();
        registry.register(
            "traefik_operator_route_sweeps",
            "Searches of etcd for the routes of vanished objects",
            counters.clone(),
        );
        Self {
            ownership,
            namespace: namespace.map(str::to_owned),
            counters,
        }
    }

    /// The routes of `controller`, named `prefix...` and parsed back by `key_of_route`.
    pub fn routes(
        &self,
        prefix: &'static str,
        key_of_route: fn(&str) -> Option<ObjectKey>,
        controller: &'static str,
    ) -> Routes {
        Routes {
            ownership: self.ownership.clone(),
            namespace: self.namespace.clone(),
            prefix,
            key_of_route,
            sweeps: self
                .counters
                .get_or_create(&vec![("controller", controller)])
                .clone(),
        }
    }
}

/// The routes of one controller in etcd: the prefix of their names, and how a name parses
/// back to the key of its object.
#[derive(Clone, Debug)]
pub struct Routes {
    /// Their records.
    pub ownership: Arc<Ownership>,
    /// The namespace scope (`None`: all).
    pub namespace: Option<String>,
    /// What their names start with.
    pub prefix: &'static str,
    /// The key of the object a route name came from.
    pub key_of_route: fn(&str) -> Option<ObjectKey>,
    /// Counts the sweeps done.
    pub sweeps: Counter,
}

impl Routes {
    /// `controller`, also reconciling once it has synced and every `period` after the
    /// [`vanished`](Self::vanished) objects, so it removes their routes.
    pub fn swept_by<K>(self, controller: Controller<K>, period: Duration) -> Controller<K>
    where
        K: TypedResource,
        K::Scope: FactoryScope,
    {
        let store = controller.store();
        controller.reconcile_every(period, move || {
            let (routes, store) = (self.clone(), store.clone());
            async move { routes.vanished(&store).await }
        })
    }

    /// The keys of the objects whose routes are in etcd but which `store` does not hold:
    /// a controller given these keys (by
    /// [`reconcile_every`](kube_informer::Controller::reconcile_every)) reconciles them as
    /// deleted, which removes their routes. An etcd that cannot be read yields no keys,
    /// and a warning.
    pub async fn vanished<K: Resource>(&self, store: &Store<K>) -> Vec<ObjectKey> {
        self.sweeps.inc();
        let owned = self
            .ownership
            .owned(self.prefix, self.namespace.as_deref())
            .await;
        match owned {
            Ok(owned) => owned
                .iter()
                .filter_map(|owned| (self.key_of_route)(&owned.route))
                .filter(|key| !store.contains_key(key))
                .inspect(|key| info!(%key, "route of a vanished object found in etcd; removing it"))
                .collect(),
            Err(err) => {
                warn!(error = %err, "could not look for leftover routes in etcd");
                Vec::new()
            }
        }
    }
}
