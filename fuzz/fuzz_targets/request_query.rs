//! The list and watch requests built from text that comes from elsewhere: label and field
//! selectors (from a user's configuration: the library passes field selectors to the
//! server without parsing them), and the resourceVersions and continue tokens the server
//! sent in earlier responses.
//!
//! Input: a list's and a watch's options, selectors and resource, built from the bytes by
//! `arbitrary`.
//!
//! Checked, beyond not panicking: the request goes to the collection's path, and its query
//! decodes to exactly the parameters the options ask for, each once, whatever the text
//! holds (no selector or token can add, drop or change another parameter); a request is
//! refused exactly when its options contradict each other.

#![no_main]

use std::time::Duration;

use arbitrary::Arbitrary;
use kube_informer::{
    fuzzing::{list_request_uri, watch_request_uri},
    list_watch::{HashRange, ListOptions, Shard, ShardField, VersionMatch, WatchOptions},
};
use libfuzzer_sys::fuzz_target;

const URLS: [&str; 4] = [
    "/api/v1/pods",
    "/api/v1/namespaces/default/configmaps",
    "/apis/apps/v1/namespaces/kube-system/deployments",
    "/apis/example.com/v1/widgets",
];

#[derive(Arbitrary, Debug)]
struct Input {
    url: u8,
    metadata: bool,
    labels: Option<String>,
    fields: Option<String>,
    limit: Option<u32>,
    continue_token: Option<String>,
    resource_version: Option<String>,
    version_match: Option<bool>,
    shard: Option<(u8, Vec<(u64, u64)>)>,
    watch_version: String,
    timeout: Option<u64>,
    bookmarks: bool,
    initial_events: bool,
}

fuzz_target!(|input: Input| {
    let url = URLS[usize::from(input.url) % URLS.len()];
    let shard = input.shard.as_ref().and_then(|(field, ranges)| {
        let field = match field % 3 {
            0 => ShardField::Uid,
            1 => ShardField::Namespace,
            _ => ShardField::ControllerUid,
        };
        let ranges = ranges.iter().take(8).filter_map(|&(start, width)| {
            HashRange::new(start, u128::from(start) + u128::from(width))
        });
        Shard::new(field, ranges)
    });
    let shard_param = shard
        .as_ref()
        .filter(|s| s.field().server_side())
        .map(Shard::selector);

    let list = ListOptions {
        limit: input.limit,
        continue_token: input.continue_token.clone(),
        resource_version: input.resource_version.clone(),
        version_match: input.version_match.map(|exact| match exact {
            true => VersionMatch::Exact,
            false => VersionMatch::NotOlderThan,
        }),
        shard: shard.clone(),
    };
    let labels = input.labels.as_deref();
    let fields = input.fields.as_deref();
    let uri = list_request_uri(url, input.metadata, labels, fields, &list);

    // What the list asks for: the resourceVersion only without a continue token, its match
    // only with a resourceVersion (without one there is nothing to match), and an exact
    // match never at "0".
    let version = list.resource_version.as_deref().filter(|v| !v.is_empty());
    let contradicts = version == Some("0") && list.version_match == Some(VersionMatch::Exact);
    let mut expected = Vec::new();
    push(&mut expected, "fieldSelector", fields);
    push(&mut expected, "labelSelector", labels);
    push(
        &mut expected,
        "limit",
        list.limit.map(|l| l.to_string()).as_deref(),
    );
    push(&mut expected, "continue", list.continue_token.as_deref());
    if list.continue_token.is_none() && version.is_some() {
        push(&mut expected, "resourceVersion", version);
        let version_match = list.version_match.as_ref().map(|m| match m {
            VersionMatch::Exact => "Exact",
            VersionMatch::NotOlderThan => "NotOlderThan",
        });
        push(&mut expected, "resourceVersionMatch", version_match);
    }
    push(&mut expected, "shardSelector", shard_param.as_deref());
    check("list", url, uri, contradicts, expected);

    let watch = WatchOptions {
        resource_version: input.watch_version.clone(),
        timeout: input.timeout.map(Duration::from_secs),
        allow_bookmarks: input.bookmarks,
        send_initial_events: input.initial_events,
        shard,
    };
    let uri = watch_request_uri(url, input.metadata, labels, fields, &watch);
    let timeout = watch
        .timeout
        .map_or(290, |t| u32::try_from(t.as_secs()).unwrap_or(u32::MAX));
    let mut expected = vec![("watch".to_owned(), "true".to_owned())];
    push(&mut expected, "timeoutSeconds", Some(&timeout.to_string()));
    push(&mut expected, "fieldSelector", fields);
    push(&mut expected, "labelSelector", labels);
    push(
        &mut expected,
        "allowWatchBookmarks",
        watch.allow_bookmarks.then_some("true"),
    );
    if watch.send_initial_events {
        push(&mut expected, "sendInitialEvents", Some("true"));
        push(&mut expected, "resourceVersionMatch", Some("NotOlderThan"));
    }
    push(
        &mut expected,
        "resourceVersion",
        Some(&watch.resource_version),
    );
    push(&mut expected, "shardSelector", shard_param.as_deref());
    let contradicts = watch.send_initial_events && !watch.allow_bookmarks;
    check("watch", url, uri, contradicts, expected);
});

fn push(params: &mut Vec<(String, String)>, key: &str, value: Option<&str>) {
    if let Some(value) = value {
        params.push((key.to_owned(), value.to_owned()));
    }
}

fn check(
    what: &str,
    url: &str,
    uri: Result<String, kube_informer::Error>,
    contradicts: bool,
    mut expected: Vec<(String, String)>,
) {
    let uri = match (uri, contradicts) {
        (Ok(uri), false) => uri,
        (Err(_), true) => return,
        (Ok(uri), true) => panic!("{what}: built {uri} from contradicting options"),
        (Err(error), false) => panic!("{what}: refused: {error}"),
    };
    let (path, query) = uri.split_once('?').unwrap_or((&uri, ""));
    assert_eq!(path, url, "{what}: the collection's path");
    let mut params: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect();
    params.sort();
    expected.sort();
    assert_eq!(params, expected, "{what}: the query of {uri}");
}
