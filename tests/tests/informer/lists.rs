//! Paged lists, list pages read as streams, and a streaming list (sendInitialEvents).

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
    core::{ApiResource, DynamicObject, GroupVersionKind, Resource},
};
use kube_informer::{
    Error, SharedInformer,
    error::Verb,
    list_watch::{ApiListWatch, ListItem, ListOptions, ListWatch, VersionMatch},
    store::label_index,
};
use kube_testenv::TestEnv;
use serde_json::json;
use tests::{
    Ev, Recording, cache_state, config_map, create_all, labelled, name, next_event, recorder, run,
    rv, server_state, test_namespace, watch_cache_holds, within,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twelve_hundred_config_maps_sync_through_paged_lists() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "paged").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    // Something in another namespace the informer must not see.
    let other = env.create_namespace("paged-other").await.unwrap();
    Api::<ConfigMap>::namespaced(client, &other)
        .create(&PostParams::default(), &config_map("elsewhere", &[]))
        .await
        .unwrap();
    let expected: Vec<String> = (0..1200).map(|i| format!("cm-{i:04}")).collect();
    create_all(
        &api,
        expected
            .iter()
            .map(|n| config_map(n, &[("n", n)]))
            .collect(),
    )
    .await;
    // The informer's first list (resourceVersion "0") is served from the API server's watch
    // cache, which may still be taking in the last creates: start once it holds them all, so
    // that list alone must bring all 1,200.
    watch_cache_holds(&api, 1200).await;

    let lw = Recording::new(ApiListWatch::new(api.clone()));
    let informer = SharedInformer::builder(lw.clone()).paged_list().build();
    let informer = run(informer);
    within("the informer to sync", informer.wait_synced()).await;

    let store = informer.store();
    assert_eq!(store.len(), 1200);
    let mut keys: Vec<String> = store.list_keys().iter().map(ToString::to_string).collect();
    keys.sort();
    let expected_keys: Vec<String> = expected
        .iter()
        .map(|n| format!("{namespace}/{n}"))
        .collect();
    assert_eq!(
        keys, expected_keys,
        "exactly the 1,200, none from elsewhere"
    );
    assert_eq!(cache_state(&informer), server_state(&api).await);

    // The reflector's first list: resourceVersion "0" (any cached state) with a limit of 500.
    // The server may serve it whole from its watch cache (1.36 does: one page of 1,200);
    // every page it did send is counted.
    lw.wait_calls("the first watch", |c| !c.watches.is_empty())
        .await;
    let calls = lw.calls();
    let first = &calls.lists[0];
    assert_eq!(first.options.limit, Some(500));
    assert_eq!(first.options.resource_version.as_deref(), Some("0"));
    assert!(first.options.continue_token.is_none());
    let listed: usize = calls
        .lists
        .iter()
        .map(|c| c.result.as_ref().expect("no list failed").0)
        .sum();
    assert_eq!(listed, 1200, "{:?}", calls.lists);
    for later in &calls.lists[1..] {
        assert!(later.options.continue_token.is_some() && later.options.resource_version.is_none());
    }
    let list_rv = first.result.as_ref().unwrap().1.clone();
    assert_eq!(calls.watches[0].resource_version, list_rv);
    assert!(calls.watches[0].allow_bookmarks);

    // A list from resourceVersion "" (a consistent read from etcd, as when a relist's own
    // version or continue token expired), which the server always pages: 500 + 500 + 200, following continue tokens that carry no RV.
    let before = lw.calls().lists.len();
    let (sizes, mut names) = list_pages(
        &lw,
        ListOptions {
            limit: Some(500),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(sizes, [500, 500, 200]);
    names.sort();
    assert_eq!(names, expected);
    let relist = &lw.calls().lists[before..];
    assert!(relist[0].options.resource_version.is_none());
    assert!(
        relist[1..]
            .iter()
            .all(|c| c.options.continue_token.is_some())
    );

    // A later relist (resourceVersionMatch=NotOlderThan the last seen RV) pages too.
    let (sizes, _) = list_pages(
        &lw,
        ListOptions {
            limit: Some(500),
            resource_version: informer.last_sync_resource_version(),
            version_match: Some(VersionMatch::NotOlderThan),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(sizes.iter().sum::<usize>(), 1200);
    assert!(sizes.iter().all(|s| *s <= 500), "{sizes:?}");
    informer.stop().await;
}

/// Lists every page as the reflector does, returning the page sizes and the names.
async fn list_pages<K: Resource, L: ListWatch<K>>(
    lw: &L,
    first: ListOptions,
) -> (Vec<usize>, Vec<String>) {
    let mut options = first;
    let mut sizes = Vec::new();
    let mut names = Vec::new();
    loop {
        let page = lw.list(&options).await.expect("a list page");
        sizes.push(page.items.len());
        names.extend(page.items.iter().map(|o| name(o)));
        match page.continue_token {
            Some(token) => {
                options = ListOptions {
                    limit: options.limit,
                    continue_token: Some(token),
                    ..Default::default()
                }
            }
            None => return (sizes, names),
        }
    }
}

/// Reads one page through [`ListWatch::list_stream`]: the names, then the page's end.
async fn stream_page<K: Resource + Send + 'static, L: ListWatch<K>>(
    lw: &L,
    options: &ListOptions,
) -> Result<(Vec<String>, String, Option<String>), Error> {
    let mut stream = lw.list_stream(options).await?;
    let mut names = Vec::new();
    while let Some(item) = stream.next().await {
        match item? {
            ListItem::Object(o) | ListItem::Decoded { object: o, .. } => names.push(name(&o)),
            ListItem::Undecodable(u) => panic!("every ConfigMap here decodes: {u:?}"),
            ListItem::End {
                resource_version,
                continue_token,
                ..
            } => {
                assert!(stream.next().await.is_none(), "End is the last item");
                return Ok((names, resource_version, continue_token));
            }
        }
    }
    panic!("the page stream ended without End");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pages_read_as_streams_match_decoded_pages() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "list-stream").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let expected: Vec<String> = (0..600).map(|i| format!("cm-{i:04}")).collect();
    create_all(
        &api,
        expected
            .iter()
            .map(|n| config_map(n, &[("n", n)]))
            .collect(),
    )
    .await;

    // Page by page from a consistent read: the same names, versions and tokens as `list`
    // (continue tokens differ only in what they encode, so compare their presence).
    let mut options = ListOptions {
        limit: Some(250),
        ..Default::default()
    };
    let mut streamed = Vec::new();
    let mut sizes = Vec::new();
    loop {
        let (names, rv, token) = stream_page(&api, &options).await.expect("a page");
        let page = ListWatch::<ConfigMap>::list(&api, &options)
            .await
            .expect("the same page");
        assert_eq!(names, page.items.iter().map(name).collect::<Vec<_>>());
        assert_eq!(token.is_some(), page.continue_token.is_some());
        if options.continue_token.is_some() {
            assert_eq!(rv, page.resource_version, "one snapshot for all pages");
        }
        sizes.push(names.len());
        streamed.extend(names);
        match token {
            Some(token) => {
                options = ListOptions {
                    limit: Some(250),
                    continue_token: Some(token),
                    ..Default::default()
                }
            }
            None => break,
        }
    }
    assert_eq!(sizes, [250, 250, 100]);
    assert_eq!(streamed, expected);

    // From the watch cache, whole, through the filtering ApiListWatch too.
    let lw = ApiListWatch::new(api.clone()).fields("metadata.name=cm-0007");
    let (names, rv, token) = stream_page(
        &lw,
        &ListOptions {
            limit: Some(500),
            resource_version: Some("0".into()),
            ..Default::default()
        },
    )
    .await
    .expect("a filtered page");
    assert_eq!(names, ["cm-0007"]);
    assert!(!rv.is_empty() && token.is_none());

    // Errors come back sorted, as from `list`: an unknown resource is a 404.
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("nothing.example.com", "v1", "Nope"));
    let missing: Api<DynamicObject> = Api::namespaced_with(client, &namespace, &ar);
    let err = stream_page(&missing, &ListOptions::default())
        .await
        .unwrap_err();
    match &err {
        Error::Api { status, verb, .. } => {
            assert_eq!(status.code, 404, "{err}");
            assert_eq!(*verb, Verb::List);
        }
        other => panic!("expected a 404, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_list_into_a_compact_cache_syncs_and_follows() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "streamed").await;
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let expected: Vec<String> = (0..1200).map(|i| format!("cm-{i:04}")).collect();
    create_all(
        &api,
        expected
            .iter()
            .map(|n| labelled(n, &[("app", if n.ends_with('0') { "db" } else { "web" })]))
            .collect(),
    )
    .await;

    let lw = Recording::new(ApiListWatch::new(api.clone()));
    let informer = SharedInformer::builder(lw.clone())
        .streaming_list()
        .compact()
        .index_fn("app", label_index("app"))
        .build();
    let (registration, mut rx) = recorder(&informer);
    let informer = run(informer);
    within("the informer to sync", registration.wait_synced()).await;

    // The whole state came on one watch with sendInitialEvents, without a LIST.
    let calls = lw.calls();
    assert!(calls.lists.is_empty(), "{:?}", calls.lists);
    assert_eq!(calls.watches.len(), 1);
    assert!(calls.watches[0].send_initial_events);
    assert_eq!(calls.watches[0].resource_version, "");
    let mut initial = Vec::new();
    while let Ok(ev) = rx.try_recv() {
        match ev {
            Ev::Add(o, true) => initial.push(name(&*o)),
            other => panic!("expected initial adds only, got {other:?}"),
        }
    }
    initial.sort();
    assert_eq!(initial, expected);

    let store = informer.store();
    assert!(store.is_compact());
    assert_eq!(cache_state(&informer), server_state(&api).await);
    assert_eq!(store.by_index("app", "db").unwrap().len(), 120);
    let synced_rv: u64 = informer
        .last_sync_resource_version()
        .expect("the end bookmark's version")
        .parse()
        .unwrap();
    let newest = server_state(&api)
        .await
        .values()
        .map(|rv| rv.parse::<u64>().unwrap())
        .max();
    assert!(
        Some(synced_rv) >= newest,
        "synced at {synced_rv}, objects up to {newest:?}"
    );

    // Changes follow on the same watch; the old object comes back from the compact form.
    let before = api.get("cm-0001").await.unwrap();
    let updated = api
        .patch(
            "cm-0001",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { "app": "db" } } })),
        )
        .await
        .unwrap();
    match next_event(&mut rx, "the update").await {
        Ev::Update(old, new) => {
            assert_eq!(*old, before);
            assert_eq!(rv(&*new), rv(&updated));
        }
        other => panic!("expected an update, got {other:?}"),
    }
    assert_eq!(store.by_index("app", "db").unwrap().len(), 121);
    api.delete("cm-0002", &DeleteParams::default())
        .await
        .unwrap();
    match next_event(&mut rx, "the delete").await {
        Ev::Delete(deleted) => {
            assert!(!deleted.is_final_state_unknown());
            assert_eq!(name(&**deleted.object()), "cm-0002");
        }
        other => panic!("expected a delete, got {other:?}"),
    }
    assert_eq!(store.len(), 1199);
    assert_eq!(
        lw.calls().watches.len(),
        1,
        "the streaming watch carried on"
    );
    informer.stop().await;
}
