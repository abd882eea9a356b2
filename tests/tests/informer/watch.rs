//! The `Api` list-watch's stream: events, and a bookmark before the server's timeout.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::{Api, api::PostParams};
use kube_informer::list_watch::{Change, ListOptions, ListWatch, WatchEvent, WatchOptions};
use kube_testenv::TestEnv;
use tests::{config_map, rv, test_namespace, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_watch_streams_events_and_a_bookmark_before_its_timeout() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "stream").await;
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let start = ListWatch::<ConfigMap>::list(&api, &ListOptions::default())
        .await
        .unwrap();
    let mut stream = ListWatch::<ConfigMap>::watch(
        &api,
        &WatchOptions {
            resource_version: start.resource_version.clone(),
            timeout: Some(Duration::from_secs(6)),
            allow_bookmarks: true,
            send_initial_events: false,
            shard: None,
        },
    )
    .await
    .unwrap();
    let created = api
        .create(&PostParams::default(), &config_map("x", &[]))
        .await
        .unwrap();
    let mut added = None;
    let mut bookmark = None;
    // The server ends the watch at its timeout; it sends a bookmark shortly before.
    while let Some(event) = within("the watch to end at its timeout", stream.next()).await {
        match event.expect("no stream error") {
            WatchEvent::Added(o)
            | WatchEvent::Decoded {
                change: Change::Added,
                object: o,
                ..
            } => added = Some(o),
            WatchEvent::Bookmark {
                resource_version, ..
            } => bookmark = Some(resource_version),
            other => panic!("unexpected {other:?}"),
        }
    }
    let added = added.expect("the create was streamed");
    assert_eq!(rv(&added), rv(&created));
    let bookmark = bookmark.expect("a bookmark before the timeout");
    assert!(
        bookmark.parse::<u64>().unwrap() >= rv(&created).parse::<u64>().unwrap(),
        "{bookmark}"
    );
}
