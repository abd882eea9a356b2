//! Streaming lists (`sendInitialEvents`) and compact stores, through the public API, on the
//! in-memory `FakeListWatch`: the initial state arrives as events on the watch that then
//! carries on, a torn stream is retried without duplicate events, a relist by stream removes
//! vanished objects with tombstones, and servers that ignore or reject streaming lists get
//! paged lists instead.

mod support;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube_informer::{
    DeletedObject, Delivery, Error, RunningInformer, SharedInformer,
    error::Verb,
    handler_fn,
    store::label_index,
    testing::{gone, status},
    wait_for_cache_sync,
};
use support::*;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// What a handler saw, in order.
#[derive(Debug, PartialEq)]
enum Seen {
    Add {
        name: String,
        initial: bool,
    },
    Update {
        name: String,
        old_rv: String,
        new_rv: String,
    },
    Delete {
        name: String,
        tombstone: bool,
    },
}

fn add(name: &str, initial: bool) -> Seen {
    Seen::Add {
        name: name.to_owned(),
        initial,
    }
}

fn name(cm: &ConfigMap) -> String {
    cm.metadata.name.clone().unwrap_or_default()
}

fn rv(cm: &ConfigMap) -> String {
    cm.metadata.resource_version.clone().unwrap_or_default()
}

struct Running {
    informer: RunningInformer<ConfigMap>,
    seen: mpsc::UnboundedReceiver<Seen>,
    errors: Arc<Mutex<Vec<String>>>,
}

impl Running {
    /// Starts `informer` with a handler that reports what it sees, and waits for the sync.
    async fn start(
        fake: &Fake,
        configure: impl FnOnce(
            kube_informer::informer::InformerBuilder<ConfigMap, Fake>,
        ) -> kube_informer::informer::InformerBuilder<ConfigMap, Fake>,
    ) -> Self {
        let errors = Arc::new(Mutex::new(Vec::new()));
        let hook_errors = errors.clone();
        let informer = configure(
            SharedInformer::builder(fake.clone())
                .streaming_list()
                .on_watch_error(move |e: &Error| hook_errors.lock().unwrap().push(e.to_string())),
        )
        .build();
        let (tx, seen) = mpsc::unbounded_channel();
        let (add, update, delete) = (tx.clone(), tx.clone(), tx);
        let registration = informer
            .add_handler(
                handler_fn()
                    .on_add(move |cm: &Arc<ConfigMap>, delivery| {
                        let _ = add.send(Seen::Add {
                            name: name(cm),
                            initial: delivery == Delivery::InitialList,
                        });
                    })
                    .on_update(move |old: &Arc<ConfigMap>, new: &Arc<ConfigMap>, _| {
                        let _ = update.send(Seen::Update {
                            name: name(new),
                            old_rv: rv(old),
                            new_rv: rv(new),
                        });
                    })
                    .on_delete(move |d: &DeletedObject<ConfigMap>| {
                        let (obj, tombstone) = match d {
                            DeletedObject::Final(o) => (o.clone(), false),
                            DeletedObject::FinalStateUnknown(t) => (t.last_known.clone(), true),
                        };
                        let _ = delete.send(Seen::Delete {
                            name: name(&obj),
                            tombstone,
                        });
                    }),
            )
            .expect("an informer that has not run has not stopped");
        let informer = informer.spawn(CancellationToken::new());
        wait_for_cache_sync(&[&informer, &registration], Duration::from_secs(600))
            .await
            .expect("synced");
        Self {
            informer,
            seen,
            errors,
        }
    }

    async fn next(&mut self) -> Seen {
        self.seen.recv().await.expect("handler alive")
    }

    /// The next `n` events, sorted (initial events come in no particular order).
    async fn next_sorted(&mut self, n: usize) -> Vec<String> {
        let mut names = Vec::new();
        for _ in 0..n {
            names.push(format!("{:?}", self.next().await));
        }
        names.sort();
        names
    }

