//! Sharded informers on a real API server: with the `ShardedListAndWatch` gate on, the
//! server selects each shard's objects (KEP-5866's `shardSelector`) and says so; with it
//! off, the server sends everything and the informer keeps the shard's objects with the
//! same hash. The caches hold the same objects either way.

use std::collections::BTreeSet;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::{
    Api, Client,
    api::{DeleteParams, ListParams, PostParams},
};
use kube_informer::{
    CancellationToken, InformerFactory, InformerHandle, Scope,
    list_watch::{HashRange, Shard, ShardField, ShardMode},
};
use kube_testenv::TestEnv;
use tests::{config_map, eventually, test_namespace};

const OBJECTS: usize = 300;
const SHARDS: usize = 3;

fn shards() -> Vec<Shard> {
    (0..SHARDS)
        .map(|i| Shard::new(ShardField::Uid, [HashRange::part(i, SHARDS).unwrap()]).unwrap())
        .collect()
}

/// The names of the server's ConfigMaps in `shard`, by the client's hash of their UIDs.
async fn server_shard(api: &Api<ConfigMap>, shard: &Shard) -> BTreeSet<String> {
    let listed = api.list(&ListParams::default()).await.unwrap();
    listed
        .items
        .iter()
        .filter(|cm| shard.contains(*cm))
        .map(|cm| cm.metadata.name.clone().unwrap())
        .collect()
}

fn cached(informer: &InformerHandle<ConfigMap>) -> BTreeSet<String> {
    informer
        .store()
        .list()
        .iter()
        .map(|cm| cm.metadata.name.clone().unwrap())
        .collect()
}

async fn create(api: &Api<ConfigMap>, names: impl Iterator<Item = String>) {
    futures::stream::iter(names)
        .for_each_concurrent(32, |name| async move {
            api.create(&PostParams::default(), &config_map(&name, &[]))
                .await
                .unwrap();
        })
        .await;
}

/// Three shards of 300 ConfigMaps: each cache holds exactly its shard, the three are
/// disjoint and cover the namespace, they follow creates and deletes, and one widened
/// at run time holds its new shard. Returns how
/// the shards were applied and how many objects the informers dropped themselves.
async fn three_shards(client: Client, namespace: &str) -> (Vec<Option<ShardMode>>, u64) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    create(&api, (0..OBJECTS).map(|i| format!("cm-{i:03}"))).await;

    let factory = InformerFactory::new(client);
    let informers: Vec<_> = shards()
        .into_iter()
        .map(|shard| factory.informer::<ConfigMap>(Scope::namespace(namespace).shard(shard)))
        .collect();
    let cancel = CancellationToken::new();
    factory.start(&cancel);
    factory.wait_synced().await.unwrap();

    let mut all = BTreeSet::new();
    for (informer, shard) in informers.iter().zip(shards()) {
        let expected = server_shard(&api, &shard).await;
        assert_eq!(
            cached(informer),
            expected,
            "the cache holds its shard: {shard}"
        );
        assert!(
            expected.len() > OBJECTS / SHARDS / 2,
            "UIDs spread: {}",
            expected.len()
        );
        assert!(all.is_disjoint(&expected), "shards do not overlap");
        all.extend(expected);
    }
    assert_eq!(all.len(), OBJECTS, "the shards cover every object");

    // Changes reach only the shard they belong to.
    create(&api, (0..60).map(|i| format!("new-{i:02}"))).await;
    for i in 0..30 {
        api.delete(&format!("cm-{i:03}"), &DeleteParams::default())
            .await
            .unwrap();
    }
    for (informer, shard) in informers.iter().zip(shards()) {
        let expected = server_shard(&api, &shard).await;
        eventually("the shard's cache follows the server", || {
            cached(informer) == expected
        })
        .await;
    }
    // The first informer takes the second shard too: it relists, and holds both.
    let wider = Shard::new(
        ShardField::Uid,
        [
            HashRange::part(0, SHARDS).unwrap(),
            HashRange::part(1, SHARDS).unwrap(),
        ],
    )
    .unwrap();
    informers[0].reshard(wider.clone()).unwrap();
    let expected = server_shard(&api, &wider).await;
    eventually("the resharded cache holds both shards", || {
        cached(&informers[0]) == expected
    })
    .await;
    let modes = informers
        .iter()
        .map(|i| i.reflector_stats().shard_mode)
        .collect();
    let outside = informers
        .iter()
        .map(|i| i.reflector_stats().outside_shard)
        .sum();
    cancel.cancel();
    factory.shutdown().await;
    (modes, outside)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_with_the_gate_on_the_server_selects_each_shard() {
    let env = TestEnv::builder()
        .apiserver_arg("--feature-gates=ShardedListAndWatch=true")
        .start()
        .await
        .expect("a control plane with the ShardedListAndWatch gate");
    let namespace = env.create_namespace("shard-gate-on").await.unwrap();
    let client = env.client().await.unwrap();
    let (modes, outside) = three_shards(client, &namespace).await;
    assert_eq!(modes, vec![Some(ShardMode::Server); SHARDS]);
    assert_eq!(outside, 0, "the server sent no object from outside a shard");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_with_the_gate_off_the_informer_selects_each_shard() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "shard-gate-off").await;
    let (modes, outside) = three_shards(client, &namespace).await;
    assert_eq!(modes, vec![Some(ShardMode::Client); SHARDS]);
    assert!(
        outside >= (OBJECTS * (SHARDS - 1)) as u64,
        "each informer received the other shards' objects and dropped them: {outside}"
    );
}

/// Waits until every slot of `slots` is held, each replica holding what it is dealt and
/// seeing all of them as members.
async fn ring_settled(rings: &[&kube_informer::sharding::ShardRing], slots: usize) {
    let views = || -> Vec<_> { rings.iter().map(|r| r.view().borrow().clone()).collect() };
    tests::eventually_some_within(
        std::time::Duration::from_secs(60),
        "the ring settled",
        || {
            let views = views();
            async move {
                let held: usize = views.iter().map(|v| v.held.len()).sum();
                let settled = held == slots
                    && views.iter().all(|v| {
                        v.held == v.assigned
                            && v.warming.is_empty()
                            && v.members.len() == rings.len()
                    });
                settled.then_some(())
            }
        },
    )
    .await;
}

mod ring {
    //! The shard ring on real Leases: every slot dealt to exactly one live replica, and
    //! handed over when a replica leaves, dies or joins, never admitted by two at once.

    use std::{
        collections::BTreeSet,
        sync::{Arc, Mutex},
        time::{Duration, Instant},
    };

