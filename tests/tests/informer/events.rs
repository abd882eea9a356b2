//! What handlers are told: adds, updates with old and new, deletes; and a handler that
//! blocks does not hold up another.

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicUsize, Ordering},
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use kube_informer::{SharedInformer, handler_fn};
use kube_testenv::TestEnv;
use serde_json::json;
use tests::{
    Ev, PATIENCE, config_map, create_all, data, eventually, name, next_event, recorder, run, rv,
    test_namespace, within,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_update_delete_reach_handlers_with_old_and_new() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "events").await;
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    api.create(&PostParams::default(), &config_map("before", &[("v", "0")]))
        .await
        .unwrap();

    let informer = SharedInformer::new(api.clone());
    let (registration, mut rx) = recorder(&informer);
    let informer = run(informer);
    match next_event(&mut rx, "the initial add").await {
        Ev::Add(o, initial) => {
            assert_eq!(name(&*o), "before");
            assert!(initial, "objects of the first list are initial adds");
        }
        other => panic!("expected the initial add, got {other:?}"),
    }
    within("the handler to sync", registration.wait_synced()).await;

    let created = api
        .create(&PostParams::default(), &config_map("a", &[("v", "1")]))
        .await
        .unwrap();
    match next_event(&mut rx, "the add").await {
        Ev::Add(o, initial) => {
            assert_eq!(name(&*o), "a");
            assert!(!initial);
            assert_eq!(data(&o, "v").as_deref(), Some("1"));
            assert_eq!(rv(&*o), rv(&created));
        }
        other => panic!("expected an add, got {other:?}"),
    }

    let updated = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": { "v": "2" } })),
        )
        .await
        .unwrap();
    match next_event(&mut rx, "the update").await {
        Ev::Update(old, new) => {
            assert_eq!(name(&*new), "a");
            assert_eq!(
                data(&old, "v").as_deref(),
                Some("1"),
                "old is the previous state"
            );
            assert_eq!(
                data(&new, "v").as_deref(),
                Some("2"),
                "new is the updated state"
            );
            assert_eq!(rv(&*old), rv(&created));
            assert_eq!(rv(&*new), rv(&updated));
        }
        other => panic!("expected an update, got {other:?}"),
    }

    api.delete("a", &DeleteParams::default()).await.unwrap();
    match next_event(&mut rx, "the delete").await {
        Ev::Delete(deleted) => {
            assert!(!deleted.is_final_state_unknown(), "the watch saw it");
            let last = deleted.object();
            assert_eq!(name(&**last), "a");
            assert_eq!(data(last, "v").as_deref(), Some("2"), "the last state");
            assert_eq!(deleted.key().to_string(), format!("{namespace}/a"));
        }
        other => panic!("expected a delete, got {other:?}"),
    }
    assert!(
        informer
            .store()
            .get_by_key(format!("{namespace}/a"))
            .is_none()
    );
    assert!(rx.try_recv().is_err(), "nothing else was delivered");
    informer.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_blocked_handler_does_not_delay_another() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "slow").await;
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let informer = SharedInformer::new(api.clone());

    // The slow handler blocks its thread on its first event until the test releases it (or,
    // if the test fails first, after a while, so the runtime can shut down).
    let (release, released) = std::sync::mpsc::channel::<()>();
    let released = Mutex::new(released);
    let slow_seen = Arc::new(AtomicUsize::new(0));
    let slow_count = slow_seen.clone();
    informer
        .add_handler(handler_fn::<ConfigMap>().on_add(move |_, _| {
            if slow_count.fetch_add(1, Ordering::SeqCst) == 0 {
                let _ = released.lock().unwrap().recv_timeout(2 * PATIENCE);
            }
        }))
        .expect("an informer that has not run has not stopped");
    let (_fast, mut fast_rx) = recorder(&informer);
    let informer = run(informer);
    within("the informer to sync", informer.wait_synced()).await;

    let count = 20;
    create_all(
        &api,
        (0..count)
            .map(|i| config_map(&format!("cm-{i:02}"), &[]))
            .collect(),
    )
    .await;
    let mut fast_names = Vec::new();
    while fast_names.len() < count {
        match next_event(&mut fast_rx, "the fast handler's adds").await {
            Ev::Add(o, _) => fast_names.push(name(&*o)),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        slow_seen.load(Ordering::SeqCst),
        1,
        "the slow handler is still stuck on its first event"
    );
    assert_eq!(
        informer.store().len(),
        count,
        "the reflector was not held up"
    );
    release.send(()).unwrap();
    eventually("the slow handler to catch up", || {
        slow_seen.load(Ordering::SeqCst) == count
    })
    .await;
    informer.stop().await;
}
