//! Faults of the control plane: etcd compacting away the informer's resourceVersion (410
//! Gone, relist, tombstones), and an apiserver restart, with the exact requests read back
//! from the apiserver's audit log.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use kube_informer::{
    Delivery, Error, InformerHandle, SharedInformer,
    error::Verb,
    handler_fn,
    list_watch::{ApiListWatch, ListOptions, ListWatch, VersionMatch},
};
use kube_testenv::TestEnv;
use serde_json::json;
use tests::{
    Ev, PATIENCE, Recording, cache_state, config_map, create_all, data, error_log, eventually,
    name, next_event, recorder, run, server_state, test_namespace, wait_errors, within,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_compaction_forces_a_relist_that_converges() {
    // Without the watch cache, watches and lists are served by etcd, so a compacted revision is
    // refused at once (see testenv.rs).
    let env = TestEnv::builder()
        .apiserver_arg("--watch-cache=false")
        .start()
        .await
        .unwrap();
    let (client, namespace) = test_namespace(&env, "compact").await;
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    for n in ["a", "b", "c"] {
        api.create(&PostParams::default(), &config_map(n, &[("v", "1")]))
            .await
            .unwrap();
    }

    let lw = Recording::new(ApiListWatch::new(api.clone()));
    let (errors, hook) = error_log();
    let informer = SharedInformer::builder(lw.clone())
        .paged_list()
        .on_watch_error(hook)
        .build();
    let (_registration, mut rx) = recorder(&informer);
    let informer = run(informer);
    within("the informer to sync", informer.wait_synced()).await;
    for _ in 0..3 {
        assert!(matches!(
            next_event(&mut rx, "initial adds").await,
            Ev::Add(_, true)
        ));
    }
    // A continue token taken now expires with the compaction below.
    let first_page = ListWatch::<ConfigMap>::list(
        &api,
        &ListOptions {
            limit: Some(1),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let token = first_page.continue_token.expect("3 objects, pages of 1");

    // Cut the informer off: new watch calls wait at the gate, and a restart of the apiserver
    // breaks the running watch for real. The reflector tries to resume from its last RV.
    let remembered: i64 = informer
        .last_sync_resource_version()
        .unwrap()
        .parse()
        .unwrap();
    lw.hold_watches();
    env.restart_apiserver().await.unwrap();
    lw.wait_calls("the reflector to try to resume its watch", |c| {
        c.watches.len() >= 2
    })
    .await;
    let lists_before = lw.calls().lists.len();
    assert_eq!(
        lw.calls().watches[1].resource_version,
        remembered.to_string(),
        "a broken watch resumes from the last RV"
    );

    // Changes the informer cannot see, then etcd forgets the history since its RV.
    api.create(&PostParams::default(), &config_map("d", &[("v", "1")]))
        .await
        .unwrap();
    api.patch(
        "b",
        &PatchParams::default(),
        &Patch::Merge(json!({ "data": { "v": "2" } })),
    )
    .await
    .unwrap();
    api.delete("a", &DeleteParams::default()).await.unwrap();
    let compacted = env.compact_etcd().await.unwrap();
    assert!(compacted > remembered + 1, "{compacted} {remembered}");

    // An expired continue token is a 410 on the list too.
    let expired = ListWatch::<ConfigMap>::list(
        &api,
        &ListOptions {
            limit: Some(1),
            continue_token: Some(token),
            ..Default::default()
        },
    )
    .await
    .unwrap_err();
    assert!(
        matches!(
            &expired,
            Error::Gone {
                verb: Verb::List,
                ..
            }
        ),
        "{expired}"
    );

    lw.release_watches();
    wait_errors(&errors, "a 410 Gone on the resumed watch", |e| {
        e.iter().any(|e| e.gone)
    })
    .await;
    converges(&informer, &api).await;
    let gone = errors.borrow().iter().find(|e| e.gone).cloned().unwrap();
    assert!(gone.text.contains("configmaps"), "{gone:?}");
    // The relist after the 410 asks for a state not older than the last synced version, as
    // client-go does (a watch cache answers it without reading etcd; here etcd does).
    let relist = &lw.calls().lists[lists_before];
    assert_eq!(
        relist.options.version_match,
        Some(VersionMatch::NotOlderThan),
        "{relist:?}"
    );
    assert!(relist.options.continue_token.is_none(), "{relist:?}");

    // Handlers: d added, b updated from v1 to v2, a deleted with a tombstone of its last state.
    let mut seen = Vec::new();
    while seen.len() < 3 {
        seen.push(next_event(&mut rx, "the relist's events").await);
    }
    seen.sort_by_key(Ev::name);
    match &seen[..] {
        [Ev::Delete(a), Ev::Update(old_b, new_b), Ev::Add(d, false)] => {
            assert!(a.is_final_state_unknown(), "only a relist saw the deletion");
            assert_eq!(name(&**a.object()), "a");
            assert_eq!(data(a.object(), "v").as_deref(), Some("1"));
            assert_eq!(a.key().to_string(), format!("{namespace}/a"));
            assert_eq!(data(old_b, "v").as_deref(), Some("1"));
            assert_eq!(data(new_b, "v").as_deref(), Some("2"));
            assert_eq!(name(&**d), "d");
        }
        other => panic!("expected delete a, update b, add d; got {other:?}"),
    }
    assert!(rx.try_recv().is_err(), "c did not change and got no event");
    informer.stop().await;
}

/// Waits until the informer's cache holds exactly what the API server lists.
async fn converges(informer: &InformerHandle<ConfigMap>, api: &Api<ConfigMap>) {
    let started = Instant::now();
    loop {
        let server = server_state(api).await;
        let cache = cache_state(informer);
        if cache == server {
            return;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "the cache did not converge to the server's list in {PATIENCE:?}:\n cache  {cache:?}\n server {server:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The apiserver flag that audits ConfigMap requests (with a policy written into `dir`), and
/// where the flag's companion `--audit-log-path` should point.
fn audit_policy(dir: &std::path::Path) -> (String, std::path::PathBuf) {
    let policy = dir.join("audit-policy.yaml");
    std::fs::write(
        &policy,
        r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    resources:
      - group: ""
        resources: ["configmaps"]
  - level: None
"#,
    )
    .unwrap();
    (
        format!("--audit-policy-file={}", policy.display()),
        dir.join("audit.log"),
    )
}

/// `(verb, requestURI)` of each audited configmap request in `namespace`, in order.
fn audited(log: &std::path::Path, namespace: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut seen = std::collections::HashSet::new();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["objectRef"]["namespace"] == namespace)
        .filter(|e| seen.insert(e["auditID"].as_str().unwrap_or_default().to_owned()))
        .map(|e| {
            (
                e["verb"].as_str().unwrap_or_default().to_owned(),
                e["requestURI"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// The query parameters of a request URI.
fn query(uri: &str) -> HashMap<String, String> {
    uri.split_once('?')
        .map(|(_, q)| q)
        .unwrap_or_default()
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apiserver_restart_is_survived_without_spurious_events() {
    let audit_dir = tempfile::tempdir().unwrap();
    let (policy_arg, audit_log) = audit_policy(audit_dir.path());
    let env = TestEnv::builder()
        .apiserver_arg(policy_arg)
        .apiserver_arg(format!("--audit-log-path={}", audit_log.display()))
        .start()
        .await
        .unwrap();
    let (client, namespace) = test_namespace(&env, "restart").await;
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let n = 10;
    create_all(
        &api,
        (0..n)
            .map(|i| config_map(&format!("cm-{i}"), &[("v", "1")]))
            .collect(),
    )
    .await;

    let lw = Recording::new(ApiListWatch::new(api.clone()));
    let informer = SharedInformer::builder(lw.clone()).paged_list().build();
    let events: Arc<Mutex<BTreeMap<String, Vec<String>>>> = Arc::default();
    let record = |kind: &'static str| {
        let events = events.clone();
        move |o: &ConfigMap| {
            events
                .lock()
                .unwrap()
                .entry(name(o))
                .or_default()
                .push(kind.to_owned());
        }
    };
    let (on_add, on_initial, on_update, on_delete) = (
        record("add"),
        record("initial-add"),
        record("update"),
        record("delete"),
    );
    informer
        .add_handler(
            handler_fn::<ConfigMap>()
                .on_add(move |o, delivery| {
                    if delivery == Delivery::InitialList {
                        on_initial(o)
                    } else {
                        on_add(o)
                    }
                })
                .on_update(move |_, new, _| on_update(new))
                .on_delete(move |d| on_delete(d.object())),
        )
        .expect("an informer that has not run has not stopped");
    let informer = run(informer);
    within("the informer to sync", informer.wait_synced()).await;
    lw.wait_calls("the first watch", |c| !c.watches.is_empty())
        .await;
    eventually("the initial adds", || events.lock().unwrap().len() == n).await;
    // A list at resourceVersion 0 is served from the watch cache, which may not hold the
    // newest creates yet; those arrive as watch adds. Either way each object is added once.
    let before_restart = events.lock().unwrap().clone();
    for i in 0..n {
        assert_eq!(
            before_restart[&format!("cm-{i}")].len(),
            1,
            "{before_restart:?}"
        );
    }

    env.restart_apiserver().await.unwrap();
    api.create(&PostParams::default(), &config_map("after-restart", &[]))
        .await
        .unwrap();
    eventually("the new object to reach the handler", || {
        events.lock().unwrap().contains_key("after-restart")
    })
    .await;
    converges(&informer, &api).await;
    let events = events.lock().unwrap().clone();
    for i in 0..n {
        let key = format!("cm-{i}");
        assert_eq!(
            events[&key], before_restart[&key],
            "no spurious events for an unchanged object: {events:?}"
        );
    }
    assert_eq!(events["after-restart"], ["add"]);
    assert_eq!(events.len(), n + 1);

    // What went over the wire, from the apiserver's audit log.
    let list_rv = lw.calls().lists[0].result.clone().unwrap().1;
    let mut requests = Vec::new();
    eventually(
        "the audit log to show the informer's list and watch",
        || {
            requests = audited(&audit_log, &namespace);
            requests.iter().any(|(verb, _)| verb == "watch")
        },
    )
    .await;
    let (verb, uri) = requests
        .iter()
        .find(|(verb, _)| verb == "list")
        .expect("the informer listed");
    let q = query(uri);
    assert_eq!(verb, "list");
    assert_eq!(q.get("limit").map(String::as_str), Some("500"), "{uri}");
    assert_eq!(
        q.get("resourceVersion").map(String::as_str),
        Some("0"),
        "{uri}"
    );
    let (_, uri) = requests.iter().find(|(verb, _)| verb == "watch").unwrap();
    let q = query(uri);
    assert_eq!(q.get("watch").map(String::as_str), Some("true"), "{uri}");
    assert_eq!(
        q.get("allowWatchBookmarks").map(String::as_str),
        Some("true"),
        "{uri}"
    );
    assert_eq!(q.get("resourceVersion"), Some(&list_rv), "{uri}");
    let timeout: u64 = q["timeoutSeconds"].parse().unwrap();
    assert!((300..600).contains(&timeout), "{uri}");
    informer.stop().await;

    // The other list shapes the reflector sends, straight through the `Api` list-watch.
    let api_lw = ApiListWatch::new(api.clone());
    let page = api_lw
        .list(&ListOptions {
            limit: Some(4),
            ..Default::default()
        })
        .await
        .unwrap();
    let token = page.continue_token.clone().expect("11 objects, pages of 4");
    let next = api_lw
        .list(&ListOptions {
            limit: Some(4),
            continue_token: Some(token.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(next.items.len(), 4);
    assert_eq!(next.resource_version, page.resource_version);
    let not_older = api_lw
        .list(&ListOptions {
            limit: Some(4),
            resource_version: Some(page.resource_version.clone()),
            version_match: Some(VersionMatch::NotOlderThan),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(not_older.items.len(), 4);
    // Told apart from the informer's requests by their page size.
    let direct = |requests: &[(String, String)]| -> Vec<HashMap<String, String>> {
        requests
            .iter()
            .filter(|(verb, _)| verb == "list")
            .map(|(_, uri)| query(uri))
            .filter(|q| q.get("limit").map(String::as_str) == Some("4"))
            .collect()
    };
    let mut lists = Vec::new();
    eventually("the audit log to show the three lists", || {
        lists = direct(&audited(&audit_log, &namespace));
        lists.len() >= 3
    })
    .await;
    assert_eq!(lists.len(), 3, "{lists:?}");
    let no_rv = &lists[0];
    assert!(!no_rv.contains_key("resourceVersion"), "{no_rv:?}");
    let continued = &lists[1];
    assert!(continued.contains_key("continue"), "{continued:?}");
    assert!(!continued.contains_key("resourceVersion"), "{continued:?}");
    let last = &lists[2];
    assert_eq!(last.get("resourceVersion"), Some(&page.resource_version));
    assert_eq!(
        last.get("resourceVersionMatch").map(String::as_str),
        Some("NotOlderThan")
    );
}
