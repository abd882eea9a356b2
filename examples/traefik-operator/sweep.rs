//! The sweep: routes left in etcd by objects deleted while no operator ran. Informers see
//! only what exists, so nothing else would ever remove those routes.

use std::{sync::Arc, time::Duration};

use futures::{Stream, StreamExt};
use kube_core::Resource;
use kube_informer::{InformerHandle, ObjectKey};
use tracing::{info, warn};

use super::kv::TraefikKv;

/// The routes of one controller in etcd: the prefix of their names, and how a name parses
/// back to the key of its object.
#[derive(Clone, Debug)]
pub struct Routes {
    /// Where they are.
    pub kv: Arc<TraefikKv>,
    /// What their names start with.
    pub prefix: &'static str,
    /// The key of the object a route name came from.
    pub key_of_route: fn(&str) -> Option<ObjectKey>,
}

impl Routes {
    /// The routes named `prefix...` in `kv`.
    pub fn new(
        kv: &Arc<TraefikKv>,
        prefix: &'static str,
        key_of_route: fn(&str) -> Option<ObjectKey>,
    ) -> Self {
        Self {
            kv: kv.clone(),
            prefix,
            key_of_route,
        }
    }

    /// Once `informer` has synced, and every `period` after, the keys of the objects whose
    /// routes are in etcd but which are not cached: a controller given these keys
    /// ([`reconcile_on`](kube_informer::ControllerBuilder::reconcile_on)) reconciles them
    /// as deleted, which removes their routes.
    pub fn vanished<K: Resource + Send + Sync + 'static>(
        self,
        informer: InformerHandle<K>,
        period: Duration,
    ) -> impl Stream<Item = ObjectKey> + Send + 'static {
        futures::stream::unfold(true, move |first| {
            let (routes, informer) = (self.clone(), informer.clone());
            async move {
                if first {
                    informer.wait_synced().await;
                } else {
                    tokio::time::sleep(period).await;
                }
                let store = informer.store();
                let vanished: Vec<ObjectKey> = match routes.kv.route_names(routes.prefix).await {
                    Ok(names) => names
                        .iter()
                        .filter_map(|name| (routes.key_of_route)(name))
                        .filter(|key| !store.contains_key(key))
                        .inspect(|key| info!(%key, "route of a vanished object found in etcd; removing it"))
                        .collect(),
                    Err(err) => {
                        warn!(error = %err, "could not look for leftover routes in etcd");
                        Vec::new()
                    }
                };
                Some((futures::stream::iter(vanished), false))
            }
        })
        .flatten()
    }
}