    use k8s_openapi::api::coordination::v1::Lease;
    use kube_client::{Api, Client};
    use kube_informer::lease::LeaseConfig;
    use kube_informer::{
        CancellationToken,
        sharding::{RingConfig, RingView, ShardRing, dealt_slots, slot_of},
    };
    use kube_testenv::TestEnv;
    use tests::{eventually_some_within, test_namespace};
    use tokio::task::JoinHandle;

    const SLOTS: u16 = 12;
    const LEASE: Duration = Duration::from_secs(3);

    struct Replica {
        ring: Arc<ShardRing>,
        stop: CancellationToken,
        task: JoinHandle<()>,
    }

    fn join(client: &Client, namespace: &str, identity: &str) -> Replica {
        let config = RingConfig::new(
            LeaseConfig::new("test-ring")
                .in_namespace(namespace)
                .with_identity(identity)
                .lease_duration(LEASE)
                .renew_deadline(Duration::from_secs(2))
                .retry_period(Duration::from_millis(300)),
        )
        .slots(SLOTS);
        let ring = Arc::new(ShardRing::new(client.clone(), config).unwrap());
        let stop = CancellationToken::new();
        let task = tokio::spawn({
            let (ring, stop) = (ring.clone(), stop.clone());
            async move { ring.run(stop).await.unwrap() }
        });
        Replica { ring, stop, task }
    }

    fn view(replica: &Replica) -> RingView {
        replica.ring.view().borrow().clone()
    }