    fn errors(&self) -> Vec<String> {
        self.errors.lock().unwrap().clone()
    }

    async fn stop(self) {
        self.informer.stop().await;
    }
}

fn adds(names: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = names
        .iter()
        .map(|n| format!("{:?}", add(n, true)))
        .collect();
    out.sort();
    out
}

#[tokio::test(start_paused = true)]
async fn initial_state_streams_in_and_the_same_watch_carries_on() {
    let fake = Fake::new("configmaps");
    for n in ["a", "b", "c"] {
        fake.add(labelled_in("ns", n, "web"));
    }
    let mut run = Running::start(&fake, |b| b).await;

    assert!(fake.list_requests().is_empty(), "no LIST call");
    let watches = fake.watch_requests();
    assert_eq!(watches.len(), 1);
    assert!(watches[0].send_initial_events && watches[0].allow_bookmarks);
    assert_eq!(
        watches[0].resource_version, "",
        "first sync is a consistent read"
    );
    assert_eq!(run.next_sorted(3).await, adds(&["a", "b", "c"]));
    assert_eq!(run.informer.store().len(), 3);
    assert_eq!(
        run.informer.last_sync_resource_version().as_deref(),
        Some(fake.resource_version().as_str())
    );

    let before = rv(&fake.get("ns/b").unwrap());
    let after = fake.update(labelled_in("ns", "b", "db"));
    assert_eq!(
        run.next().await,
        Seen::Update {
            name: "b".into(),
            old_rv: before,
            new_rv: after
        }
    );
    fake.delete(Some("ns"), "a");
    assert_eq!(
        run.next().await,
        Seen::Delete {
            name: "a".into(),
            tombstone: false
        }
    );
    assert_eq!(
        fake.calls().watches,
        1,
        "changes came on the streaming watch"
    );
    assert!(run.errors().is_empty(), "{:?}", run.errors());
    run.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_torn_initial_stream_is_retried_without_duplicate_events() {
    let fake = Fake::new("configmaps");
    for i in 0..50 {
        fake.add(labelled_in("ns", &format!("o{i:02}"), "web"));
    }
    fake.cut_next_initial_events(20);
    let mut run = Running::start(&fake, |b| b).await;

    assert!(fake.calls().watches >= 2, "{:?}", fake.calls());
    assert_eq!(run.informer.store().len(), 50);
    let mut names = Vec::new();
    for _ in 0..50 {
        match run.next().await {
            Seen::Add {
                name,
                initial: true,
            } => names.push(name),
            other => panic!("unexpected {other:?}"),
        }
    }
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 50);
    // The 20 objects seen before the tear were re-sent unchanged: no update for them.
    fake.add(labelled_in("ns", "late", "web"));
    assert_eq!(run.next().await, add("late", false));
    run.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_relist_by_stream_removes_vanished_objects_with_tombstones() {
    let fake = Fake::new("configmaps");
    for n in ["a", "b", "c"] {
        fake.add(labelled_in("ns", n, "web"));
    }
    let mut run = Running::start(&fake, |b| b).await;
    assert_eq!(run.next_sorted(3).await, adds(&["a", "b", "c"]));

    // The deletion of b is lost, and its history compacted away: the resumed watch gets 410
    // and the reflector relists, by stream, from the last synced version (which the
    // server's watch cache serves), as client-go does.
    fake.set_broadcast(false);
    fake.delete(Some("ns"), "b");
    fake.compact();
    fake.set_broadcast(true);
    fake.end_watches();

    assert_eq!(
        run.next().await,
        Seen::Delete {
            name: "b".into(),
            tombstone: true
        }
    );
    assert_eq!(run.informer.store().len(), 2);
    let watches = fake.watch_requests();
    let last = watches.last().unwrap();
    assert!(last.send_initial_events);
    assert_ne!(last.resource_version, "");
    assert!(fake.list_requests().is_empty());
    assert!(
        run.errors().iter().any(|e| e.contains("410")),
        "{:?}",
        run.errors()
    );
    run.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_server_that_ignores_streaming_lists_gets_paged_lists() {
    let fake = Fake::new("configmaps");
    fake.set_streaming_lists(false);
    fake.add(labelled_in("ns", "a", "web"));
    let informer = {
        let fake = fake.clone();
        tokio::spawn(async move {
            // An ordinary watch sends its periodic bookmark and no initial events.
            fake.wait_for_calls(|c| c.watches == 1).await;
            fake.bookmark();
        })
    };
    let mut run = Running::start(&fake, |b| b).await;
    informer.await.unwrap();

    assert_eq!(run.next().await, add("a", true));
    assert_eq!(fake.list_requests().len(), 1);
    let watches = fake.watch_requests();
    assert!(watches[0].send_initial_events);
    assert!(watches[1..].iter().all(|w| !w.send_initial_events));
    assert!(
        run.errors()[0].contains("does not stream lists"),
        "{:?}",
        run.errors()
    );
    run.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_server_that_rejects_streaming_lists_gets_paged_lists() {
    let fake = Fake::new("configmaps");
    fake.add(labelled_in("ns", "a", "web"));
    fake.fail_next_watch(Error::from_status(
        status(
            422,
            "Invalid",
            "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
        ),
        Verb::Watch,
        "configmaps",
        Some("ns"),
    ));
    let mut run = Running::start(&fake, |b| b).await;
    assert_eq!(run.next().await, add("a", true));
    assert_eq!(fake.list_requests().len(), 1);
    assert!(
        run.errors()[0].contains("WatchList feature gate"),
        "{:?}",
        run.errors()
    );
    run.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_stream_is_followed_by_a_paged_list_then_streams_again() {
    let fake = Fake::new("configmaps");
    fake.add(labelled_in("ns", "a", "web"));
    fake.fail_next_watch(gone("configmaps", Verb::Watch));
    let mut run = Running::start(&fake, |b| b).await;
    assert_eq!(run.next().await, add("a", true));
    // As client-go: progress by a paged list rather than another streaming attempt.
    assert_eq!(fake.list_requests().len(), 1);
    assert!(fake.watch_requests()[0].send_initial_events);
    // The next full sync streams again: the server does stream.
    fake.set_broadcast(false);
    fake.add(labelled_in("ns", "b", "web"));
    fake.compact();
    fake.set_broadcast(true);
    fake.end_watches();
    assert_eq!(run.next().await, add("b", false));
    assert!(fake.watch_requests().last().unwrap().send_initial_events);
    assert_eq!(fake.list_requests().len(), 1, "no second paged list");
    run.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_compact_cache_reads_back_what_the_watch_delivered() {
    let fake = Fake::new("configmaps");
    for n in ["a", "b", "c"] {
        fake.add(labelled_in("ns", n, "web"));
    }
    let mut run = Running::start(&fake, |b| b.compact().index_fn("app", label_index("app"))).await;
    assert_eq!(run.next_sorted(3).await, adds(&["a", "b", "c"]));

    let store = run.informer.store();
    assert!(store.is_compact());
    assert_eq!(
        *store.get_by_key("ns/a").unwrap(),
        fake.get("ns/a").unwrap()
    );
    assert_eq!(store.by_index("app", "web").unwrap().len(), 3);

    // The old object of an update comes back from the compact form.
    let before = rv(&fake.get("ns/b").unwrap());
    let after = fake.update(labelled_in("ns", "b", "db"));
    assert_eq!(
        run.next().await,
        Seen::Update {
            name: "b".into(),
            old_rv: before,
            new_rv: after
        }
    );
    assert_eq!(store.by_index("app", "web").unwrap().len(), 2);
    assert_eq!(store.by_index("app", "db").unwrap().len(), 1);
    assert_eq!(
        *store.get_by_key("ns/b").unwrap(),
        fake.get("ns/b").unwrap()
    );
    let lister = run.informer.lister();
    assert_eq!(lister.list().len(), 3);
    run.stop().await;
}
