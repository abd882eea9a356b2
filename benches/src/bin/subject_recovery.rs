//! The kube-informer subject of `recovery-bench`: a [`SharedInformer`] on the ConfigMaps of
//! one namespace, built the way a new user writes it (the builder's defaults, one handler,
//! the client `kube_informer::client` builds, as docs/informers.md recommends), that prints every
//! event its handler sees; see `benches::recovery` for the protocol. The only addition to
//! the defaults is a watch-error hook, which only reports.

use std::{sync::Arc, time::Instant};

use benches::{
    recovery::{EventLine, RecoveryArgs, RecoveryLine, print},
    unix_nanos,
};
use clap::Parser;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::Api;
use kube_informer::{Delivery, SharedInformer, handler_fn};
use tokio_util::sync::CancellationToken;

fn event(kind: &str, object: &ConfigMap, old: Option<&ConfigMap>, tombstone: bool) -> EventLine {
    let at_ns = unix_nanos();
    let version = |o: &ConfigMap| o.metadata.resource_version.clone().unwrap_or_default();
    EventLine {
        kind: kind.to_owned(),
        name: object.metadata.name.clone().unwrap_or_default(),
        resource_version: version(object),
        old_resource_version: old.map(version),
        tombstone,
        at_ns,
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let started = Instant::now();
    benches::init_tracing("info");
    let args = RecoveryArgs::parse();
    let client = benches::informer_client(&args.kubeconfig).await?;
    let informer = SharedInformer::builder(Api::<ConfigMap>::namespaced(client, &args.namespace))
        .on_watch_error(|error| {
            print(&RecoveryLine::WatchError {
                gone: error.is_gone(),
                message: error.to_string(),
                at_ns: unix_nanos(),
            });
        })
        .build();
    informer
        .add_handler(
            handler_fn()
                .on_add(|object: &Arc<ConfigMap>, delivery| {
                    if delivery != Delivery::InitialList {
                        print(&RecoveryLine::Event(event("add", object, None, false)));
                    }
                })
                .on_update(|old, new, _| {
                    print(&RecoveryLine::Event(event("update", new, Some(old), false)));
                })
                .on_delete(|deleted| {
                    let tombstone = deleted.is_final_state_unknown();
                    let line = event("delete", deleted.object(), None, tombstone);
                    print(&RecoveryLine::Event(line));
                }),
        )
        .expect("an informer that has not run has not stopped");
    let informer = informer.spawn(CancellationToken::new());
    informer.wait_synced_or_fatal().await?;
    print(&RecoveryLine::Synced {
        subject: "kube-informer".to_owned(),
        synced_ms: started.elapsed().as_secs_f64() * 1000.0,
        cached: informer.store().len(),
        at_ns: unix_nanos(),
    });
    // Run until the driver closes stdin (or kills the process).
    let mut sink = Vec::new();
    let _ = tokio::io::AsyncReadExt::read_to_end(&mut tokio::io::stdin(), &mut sink).await;
    informer.stop().await;
    Ok(())
}
