//! Divergence checks against the real API server: no drift while objects change under
//! them (the list at exactly the cache's version), and a lost event found by name and
//! repaired.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::{
    Api,
    api::{Patch, PatchParams},
};
use kube_informer::{
    Error, SharedInformer,
    informer::DivergenceCheck,
    informer::Repair,
    list_watch::{
        Change, ListOptions, ListPage, ListStream, ListWatch, VersionPage, WatchEvent,
        WatchOptions, WatchStream,
    },
};
use kube_testenv::TestEnv;
use serde_json::json;
use tests::{config_map, create_all, eventually, run, test_namespace, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_drift_is_found_while_objects_change_under_the_check() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "divergence-live").await;
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let names: Vec<String> = (0..40).map(|i| format!("cm-{i:02}")).collect();
    create_all(
        &api,
        names.iter().map(|n| config_map(n, &[("v", "0")])).collect(),
    )
    .await;
    let informer = SharedInformer::builder(api.clone())
        .divergence_check(DivergenceCheck::on_demand())
        .build();
    let informer = run(informer);
    within("the informer to sync", informer.wait_synced()).await;

    let writing = Arc::new(AtomicBool::new(true));
    let writer = {
        let (api, names, writing) = (api.clone(), names.clone(), writing.clone());
        tokio::spawn(async move {
            for round in 0..150 {
                let name = &names[round % names.len()];
                let patch = json!({ "data": { "v": round.to_string() } });
                api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
                    .await
                    .unwrap();
            }
            writing.store(false, Ordering::SeqCst);
        })
    };
    let mut compared = 0;
    while writing.load(Ordering::SeqCst) {
        if let Some(drift) = informer.check_divergence().await.unwrap() {
            assert!(drift.is_empty(), "a false drift under live writes: {drift}");
            compared += 1;
        }
    }
    within("the writer", writer).await.unwrap();
    assert!(
        compared > 0,
        "at least one check compared while writes went on"
    );
    let stats = informer.divergence_stats().unwrap();
    assert_eq!(stats.drifts, 0);
    informer.stop().await;
}

/// The real `Api`, except that its watches lose the first change to one object: what a
/// proxy or a buggy watch cache can do, and what no informer notices by itself.
#[derive(Clone)]
struct LosesOneEvent {
    api: Api<ConfigMap>,
    victim: &'static str,
    lost: Arc<AtomicBool>,
}

impl ListWatch<ConfigMap> for LosesOneEvent {
    fn resource(&self) -> String {
        ListWatch::<ConfigMap>::resource(&self.api)
    }

    async fn list(&self, options: &ListOptions) -> Result<ListPage<ConfigMap>, Error> {
        ListWatch::<ConfigMap>::list(&self.api, options).await
    }

    async fn list_stream(&self, options: &ListOptions) -> Result<ListStream<ConfigMap>, Error> {
        ListWatch::<ConfigMap>::list_stream(&self.api, options).await
    }

    async fn list_versions(&self, options: &ListOptions) -> Result<VersionPage, Error> {
        ListWatch::<ConfigMap>::list_versions(&self.api, options).await
    }

    async fn watch(&self, options: &WatchOptions) -> Result<WatchStream<ConfigMap>, Error> {
        let (victim, lost) = (self.victim, self.lost.clone());
        let stream = ListWatch::<ConfigMap>::watch(&self.api, options).await?;
        Ok(stream
            .filter(move |event| {
                let modified = match event {
                    Ok(WatchEvent::Modified(cm))
                    | Ok(WatchEvent::Decoded {
                        change: Change::Modified,
                        object: cm,
                        ..
                    }) => Some(cm),
                    _ => None,
                };
                let drop = modified.is_some_and(|cm| cm.metadata.name.as_deref() == Some(victim))
                    && !lost.swap(true, Ordering::SeqCst);
                std::future::ready(!drop)
            })
            .boxed())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_event_is_found_by_name_and_repaired_by_a_relist() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "divergence-lost").await;
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    create_all(
        &api,
        vec![
            config_map("victim", &[("v", "1")]),
            config_map("other", &[]),
        ],
    )
    .await;
    let lossy = LosesOneEvent {
        api: api.clone(),
        victim: "victim",
        lost: Arc::new(AtomicBool::new(false)),
    };
    let informer = SharedInformer::builder(lossy.clone())
        .divergence_check(DivergenceCheck::every(Duration::from_secs(1)).repair(Repair::Relist))
        .build();
    let informer = run(informer);
    within("the informer to sync", informer.wait_synced()).await;

    let patched = api
        .patch(
            "victim",
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": { "v": "2" } })),
        )
        .await
        .unwrap();
    // The next event (or bookmark) takes the cache past the lost change: from then on a
    // check at the cache's version sees what it lacks.
    api.patch(
        "other",
        &PatchParams::default(),
        &Patch::Merge(json!({ "data": { "v": "1" } })),
    )
    .await
    .unwrap();
    let key = format!("{namespace}/victim");
    eventually("the lost change repaired", || {
        informer
            .store()
            .get_by_key(&key)
            .is_some_and(|cm| cm.metadata.resource_version == patched.metadata.resource_version)
    })
    .await;
    assert!(lossy.lost.load(Ordering::SeqCst), "the event was lost");
    let stats = informer.divergence_stats().unwrap();
    assert!(stats.drifts >= 1, "found by the check, not by chance");
    assert!(stats.drifted_objects >= 1);
    informer.stop().await;
}