    /// Waits until `live` hold every slot between them, each what it is assigned.
    async fn settled(live: &[&Replica], what: &str) {
        eventually_some_within(Duration::from_secs(30), what, || {
            let views: Vec<RingView> = live.iter().map(|r| view(r)).collect();
            async move {
                let all: BTreeSet<u16> = views.iter().flat_map(|v| v.held.clone()).collect();
                let settled = all.len() == usize::from(SLOTS)
                    && views
                        .iter()
                        .all(|v| v.held == v.assigned && v.members.len() == views.len());
                settled.then_some(())
            }
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shard_ring_hands_slots_over_and_never_to_two_replicas_at_once() {
        let env = TestEnv::shared().await;
        let (client, namespace) = test_namespace(env, "shard-ring").await;
        let replicas: Arc<Mutex<Vec<Arc<ShardRing>>>> = Arc::default();
        let overlaps: Arc<Mutex<Vec<String>>> = Arc::default();
        let watching = CancellationToken::new();
        // Every 5 ms: the slots each replica would admit a reconcile on are disjoint.
        let watcher = tokio::spawn({
            let (replicas, overlaps, watching) =
                (replicas.clone(), overlaps.clone(), watching.clone());
            async move {
                while !watching.is_cancelled() {
                    let rings = replicas.lock().unwrap().clone();
                    let admitting: Vec<BTreeSet<u16>> =
                        rings.iter().map(|r| r.admitting()).collect();
                    for (i, a) in admitting.iter().enumerate() {
                        for b in &admitting[i + 1..] {
                            if !a.is_disjoint(b) {
                                overlaps.lock().unwrap().push(format!("{a:?} and {b:?}"));
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        });
        let start = |identity: &str| {
            let replica = join(&client, &namespace, identity);
            replicas.lock().unwrap().push(replica.ring.clone());
            replica
        };
        let (r0, r1, r2) = (start("r0"), start("r1"), start("r2"));
        settled(&[&r0, &r1, &r2], "three replicas split the slots").await;
        let sizes: Vec<usize> = [&r0, &r1, &r2].iter().map(|r| view(r).held.len()).collect();
        assert_eq!(sizes, [4, 4, 4]);

        // A replica that stops lets its slots go: it clears each slot Lease's holder, so
        // the others take them without waiting for them to expire.
        let (held, released_before) = (view(&r2).held.len(), r2.ring.stats().released);
        r2.stop.cancel();
        r2.task.await.unwrap();
        assert_eq!(
            r2.ring.stats().released - released_before,
            held as u64,
            "every slot released at stop, none left to expire"
        );
        settled(&[&r0, &r1], "two replicas take the stopped one's slots").await;

        // A replica that dies (its task aborted mid-term, nothing released) stops
        // admitting at its renew deadline; the other takes its slots once they expire.
        let dying = view(&r1).held;
        let killed = Instant::now();
        r1.task.abort();
        // Before its Leases expire, the survivor sees it silent and caches its slots.
        eventually_some_within(
            Duration::from_secs(30),
            "the dead replica's slots warming",
            || {
                let survivor = view(&r0);
                let warm = survivor.members.len() == 2 && survivor.warming == dying;
                async move { warm.then_some(()) }
            },
        )
        .await;
        assert!(
            view(&r0).shard().is_some_and(|s| s.ranges().len() == 1),
            "the survivor caches the whole space while it warms the dead one's slots"
        );
        settled(&[&r0], "the survivor takes the dead replica's slots").await;
        assert!(view(&r0).warming.is_empty(), "nothing left to warm");
        let handover = killed.elapsed();
        assert!(
            handover >= Duration::from_secs(2),
            "not before the dead one's renew deadline: {handover:?}"
        );

        // A fourth joins: the slots are dealt again between the two live replicas. A
        // reconcile running on r0 keeps its slot (one r3 is dealt) with r0 until it ends;
        // r0 admits no new one on it meanwhile.
        let pair = ["r0".to_owned(), "r3".to_owned()];
        let busy_slot = *dealt_slots(&pair, "r3", SLOTS).first().unwrap();
        let uid = (0u64..)
            .map(|i| format!("{:016x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
            .find(|uid| slot_of(uid, SLOTS) == busy_slot)
            .unwrap();
        let running = r0.ring.admit(&uid).expect("r0 holds every slot");
        let r3 = start("r3");
        eventually_some_within(
            Duration::from_secs(30),
            "r3 takes all of its share but the busy slot",
            || {
                let (v3, busy) = (view(&r3), r0.ring.admitting().contains(&busy_slot));
                async move {
                    let rest: BTreeSet<u16> = v3
                        .assigned
                        .iter()
                        .copied()
                        .filter(|s| *s != busy_slot)
                        .collect();
                    (v3.members.len() == 2 && v3.held == rest && !rest.is_empty() && !busy)
                        .then_some(())
                }
            },
        )
        .await;
        let leases: Api<Lease> = Api::namespaced(client.clone(), &namespace);
        let busy = leases
            .get(&format!("test-ring-slot-{busy_slot}"))
            .await
            .unwrap();
        let holder = busy.spec.and_then(|s| s.holder_identity);
        assert_eq!(
            holder.as_deref(),
            Some("r0"),
            "the busy slot stays with r0 while its reconcile runs"
        );
        assert!(
            r0.ring.admit(&uid).is_none(),
            "r0 admits nothing new on a slot it is letting go"
        );
        drop(running);
        settled(&[&r0, &r3], "the newcomer gets its share").await;
        assert_eq!(
            view(&r0).held.len() + view(&r3).held.len(),
            usize::from(SLOTS)
        );

        watching.cancel();
        watcher.await.unwrap();
        let overlaps = overlaps.lock().unwrap().clone();
        assert!(
            overlaps.is_empty(),
            "two replicas admitted one slot: {overlaps:?}"
        );
        for replica in [r0, r3] {
            replica.stop.cancel();
            replica.task.await.unwrap();
        }
        let _ = r1.stop;
    }
}

mod sharded_controller {
    //! One controller run as three replicas on a shard ring over the real API server:
    //! each ConfigMap is reconciled by the replica that holds its slot, and no key is ever
    //! reconciled by two replicas at once.

    use std::{
        collections::{BTreeMap, BTreeSet},
        sync::{Arc, Mutex},
        time::{Duration, Instant},
    };

    use futures::StreamExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_client::{
        Api,
        api::{Patch, PatchParams},
    };
    use kube_informer::lease::LeaseConfig;
    use kube_informer::{
        Action, CancellationToken, Controller, InformerFactory, ReconcileRequest, Scope,
        retry_with_backoff,
        sharding::{RingConfig, ShardRing},
    };
    use kube_testenv::TestEnv;
    use serde_json::json;
    use tests::{config_map, eventually_some_within, test_namespace};

    const OBJECTS: usize = 300;
    const REPLICAS: usize = 3;

    /// One reconcile: which replica, which key, when it ran.
    #[derive(Clone, Debug)]
    struct Run {
        replica: usize,
        key: String,
        round: Option<String>,
        started: Instant,
        ended: Instant,
    }

    type Log = Arc<Mutex<Vec<Run>>>;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shard_controller_replicas_split_the_objects_and_never_share_a_key() {
        let env = TestEnv::shared().await;
        let (client, namespace) = test_namespace(env, "shard-controller").await;
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
        let objects = (0..OBJECTS)
            .map(|i| config_map(&format!("cm-{i:03}"), &[]))
            .collect();
        tests::create_all(&api, objects).await;

        let log: Log = Arc::default();
        let stop = CancellationToken::new();
        let mut rings = Vec::new();
        let mut tasks = Vec::new();
        for replica in 0..REPLICAS {
            let config = RingConfig::new(
                LeaseConfig::new("sharded")
                    .in_namespace(&namespace)
                    .with_identity(format!("replica-{replica}"))
                    .lease_duration(Duration::from_secs(3))
                    .renew_deadline(Duration::from_secs(2))
                    .retry_period(Duration::from_millis(300)),
            )
            .slots(12);
            let ring = Arc::new(ShardRing::new(client.clone(), config).unwrap());
            let factory = InformerFactory::new(client.clone());
            let controller = Controller::<ConfigMap>::sharded(
                "sharded",
                &factory,
                Scope::namespace(&namespace),
                &ring,
            )
            .workers(2);
            factory.start(&stop);
            let log = log.clone();
            let reconcile = move |request: ReconcileRequest<ConfigMap>, _: Arc<()>| {
                let log = log.clone();
                async move {
                    let started = Instant::now();
                    let round = match &request {
                        ReconcileRequest::Present(cm) => cm
                            .metadata
                            .labels
                            .as_ref()
                            .and_then(|l| l.get("round").cloned()),
                        ReconcileRequest::Deleted { .. } => None,
                    };
                    // Long enough for a handover to land mid-reconcile if it could.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    log.lock().unwrap().push(Run {
                        replica,
                        key: request.key().to_string(),
                        round,
                        started,
                        ended: Instant::now(),
                    });
                    Ok::<_, std::io::Error>(Action::done())
                }
            };
            tasks.push(tokio::spawn(controller.run(
                (reconcile, retry_with_backoff(), Arc::new(())),
                stop.clone(),
            )));
            let ring_task = {
                let (ring, stop) = (ring.clone(), stop.clone());
                tokio::spawn(async move { ring.run(stop).await.unwrap() })
            };
            rings.push((ring, ring_task, factory));
        }

        // Every object reconciled once the ring has dealt every slot.
        let keys: BTreeSet<String> = (0..OBJECTS)
            .map(|i| format!("{namespace}/cm-{i:03}"))
            .collect();
        eventually_some_within(Duration::from_secs(60), "every object reconciled", || {
            let seen: BTreeSet<String> =
                log.lock().unwrap().iter().map(|r| r.key.clone()).collect();
            let done = seen == keys;
            async move { done.then_some(()) }
        })
        .await;
        let all: Vec<&ShardRing> = rings.iter().map(|(ring, ..)| &**ring).collect();
        super::ring_settled(&all, 12).await;

        // An update of every object is reconciled by exactly one replica each.
        futures::stream::iter(0..OBJECTS)
            .for_each_concurrent(32, |i| {
                let api = api.clone();
                async move {
                    let patch = json!({ "metadata": { "labels": { "round": "2" } } });
                    api.patch(
                        &format!("cm-{i:03}"),
                        &PatchParams::default(),
                        &Patch::Merge(patch),
                    )
                    .await
                    .unwrap();
                }
            })
            .await;
        let by_key =
            eventually_some_within(Duration::from_secs(60), "every update reconciled", || {
                let runs = log.lock().unwrap().clone();
                let keys = keys.clone();
                async move {
                    let mut by_key: BTreeMap<String, BTreeSet<usize>> = BTreeMap::new();
                    for run in runs.iter().filter(|r| r.round.as_deref() == Some("2")) {
                        by_key
                            .entry(run.key.clone())
                            .or_default()
                            .insert(run.replica);
                    }
                    (by_key.keys().cloned().collect::<BTreeSet<_>>() == keys).then_some(by_key)
                }
            })
            .await;
        let shared: Vec<_> = by_key
            .iter()
            .filter(|(_, replicas)| replicas.len() > 1)
            .collect();
        assert!(
            shared.is_empty(),
            "an update reconciled by two replicas: {shared:?}"
        );
        let per_replica: Vec<usize> = (0..REPLICAS)
            .map(|r| by_key.values().filter(|set| set.contains(&r)).count())
            .collect();
        assert!(
            per_replica.iter().all(|n| *n > 0),
            "every replica has a share: {per_replica:?}"
        );

        // Over the whole run, no key's reconciles on two replicas overlapped in time.
        let runs = log.lock().unwrap().clone();
        let mut by_key: BTreeMap<&str, Vec<&Run>> = BTreeMap::new();
        for run in &runs {
            by_key.entry(run.key.as_str()).or_default().push(run);
        }
        for (key, runs) in by_key {
            for (i, a) in runs.iter().enumerate() {
                for b in &runs[i + 1..] {
                    let overlap = a.started < b.ended && b.started < a.ended;
                    assert!(
                        !(overlap && a.replica != b.replica),
                        "{key} reconciled by {} and {} at once",
                        a.replica,
                        b.replica
                    );
                }
            }
        }

        stop.cancel();
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        for (_, ring_task, factory) in rings {
            ring_task.await.unwrap();
            factory.shutdown().await;
        }
    }
}

mod owned_children {
    //! A sharded controller's owned children follow their parent: each replica caches the
    //! Secrets whose controller owner is a ConfigMap in its shard, and an adopted child
    //! moves to its new owner's replica.

    use std::{
        collections::{BTreeMap, BTreeSet},
        sync::{Arc, Mutex},
        time::Duration,
    };

    use futures::StreamExt;
    use k8s_openapi::{
        api::core::v1::{ConfigMap, Secret},
        apimachinery::pkg::apis::meta::v1::OwnerReference,
    };
    use kube_client::{
        Api,
        api::{ObjectMeta, Patch, PatchParams, PostParams},
    };
    use kube_informer::lease::LeaseConfig;
    use kube_informer::{
        Action, CancellationToken, Controller, InformerFactory, InformerHandle, ReconcileRequest,
        Scope,
        list_watch::{Shard, ShardField},
        retry_with_backoff,
        sharding::{RingConfig, ShardRing},
    };
    use kube_testenv::TestEnv;
    use serde_json::json;
    use tests::{config_map, eventually, test_namespace};

    const PARENTS: usize = 60;
    const ORPHANS: usize = 5;
    const REPLICAS: usize = 2;
    const SLOTS: u16 = 8;

    struct Replica {
        ring: Arc<ShardRing>,
        parents: InformerHandle<ConfigMap>,
        children: InformerHandle<Secret>,
        factory: InformerFactory,
        controller: tokio::task::JoinHandle<Result<(), kube_informer::Error>>,
        ring_task: tokio::task::JoinHandle<()>,
    }

    fn names<K: kube_client::Resource + Send + Sync + 'static>(
        informer: &InformerHandle<K>,
    ) -> BTreeSet<String> {
        informer
            .store()
            .list()
            .iter()
            .filter_map(|o| o.meta().name.clone())
            .collect()
    }

    fn child(name: &str, owner: Option<(&str, &str)>) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                owner_references: owner.map(|(parent, uid)| {
                    vec![OwnerReference {
                        api_version: "v1".into(),
                        kind: "ConfigMap".into(),
                        name: parent.into(),
                        uid: uid.into(),
                        controller: Some(true),
                        ..OwnerReference::default()
                    }]
                }),
                ..ObjectMeta::default()
            },
            ..Secret::default()
        }
    }

    /// The parent each cached child names.
    fn owners(children: &InformerHandle<Secret>) -> BTreeSet<String> {
        children
            .store()
            .list()
            .iter()
            .flat_map(|s| s.metadata.owner_references.clone().unwrap_or_default())
            .map(|r| r.name)
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shard_owned_children_are_cached_beside_their_parent() {
        let env = TestEnv::shared().await;
        let (client, namespace) = test_namespace(env, "shard-owned").await;
        let parents_api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
        let children_api: Api<Secret> = Api::namespaced(client.clone(), &namespace);
        let uids: BTreeMap<String, String> = futures::stream::iter(0..PARENTS)
            .map(|i| {
                let api = parents_api.clone();
                async move {
                    let name = format!("parent-{i:02}");
                    let created = api
                        .create(&PostParams::default(), &config_map(&name, &[]))
                        .await
                        .unwrap();
                    (name, created.metadata.uid.unwrap())
                }
            })
            .buffer_unordered(16)
            .collect()
            .await;
        for (parent, uid) in &uids {
            let name = parent.replace("parent", "child");
            children_api
                .create(&PostParams::default(), &child(&name, Some((parent, uid))))
                .await
                .unwrap();
        }
        for i in 0..ORPHANS {
            children_api
                .create(&PostParams::default(), &child(&format!("orphan-{i}"), None))
                .await
                .unwrap();
        }

        let stop = CancellationToken::new();
        let reconciled: Arc<Mutex<Vec<(usize, String)>>> = Arc::default();
        let mut replicas = Vec::new();
        for replica in 0..REPLICAS {
            let config = RingConfig::new(
                LeaseConfig::new("owned")
                    .in_namespace(&namespace)
                    .with_identity(format!("replica-{replica}"))
                    .lease_duration(Duration::from_secs(3))
                    .renew_deadline(Duration::from_secs(2))
                    .retry_period(Duration::from_millis(300)),
            )
            .slots(SLOTS);
            let ring = Arc::new(ShardRing::new(client.clone(), config).unwrap());
            let factory = InformerFactory::new(client.clone());
            let scope = Scope::namespace(&namespace);
            let children = factory.informer::<Secret>(
                scope
                    .clone()
                    .shard(Shard::everything(ShardField::ControllerUid)),
            );
            let controller = Controller::<ConfigMap>::sharded("owned", &factory, scope, &ring)
                .owns(children.clone());
            let parents = controller.informer();
            factory.start(&stop);
            let log = reconciled.clone();
            let reconcile = move |request: ReconcileRequest<ConfigMap>, _: Arc<()>| {
                log.lock()
                    .unwrap()
                    .push((replica, request.key().to_string()));
                std::future::ready(Ok::<_, std::io::Error>(Action::done()))
            };
            let controller = tokio::spawn(controller.run(
                (reconcile, retry_with_backoff(), Arc::new(())),
                stop.clone(),
            ));
            let ring_task = {
                let (ring, stop) = (ring.clone(), stop.clone());
                tokio::spawn(async move { ring.run(stop).await.unwrap() })
            };
            replicas.push(Replica {
                ring,
                parents,
                children,
                factory,
                controller,
                ring_task,
            });
        }

        let rings: Vec<&ShardRing> = replicas.iter().map(|r| &*r.ring).collect();
        super::ring_settled(&rings, SLOTS.into()).await;
        // Each replica caches the children of the parents it caches, and no orphan.
        let all_parents: BTreeSet<String> = uids.keys().cloned().collect();
        eventually("children cached beside their parents", || {
            let shares: Vec<BTreeSet<String>> =
                replicas.iter().map(|r| names(&r.parents)).collect();
            // Each cache has left the whole space it started on for its share.
            shares[0].is_disjoint(&shares[1])
                && replicas
                    .iter()
                    .all(|r| owners(&r.children) == names(&r.parents))
                && replicas
                    .iter()
                    .map(|r| names(&r.parents))
                    .fold(BTreeSet::new(), |all, n| &all | &n)
                    == all_parents
        })
        .await;
        for replica in &replicas {
            let cached = names(&replica.children);
            assert!(
                cached.len() < PARENTS,
                "a share of the children: {}",
                cached.len()
            );
            assert!(
                !cached.iter().any(|n| n.starts_with("orphan")),
                "no orphan cached"
            );
        }

        // A change to every child reconciles its parent on the parent's replica alone.
        reconciled.lock().unwrap().clear();
        for parent in uids.keys() {
            let patch = json!({ "metadata": { "labels": { "touched": "yes" } } });
            children_api
                .patch(
                    &parent.replace("parent", "child"),
                    &PatchParams::default(),
                    &Patch::Merge(patch),
                )
                .await
                .unwrap();
        }
        let parents_of: Vec<BTreeSet<String>> = replicas
            .iter()
            .map(|r| {
                names(&r.parents)
                    .into_iter()
                    .map(|n| format!("{namespace}/{n}"))
                    .collect()
            })
            .collect();
        eventually("every parent reconciled for its child", || {
            let log = reconciled.lock().unwrap();
            log.iter()
                .map(|(_, k)| k.clone())
                .collect::<BTreeSet<_>>()
                .len()
                == PARENTS
        })
        .await;
        for (replica, key) in reconciled.lock().unwrap().iter() {
            assert!(
                parents_of[*replica].contains(key),
                "{key} reconciled by replica {replica}, which does not hold it"
            );
        }

        // Adoption: a child given a parent on the other replica moves there.
        let (from, to) = (&replicas[0], &replicas[1]);
        let moved = names(&from.parents).into_iter().next().unwrap();
        let new_parent = names(&to.parents).into_iter().next().unwrap();
        let moved_child = moved.replace("parent", "child");
        let mut adopted = child(&moved_child, Some((&new_parent, &uids[&new_parent])));
        adopted.metadata.resource_version = children_api
            .get(&moved_child)
            .await
            .unwrap()
            .metadata
            .resource_version;
        children_api
            .replace(&moved_child, &PostParams::default(), &adopted)
            .await
            .unwrap();
        eventually(
            "the adopted child moved to its new parent's replica",
            || {
                !names(&from.children).contains(&moved_child)
                    && names(&to.children).contains(&moved_child)
            },
        )
        .await;

        stop.cancel();
        for replica in replicas {
            replica.controller.await.unwrap().unwrap();
            replica.ring_task.await.unwrap();
            replica.factory.shutdown().await;
        }
    }
}

mod managed {
    //! Leader election and sharding are alternatives per controller: of two managers with
    //! leader election, both run their sharded controller (each on its share), and only
    //! the leader runs the other one.

    use std::{
        collections::BTreeSet,
        sync::{Arc, Mutex},
        time::Duration,
    };

    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    use kube_client::{
        Api,
        api::{ObjectMeta, PostParams},
    };
    use kube_informer::lease::LeaseConfig;
    use kube_informer::{
        Action, CancellationToken, Manager, ReconcileRequest, Scope,
        leader_election::LeaderElectionConfig, retry_with_backoff, sharding::RingConfig,
    };
    use kube_testenv::TestEnv;
    use tests::{config_map, eventually, test_namespace};

    const OBJECTS: usize = 40;

    type Log = Arc<Mutex<Vec<(&'static str, String)>>>;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shard_controllers_run_on_every_replica_beside_a_leader_only_one() {
        let env = TestEnv::shared().await;
        let (client, namespace) = test_namespace(env, "shard-managed").await;
        let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
        let objects = (0..OBJECTS)
            .map(|i| config_map(&format!("cm-{i:02}"), &[]))
            .collect();
        tests::create_all(&config_maps, objects).await;
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some("leader-only".into()),
                ..ObjectMeta::default()
            },
            ..Secret::default()
        };
        Api::<Secret>::namespaced(client.clone(), &namespace)
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();

        let sharded: Log = Arc::default();
        let leading: Log = Arc::default();
        let stop = CancellationToken::new();
        let mut runs = Vec::new();
        for identity in ["first", "second"] {
            let election = LeaderElectionConfig::new(
                LeaseConfig::new("managers")
                    .in_namespace(&namespace)
                    .with_identity(identity)
                    .timing(
                        Duration::from_secs(4),
                        Duration::from_secs(2),
                        Duration::from_millis(500),
                    ),
            );
            let mut manager = Manager::new(client.clone())
                .probe_address(None)
                .metrics_address(None)
                .leader_election(election);
            let ring = manager
                .shard_ring(
                    RingConfig::new(
                        LeaseConfig::new("managed")
                            .in_namespace(&namespace)
                            .with_identity(identity)
                            .lease_duration(Duration::from_secs(3))
                            .renew_deadline(Duration::from_secs(2))
                            .retry_period(Duration::from_millis(300)),
                    )
                    .slots(8),
                )
                .unwrap();
            let scope = Scope::namespace(&namespace);
            let controller =
                manager.sharded_controller::<ConfigMap>("sharded", scope.clone(), &ring);
            let log = sharded.clone();
            let reconcile = move |request: ReconcileRequest<ConfigMap>, _: Arc<()>| {
                log.lock()
                    .unwrap()
                    .push((identity, request.key().to_string()));
                std::future::ready(Ok::<_, std::io::Error>(Action::done()))
            };
            manager.add_controller(controller, (reconcile, retry_with_backoff(), Arc::new(())));
            let controller = manager.controller::<Secret>("leader-only", scope);
            let log = leading.clone();
            let reconcile = move |request: ReconcileRequest<Secret>, _: Arc<()>| {
                log.lock()
                    .unwrap()
                    .push((identity, request.key().to_string()));
                std::future::ready(Ok::<_, std::io::Error>(Action::done()))
            };
            manager.add_controller(controller, (reconcile, retry_with_backoff(), Arc::new(())));
            let bound = manager.bind().await.unwrap();
            runs.push(tokio::spawn(bound.run(stop.clone())));
        }

        let keys: BTreeSet<String> = (0..OBJECTS)
            .map(|i| format!("{namespace}/cm-{i:02}"))
            .collect();
        eventually(
            "both replicas reconcile their share of every ConfigMap",
            || {
                let log = sharded.lock().unwrap();
                let seen: BTreeSet<String> = log.iter().map(|(_, k)| k.clone()).collect();
                let replicas: BTreeSet<&str> = log.iter().map(|(r, _)| *r).collect();
                seen == keys && replicas.len() == 2
            },
        )
        .await;
        eventually("the leader reconciles the Secret", || {
            !leading.lock().unwrap().is_empty()
        })
        .await;
        let leaders: BTreeSet<&str> = leading.lock().unwrap().iter().map(|(r, _)| *r).collect();
        assert_eq!(
            leaders.len(),
            1,
            "only the leader runs the other controller: {leaders:?}"
        );

        stop.cancel();
        for run in runs {
            tokio::time::timeout(Duration::from_secs(60), run)
                .await
                .expect("the manager stops")
                .unwrap()
                .unwrap();
        }
    }
}

mod lapsed_renewals {
    //! A replica whose slot renewals lapse (its API calls slowed by Toxiproxy) refuses
    //! reconciles while it cannot renew, without letting the slot go; each change it
    //! refused then is reconciled once a renewal goes through. The test waits for the lapse
    //! and makes its changes inside it, so the window is hit every run.

    use std::{
        collections::BTreeMap,
        sync::{Arc, Mutex},
        time::Duration,
    };

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_client::{
        Api,
        api::{Patch, PatchParams},
    };
    use kube_informer::lease::LeaseConfig;
    use kube_informer::{
        Action, CancellationToken, Controller, InformerFactory, ReconcileRequest, Scope,
        retry_with_backoff,
        sharding::{RingConfig, ShardRing},
    };
    use kube_testenv::{FaultProxy, TestEnv};
    use serde_json::json;
    use tests::{config_map, eventually, eventually_some_within, test_namespace};

    const OBJECTS: usize = 10;
    const RENEW_DEADLINE: Duration = Duration::from_secs(2);
    /// Added to every answer the ring gets: a round (the member Lease read and written,
    /// then the slot's renewal) takes three of them, longer than the renew deadline.
    const LATENCY: Duration = Duration::from_millis(1_500);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shard_changes_refused_while_renewals_lapse_are_reconciled_once_renewed() {
        let env = TestEnv::shared().await;
        let (client, namespace) = test_namespace(env, "shard-lapse").await;
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
        let objects = (0..OBJECTS)
            .map(|i| config_map(&format!("cm-{i}"), &[]))
            .collect();
        tests::create_all(&api, objects).await;

        // The ring's Leases through the proxy; the informer straight to the API server.
        let proxy = FaultProxy::for_apiserver(env).await.unwrap();
        let ring_client = env.client_via(&proxy).await.unwrap();
        let config = RingConfig::new(
            LeaseConfig::new("lapsing")
                .in_namespace(&namespace)
                .with_identity("only")
                .lease_duration(Duration::from_secs(30))
                .renew_deadline(RENEW_DEADLINE)
                .retry_period(Duration::from_millis(200)),
        )
        .slots(1);
        let ring = Arc::new(ShardRing::new(ring_client, config).unwrap());
        let stop = CancellationToken::new();
        let factory = InformerFactory::new(client.clone());
        let controller = Controller::<ConfigMap>::sharded(
            "lapsing",
            &factory,
            Scope::namespace(&namespace),
            &ring,
        );
        let stats = controller.stats();
        factory.start(&stop);
        let latest: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
        let reconcile = {
            let latest = latest.clone();
            move |request: ReconcileRequest<ConfigMap>, _: Arc<()>| {
                let latest = latest.clone();
                async move {
                    if let ReconcileRequest::Present(cm) = &request {
                        let round = cm.metadata.labels.as_ref().and_then(|l| l.get("round"));
                        let round = round.cloned().unwrap_or_default();
                        latest
                            .lock()
                            .unwrap()
                            .insert(request.key().name().to_owned(), round);
                    }
                    Ok::<_, std::io::Error>(Action::done())
                }
            }
        };
        let controller = tokio::spawn(controller.run(
            (reconcile, retry_with_backoff(), Arc::new(())),
            stop.clone(),
        ));
        let ring_task = tokio::spawn({
            let (ring, stop) = (ring.clone(), stop.clone());
            async move { ring.run(stop).await.unwrap() }
        });
        eventually("every object reconciled", || {
            latest.lock().unwrap().len() == OBJECTS
        })
        .await;

        proxy.latency(LATENCY, Duration::ZERO).await.unwrap();
        // Each round a change is made while the slot, still held, admits nothing, until
        // three have been held back.
        let started = stats.read().held_back;
        let mut changed: BTreeMap<String, String> = BTreeMap::new();
        let mut round = 0;
        while stats.read().held_back - started < 3 {
            round += 1;
            assert!(round <= 20, "no lapse in {round} rounds");
            eventually_some_within(Duration::from_secs(30), "the slot's renewals lapse", || {
                let lapsed = ring.admitting().is_empty();
                async move { lapsed.then_some(()) }
            })
            .await;
            assert_eq!(ring.view().borrow().held.len(), 1, "held through the lapse");
            let name = format!("cm-{}", round % OBJECTS);
            let patch = json!({ "metadata": { "labels": { "round": round.to_string() } } });
            api.patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .unwrap();
            changed.insert(name, round.to_string());
            // Refused, or admitted if the lapse ended first: either way, on to the next.
            let before = stats.read().held_back;
            let _ = tokio::time::timeout(LATENCY * 4, async {
                while stats.read().held_back == before && ring.admitting().is_empty() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
            .await;
        }
        proxy.clear().await.unwrap();
        eventually_some_within(
            Duration::from_secs(30),
            "every change refused during a lapse reconciled",
            || {
                let latest = latest.lock().unwrap().clone();
                let done = changed
                    .iter()
                    .all(|(name, round)| latest.get(name) == Some(round));
                async move { done.then_some(()) }
            },
        )
        .await;

        stop.cancel();
        controller.await.unwrap().unwrap();
        ring_task.await.unwrap();
        factory.shutdown().await;
    }
}

mod handover_deletions {
    //! A replica joins while its informer cannot reach the API server (a Toxiproxy cut
    //! in front of it alone): the slots dealt to it stay with the replica that holds them,
    //! which keeps reconciling them, deletions included, until the newcomer's cache
    //! follows them. Objects are deleted inside that window every run, so a handover that
    //! let the slots go first would lose their deletions: the newcomer's list cannot
    //! show them.
    //!
    //! A holder cut off for a Lease duration cannot hand over: it loses its slots by
    //! expiry, and what was deleted before the survivor listed them is in no cache but
    //! the old holder's, once it reconnects. It forwards those deletions to the slots'
    //! new holders through its member Lease.

    use std::{
        collections::{BTreeMap, BTreeSet},
        sync::{Arc, Mutex},
        time::{Duration, Instant},
    };

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_client::{
        Api, Client,
        api::{DeleteParams, ListParams},
    };
    use kube_informer::lease::LeaseConfig;
    use kube_informer::{
        Action, CancellationToken, Controller, InformerFactory, ReconcileRequest, Scope,
        retry_with_backoff,
        sharding::{COVERAGE_ANNOTATION, RingConfig, ShardRing, dealt_slots, slot_of},
    };
    use kube_testenv::{FaultProxy, TestEnv};
    use tests::{config_map, eventually, eventually_some_within, test_namespace};
    use tokio::task::JoinHandle;

    const OBJECTS: usize = 40;
    const SLOTS: u16 = 4;

    /// One reconcile: by which replica, of which key, whether the object was gone.
    #[derive(Clone, Debug)]
    struct Reconciled {
        replica: &'static str,
        key: String,
        deleted: bool,
        started: Instant,
        ended: Instant,
    }

    type Log = Arc<Mutex<Vec<Reconciled>>>;

    struct Replica {
        ring: Arc<ShardRing>,
        stop: CancellationToken,
        tasks: Vec<JoinHandle<()>>,
        factory: InformerFactory,
    }

    /// The ring's Lease timings: `lease_duration` and `renew_deadline`, renewed every
    /// 200 ms.
    fn ring_config(
        namespace: &str,
        identity: &str,
        (lease_duration, renew_deadline): (Duration, Duration),
    ) -> RingConfig {
        RingConfig::new(
            LeaseConfig::new("handover")
                .in_namespace(namespace)
                .with_identity(identity)
                .lease_duration(lease_duration)
                .renew_deadline(renew_deadline)
                .retry_period(Duration::from_millis(200)),
        )
        .slots(SLOTS)
    }

    /// Timings under which no slot is lost by expiry while a test runs.
    const STEADY: (Duration, Duration) = (Duration::from_secs(30), Duration::from_secs(20));

    /// A replica whose ring talks to the API server through `ring_client` and whose
    /// informer uses `informer_client`.
    fn replica(
        identity: &'static str,
        ring_client: &Client,
        informer_client: Client,
        namespace: &str,
        log: &Log,
        timings: (Duration, Duration),
    ) -> Replica {
        let config = ring_config(namespace, identity, timings);
        let ring = Arc::new(ShardRing::new(ring_client.clone(), config).unwrap());
        let stop = CancellationToken::new();
        let factory = InformerFactory::new(informer_client);
        // b's cache cannot sync while it is cut off: its controller waits.
        let controller = Controller::<ConfigMap>::sharded(
            "handover",
            &factory,
            Scope::namespace(namespace),
            &ring,
        )
        .startup_grace(Duration::from_secs(300));
        factory.start(&stop);
        let log = log.clone();
        let reconcile = move |request: ReconcileRequest<ConfigMap>, _: Arc<()>| {
            let log = log.clone();
            async move {
                let started = Instant::now();
                tokio::time::sleep(Duration::from_millis(2)).await;
                log.lock().unwrap().push(Reconciled {
                    replica: identity,
                    key: request.key().name().to_owned(),
                    deleted: matches!(request, ReconcileRequest::Deleted { .. }),
                    started,
                    ended: Instant::now(),
                });
                Ok::<_, std::io::Error>(Action::done())
            }
        };
        let controller = tokio::spawn({
            let stop = stop.clone();
            async move {
                controller
                    .run((reconcile, retry_with_backoff(), Arc::new(())), stop)
                    .await
                    .unwrap()
            }
        });
        let ring_task = tokio::spawn({
            let (ring, stop) = (ring.clone(), stop.clone());
            async move { ring.run(stop).await.unwrap() }
        });
        Replica {
            ring,
            stop,
            tasks: vec![controller, ring_task],
            factory,
        }
    }

    impl Replica {
        async fn stop(self) {
            self.stop.cancel();
            for task in self.tasks {
                task.await.unwrap();
            }
            self.factory.shutdown().await;
        }
    }

    fn deletions(log: &Log) -> BTreeMap<String, &'static str> {
        log.lock()
            .unwrap()
            .iter()
            .filter(|r| r.deleted)
            .map(|r| (r.key.clone(), r.replica))
            .collect()
    }

    /// Creates the test's objects; each one's slot, by name.
    async fn create_objects(api: &Api<ConfigMap>) -> BTreeMap<String, u16> {
        let objects = (0..OBJECTS)
            .map(|i| config_map(&format!("cm-{i}"), &[]))
            .collect();
        tests::create_all(api, objects).await;
        api.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|cm| {
                let slot = slot_of(cm.metadata.uid.as_deref().unwrap(), SLOTS);
                (cm.metadata.name.unwrap(), slot)
            })
            .collect()
    }

    async fn delete(api: &Api<ConfigMap>, names: &BTreeSet<String>) {
        for name in names {
            api.delete(name, &DeleteParams::default()).await.unwrap();
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shard_deletions_while_a_slot_is_handed_over_are_reconciled() {
        let env = TestEnv::shared().await;
        let (client, namespace) = test_namespace(env, "shard-handover").await;
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
        let slots = create_objects(&api).await;
        let log: Log = Arc::default();

        let a = replica("a", &client, client.clone(), &namespace, &log, STEADY);
        eventually("a to reconcile every object", || {
            log.lock().unwrap().len() >= OBJECTS
        })
        .await;

        // b joins with its informer cut off: its ring deals it slots, its cache follows none.
        let proxy = FaultProxy::for_apiserver(env).await.unwrap();
        proxy.cut().await.unwrap();
        let b_client = env.client_via(&proxy).await.unwrap();
        let b = replica("b", &client, b_client, &namespace, &log, STEADY);
        let dealt_to_b =
            eventually_some_within(Duration::from_secs(30), "b to be dealt slots", || {
                let (a_view, b_view) = (
                    a.ring.view().borrow().clone(),
                    b.ring.view().borrow().clone(),
                );
                async move {
                    let agreed = a_view.members.len() == 2
                        && b_view.members.len() == 2
                        && !b_view.assigned.is_empty()
                        && a_view.assigned.is_disjoint(&b_view.assigned);
                    agreed.then_some(b_view.assigned)
                }
            })
            .await;
        // a has looked at the ring with b in it (it deals b those slots): it still holds
        // them, as b follows none.
        let a_view = a.ring.view().borrow().clone();
        assert!(
            dealt_to_b.is_subset(&a_view.held),
            "a let b's slots {dealt_to_b:?} go before b's cache followed them: a holds {:?}",
            a_view.held
        );
        let b_lease = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
            client.clone(),
            &namespace,
        )
        .get("handover-member-b")
        .await
        .unwrap();
        let said = b_lease.metadata.annotations.unwrap_or_default();
        assert!(
            said.get(COVERAGE_ANNOTATION)
                .is_some_and(|c| c.ends_with("slots=")),
            "b says it follows nothing: {said:?}"
        );

        // Deleted while b cannot see them: a, still their slots' holder, reconciles them.
        let in_b_slots: BTreeSet<String> = slots
            .iter()
            .filter(|(_, slot)| dealt_to_b.contains(slot))
            .map(|(name, _)| name.clone())
            .collect();
        assert!(
            !in_b_slots.is_empty(),
            "no object in b's slots {dealt_to_b:?}"
        );
        let first: BTreeSet<String> = in_b_slots.iter().step_by(2).cloned().collect();
        delete(&api, &first).await;
        eventually("a to reconcile the deletions in b's slots", || {
            let deleted = deletions(&log);
            first.iter().all(|name| deleted.get(name) == Some(&"a"))
        })
        .await;

        // b's cache comes back: a hands the slots over, b takes them.
        proxy.restore().await.unwrap();
        eventually_some_within(Duration::from_secs(60), "b to take its slots", || {
            let (a_view, b_view) = (
                a.ring.view().borrow().clone(),
                b.ring.view().borrow().clone(),
            );
            let settled = b_view.held == dealt_to_b && a_view.held.is_disjoint(&dealt_to_b);
            async move { settled.then_some(()) }
        })
        .await;
        let rest: BTreeSet<String> = in_b_slots.difference(&first).cloned().collect();
        delete(&api, &rest).await;
        eventually("b to reconcile the deletions in its slots", || {
            let deleted = deletions(&log);
            rest.iter().all(|name| deleted.get(name) == Some(&"b"))
        })
        .await;

        // One replica at a time on each key, throughout.
        let mut by_key: BTreeMap<String, Vec<Reconciled>> = BTreeMap::new();
        for r in log.lock().unwrap().iter() {
            by_key.entry(r.key.clone()).or_default().push(r.clone());
        }
        for (key, mut spans) in by_key {
            spans.sort_by_key(|r| r.started);
            for pair in spans.windows(2) {
                assert!(
                    pair[1].started >= pair[0].ended,
                    "{key} reconciled by {} and {} at once",
                    pair[0].replica,
                    pair[1].replica
                );
            }
        }
        b.stop().await;
        a.stop().await;
    }

    /// Lease timings short enough to lose slots by expiry within a test, long enough that
    /// the deletions below are done before the survivor warms the lost slots.
    const LOSABLE: (Duration, Duration) = (Duration::from_secs(12), Duration::from_secs(8));

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shard_deletions_a_cut_off_holder_missed_are_forwarded_to_the_new_holder() {
        let env = TestEnv::shared().await;
        let (client, namespace) = test_namespace(env, "shard-forward").await;
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
        let slots = create_objects(&api).await;
        let members = |names: &[&str]| names.iter().map(|&n| n.to_owned()).collect::<Vec<_>>();
        // A newcomer whose joining moves slots of a's elsewhere, and those slots (a
        // deletion there that a misses is in nobody's cache but a's once a catches up).
        let (c_name, moving) = ["c", "d", "e", "f", "g", "h"]
            .into_iter()
            .find_map(|newcomer| {
                let moving: BTreeSet<u16> = dealt_slots(&members(&["a", "b"]), "a", SLOTS)
                    .difference(&dealt_slots(&members(&["a", "b", newcomer]), "a", SLOTS))
                    .copied()
                    .collect();
                (!moving.is_empty()).then_some((newcomer, moving))
            })
            .expect("some newcomer takes a slot of a's");
        let doomed: BTreeSet<String> = slots
            .iter()
            .filter(|(_, slot)| moving.contains(slot))
            .map(|(name, _)| name.clone())
            .collect();
        assert!(!doomed.is_empty(), "no object in the slots {moving:?}");
        let log: Log = Arc::default();

        // a reaches the API server, ring and informer, through a proxy; b directly.
        let proxy = FaultProxy::for_apiserver(env).await.unwrap();
        let a_client = env.client_via(&proxy).await.unwrap();
        let a = replica("a", &a_client, a_client.clone(), &namespace, &log, LOSABLE);
        let b = replica("b", &client, client.clone(), &namespace, &log, LOSABLE);
        eventually("a and b to hold the slots dealt to them", || {
            let a_held = a.ring.view().borrow().held.clone();
            let b_held = b.ring.view().borrow().held.clone();
            a_held == dealt_slots(&members(&["a", "b"]), "a", SLOTS)
                && b_held == dealt_slots(&members(&["a", "b"]), "b", SLOTS)
        })
        .await;
        eventually("every object to be reconciled", || {
            let reconciled: BTreeSet<String> =
                log.lock().unwrap().iter().map(|r| r.key.clone()).collect();
            reconciled.len() == OBJECTS
        })
        .await;

        // a is cut off; the objects go while nobody but a caches their slots, and a
        // cannot see them go.
        proxy.cut().await.unwrap();
        delete(&api, &doomed).await;
        let b_view = b.ring.view().borrow().clone();
        assert!(
            b_view.held.is_disjoint(&moving) && b_view.warming.is_disjoint(&moving),
            "b cached {moving:?} before the deletions were done (holds {:?}, warms {:?}): \
             the window this test drives was missed",
            b_view.held,
            b_view.warming
        );

        // a's Leases expire; b takes every slot, then the newcomer joins and takes its share.
        eventually_some_within(Duration::from_secs(90), "b to take a's slots", || {
            let held = b.ring.view().borrow().held.len();
            async move { (held == usize::from(SLOTS)).then_some(()) }
        })
        .await;
        let c = replica(c_name, &client, client.clone(), &namespace, &log, LOSABLE);
        eventually_some_within(
            Duration::from_secs(60),
            "the newcomer to take its share",
            || {
                let held = c.ring.view().borrow().held.clone();
                let dealt = dealt_slots(&members(&["b", c_name]), c_name, SLOTS);
                async move { (held == dealt).then_some(()) }
            },
        )
        .await;
        let deleted = deletions(&log);
        assert!(
            doomed.iter().all(|name| !deleted.contains_key(name)),
            "a deletion nobody could see was reconciled: {deleted:?}"
        );

        // a comes back: it sees the deletions in slots it no longer holds and forwards
        // them; their holders reconcile them.
        proxy.restore().await.unwrap();
        let dealt = |member: &str| dealt_slots(&members(&["a", "b", c_name]), member, SLOTS);
        eventually_some_within(
            Duration::from_secs(120),
            "the deletions a missed to be reconciled by their slots' holders",
            || {
                let deleted = deletions(&log);
                let all = doomed.iter().all(|name| {
                    let holder = deleted.get(name).copied();
                    holder.is_some_and(|holder| dealt(holder).contains(&slots[name]))
                });
                async move { all.then_some(()) }
            },
        )
        .await;
        eventually_some_within(
            Duration::from_secs(60),
            "a to owe nothing once the holders follow its lost slots",
            || {
                let owed = a.ring.view().borrow().owed.clone();
                async move { owed.is_empty().then_some(()) }
            },
        )
        .await;
        c.stop().await;
        b.stop().await;
        a.stop().await;
    }
}
