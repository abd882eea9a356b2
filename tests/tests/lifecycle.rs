//! Informers over time on a real API server: how far behind each event handler is, as a
//! handler that stops and resumes shows it.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::Api;
use kube_informer::{CancellationToken, InformerFactory, Scope, handler_fn};
use kube_testenv::TestEnv;
use tests::{config_map, create_all, eventually, test_namespace};

const OBJECTS: usize = 300;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_a_stuck_handler_s_lag_rises_and_falls_and_no_other_handler_waits() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "lifecycle-lag").await;
    let factory = InformerFactory::new(client.clone());
    let informer = factory.informer::<ConfigMap>(Scope::namespace(&namespace));
    let fast_seen = Arc::new(AtomicUsize::new(0));
    let seen = fast_seen.clone();
    let fast = informer
        .add_named_handler(
            "fast",
            handler_fn().on_add(move |_: &Arc<ConfigMap>, _| {
                seen.fetch_add(1, Ordering::Relaxed);
            }),
        )
        .unwrap();
    // Stuck on its first event until released (off the runtime's worker, as a handler
    // that waits must be).
    let (release, released) = std::sync::mpsc::channel::<()>();
    let released = Mutex::new(Some(released));
    let slow = informer
        .add_named_handler(
            "slow",
            handler_fn().on_add(move |_: &Arc<ConfigMap>, _| {
                let wait = released.lock().unwrap().take();
                if let Some(wait) = wait {
                    tokio::task::block_in_place(|| {
                        let _ = wait.recv();
                    });
                }
            }),
        )
        .unwrap();
    let stop = CancellationToken::new();
    factory.start(&stop);
    informer.wait_synced().await;

    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let objects = (0..OBJECTS)
        .map(|i| config_map(&format!("cm-{i:03}"), &[]))
        .collect();
    create_all(&api, objects).await;
    eventually("the fast handler has every object", || {
        fast_seen.load(Ordering::Relaxed) == OBJECTS
    })
    .await;
    // The stuck one holds the others back: all its events wait, the oldest for longer and
    // longer.
    let stuck = slow.stats();
    assert_eq!(stuck.waiting, OBJECTS as u64, "{stuck:?}");
    eventually("the oldest event's age grows", || {
        slow.stats().oldest_waiting > stuck.oldest_waiting
    })
    .await;
    assert_eq!(fast.stats().waiting, 0);
    let by_name: Vec<(String, u64)> = informer
        .handler_stats()
        .into_iter()
        .map(|s| (s.name, s.waiting))
        .collect();
    assert_eq!(
        by_name,
        [("fast".to_owned(), 0), ("slow".to_owned(), OBJECTS as u64)]
    );

    release.send(()).unwrap();
    eventually("the slow handler catches up", || slow.stats().waiting == 0).await;
    let caught_up = slow.stats();
    assert_eq!(caught_up.oldest_waiting, Duration::ZERO);
    assert_eq!(caught_up.delivered, OBJECTS as u64);
    assert!(caught_up.processing_total > Duration::ZERO);
    stop.cancel();
    factory.shutdown().await;
}
