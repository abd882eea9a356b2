//! A controller's reads of its own writes, on a real API server: the reconcile that
//! follows a write (the next of a burst of updates to the parent, the child's own event,
//! an immediate requeue) reads the cache through the controller's client, which waits
//! until the cache has observed the write. Each case runs with the default
//! ([`OwnWrites::Awaited`]) and, to show what it prevents, with [`OwnWrites::Ignored`].

use std::{
    collections::{BTreeMap, HashSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::{
    api::core::v1::{ConfigMap, Secret},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
};
use kube_client::{
    Api, Client,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use kube_informer::{
    Action, CancellationToken, ClientError, Controller, ControllerClient, InformerFactory,
    ObjectKey, ReconcileRequest, Scope, controller::OwnWrites, retry_with_backoff,
};
use kube_testenv::TestEnv;
use serde_json::json;
use tests::{eventually_some_within, test_namespace};
use traefik_operator::crd::TraefikService;

mod traefik_support;

/// Parents per case.
const PARENTS: usize = 1000;
/// Requests in flight while the test sets up and drives the parents.
const IN_FLIGHT: usize = 32;
/// Long enough for 1,000 parents' reconciles on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(180);
const CHILD_LABEL: &str = "own-write/child";

/// What the reconciles did.
#[derive(Default)]
struct Tally {
    creates: AtomicU64,
    already_exists: AtomicU64,
    status_writes: AtomicU64,
    conflicts: AtomicU64,
    /// Parents reconciled in their final state.
    finished: Mutex<HashSet<String>>,
}

impl Tally {
    fn finished(&self) -> usize {
        self.finished.lock().unwrap().len()
    }

    fn finish(&self, name: &str) {
        self.finished.lock().unwrap().insert(name.to_owned());
    }
}

struct Ctx {
    client: ControllerClient,
    tally: Tally,
}

/// Counts a write's outcome: a 409 is what reading a stale cache costs.
fn counted<T>(
    result: Result<T, ClientError>,
    ok: &AtomicU64,
    conflict: &AtomicU64,
) -> Result<T, ClientError> {
    match &result {
        Ok(_) => ok.fetch_add(1, Ordering::Relaxed),
        Err(error) if error.status_code() == Some(409) => conflict.fetch_add(1, Ordering::Relaxed),
        Err(_) => 0,
    };
    result
}

fn child_of(parent: &Secret) -> ConfigMap {
    let name = parent.metadata.name.clone().unwrap();
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(format!("{name}-child")),
            namespace: parent.metadata.namespace.clone(),
            labels: Some(BTreeMap::from([(CHILD_LABEL.to_owned(), "yes".to_owned())])),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Secret".into(),
                name,
                uid: parent.metadata.uid.clone().unwrap(),
                controller: Some(true),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("parent".to_owned(), "yes".to_owned())])),
        ..ConfigMap::default()
    }
}

/// Creates the parent's child when the cache holds none.
async fn ensure_child(
    request: ReconcileRequest<Secret>,
    ctx: Arc<Ctx>,
) -> Result<Action, ClientError> {
    let ReconcileRequest::Present(parent) = request else {
        return Ok(Action::done());
    };
    let child = child_of(&parent);
    let key = ObjectKey::from_object(&child).unwrap();
    if ctx.client.get::<ConfigMap>(&key).await?.is_none() {
        let tally = &ctx.tally;
        counted(
            ctx.client.create(&child).await,
            &tally.creates,
            &tally.already_exists,
        )?;
    }
    let round = parent
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("round"));
    if round.map(String::as_str) == Some("final") {
        ctx.tally.finish(parent.metadata.name.as_deref().unwrap());
    }
    Ok(Action::done())
}

async fn create_parents(client: &Client, namespace: &str) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    futures::stream::iter(0..PARENTS)
        .for_each_concurrent(IN_FLIGHT, |i| {
            let secrets = secrets.clone();
            async move {
                let parent = Secret {
                    metadata: ObjectMeta {
                        name: Some(format!("p-{i:04}")),
                        ..ObjectMeta::default()
                    },
                    ..Secret::default()
                };
                secrets
                    .create(&PostParams::default(), &parent)
                    .await
                    .unwrap();
            }
        })
        .await;
}

/// Each parent gets three annotation updates back to back, then a final one: a burst
/// that enqueues it again while its reconcile writes the child.
async fn burst_of_updates(client: &Client, namespace: &str) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    futures::stream::iter(0..PARENTS)
        .for_each_concurrent(IN_FLIGHT, |i| {
            let secrets = secrets.clone();
            async move {
                for round in ["1", "2", "3", "final"] {
                    let patch = json!({ "metadata": { "annotations": { "round": round } } });
                    secrets
                        .patch(
                            &format!("p-{i:04}"),
                            &PatchParams::default(),
                            &Patch::Merge(patch),
                        )
                        .await
                        .unwrap();
                }
            }
        })
        .await;
}

/// Runs the child-creating controller over 1,000 parents while their updates arrive;
/// returns its tally and how many reads waited.
async fn children_case(own_writes: OwnWrites, prefix: &str) -> (Arc<Ctx>, u64) {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, prefix).await;
    create_parents(&client, &namespace).await;

    let factory = InformerFactory::new(client.clone());
    let parents = factory.informer::<Secret>(Scope::namespace(&namespace));
    let children = factory
        .informer::<ConfigMap>(Scope::namespace(&namespace).labels(format!("{CHILD_LABEL}=yes")));
    let controller = Controller::new("own-write-children", parents)
        .owns(children)
        .workers(8)
        .own_writes(own_writes);
    let ctx = Arc::new(Ctx {
        client: controller.client(client.clone()),
        tally: Tally::default(),
    });
    let stats = controller.own_write_stats();
    let cancel = CancellationToken::new();
    factory.start(&cancel);
    let run = tokio::spawn(controller.run(
        (ensure_child, retry_with_backoff(), ctx.clone()),
        cancel.clone(),
    ));
    burst_of_updates(&client, &namespace).await;
    eventually_some_within(
        PATIENCE,
        "every parent reconciled in its final state",
        || {
            let finished = ctx.tally.finished();
            async move { (finished == PARENTS).then_some(()) }
        },
    )
    .await;
    cancel.cancel();
    run.await.unwrap().unwrap();

    let children: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let listed = children
        .list(&ListParams::default().labels(&format!("{CHILD_LABEL}=yes")))
        .await
        .unwrap();
    assert_eq!(
        listed.items.len(),
        PARENTS,
        "one child per parent on the server"
    );
    assert_eq!(ctx.tally.creates.load(Ordering::Relaxed), PARENTS as u64);
    eprintln!(
        "{own_writes:?}: {} creates, {} AlreadyExists, {} reads waited ({:?} in all)",
        PARENTS,
        ctx.tally.already_exists.load(Ordering::Relaxed),
        stats.read().waited,
        stats.read().waited_for
    );
    (ctx, stats.read().waited)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_write_children_are_created_once_per_parent() {
    let (ctx, waited) = children_case(OwnWrites::default(), "own-write-children").await;
    let already_exists = ctx.tally.already_exists.load(Ordering::Relaxed);
    assert_eq!(
        already_exists, 0,
        "no reconcile read a cache without its child"
    );
    assert!(waited > 0, "some reads found the cache behind and waited");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_write_ignored_lets_reconciles_create_children_twice() {
    let (ctx, waited) = children_case(OwnWrites::Ignored, "own-write-ignored").await;
    let already_exists = ctx.tally.already_exists.load(Ordering::Relaxed);
    assert!(
        already_exists > 0,
        "without waiting, some reconcile reads the cache before its own child arrives"
    );
    assert_eq!(waited, 0, "an ignoring controller never waits");
}

const ROUNDS: u32 = 3;

fn rounds_done(service: &TraefikService) -> u32 {
    let message = service.status.as_ref().map_or("", |s| s.message.as_str());
    message
        .strip_prefix("reconciled ")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Counts its reconciles in the status, one update (from the read resourceVersion) per
/// reconcile, requeued at once until it has counted [`ROUNDS`].
async fn count_in_status(
    request: ReconcileRequest<TraefikService>,
    ctx: Arc<Ctx>,
) -> Result<Action, ClientError> {
    let key = request.key();
    let Some(current) = ctx.client.get::<TraefikService>(&key).await? else {
        return Ok(Action::done());
    };
    let done = rounds_done(&current);
    if done >= ROUNDS {
        ctx.tally.finish(key.name());
        return Ok(Action::done());
    }
    let mut next = (*current).clone();
    next.status.get_or_insert_default().message = format!("reconciled {}", done + 1);
    let tally = &ctx.tally;
    counted(
        ctx.client.replace_status(&next).await,
        &tally.status_writes,
        &tally.conflicts,
    )?;
    Ok(Action::requeue_after(Duration::ZERO))
}

async fn status_case(own_writes: OwnWrites, prefix: &str) -> Arc<Ctx> {
    let env = TestEnv::shared().await;
    traefik_support::install_crd(env).await;
    let (client, namespace) = test_namespace(env, prefix).await;
    let services: Api<TraefikService> = Api::namespaced(client.clone(), &namespace);
    futures::stream::iter(0..PARENTS)
        .for_each_concurrent(IN_FLIGHT, |i| {
            let services = services.clone();
            async move {
                let service = traefik_support::traefik_service(
                    &format!("s-{i:04}"),
                    "http://backend.example:80",
                );
                services
                    .create(&PostParams::default(), &service)
                    .await
                    .unwrap();
            }
        })
        .await;

    let factory = InformerFactory::new(client.clone());
    let controller = Controller::new(
        "own-write-status",
        factory.informer::<TraefikService>(Scope::namespace(&namespace)),
    )
    .workers(8)
    .own_writes(own_writes);
    let ctx = Arc::new(Ctx {
        client: controller.client(client.clone()),
        tally: Tally::default(),
    });
    let cancel = CancellationToken::new();
    factory.start(&cancel);
    let run = tokio::spawn(controller.run(
        (count_in_status, retry_with_backoff(), ctx.clone()),
        cancel.clone(),
    ));
    eventually_some_within(PATIENCE, "every service counted its rounds", || {
        let finished = ctx.tally.finished();
        async move { (finished == PARENTS).then_some(()) }
    })
    .await;
    cancel.cancel();
    run.await.unwrap().unwrap();

    let listed = services.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), PARENTS);
    assert!(
        listed.items.iter().all(|s| rounds_done(s) == ROUNDS),
        "every status counted {ROUNDS}"
    );
    assert_eq!(
        ctx.tally.status_writes.load(Ordering::Relaxed),
        u64::from(ROUNDS) * PARENTS as u64,
        "one successful status write per round"
    );
    eprintln!(
        "{own_writes:?}: {} status writes, {} Conflicts",
        ctx.tally.status_writes.load(Ordering::Relaxed),
        ctx.tally.conflicts.load(Ordering::Relaxed)
    );
    ctx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_write_status_updates_read_back_without_conflicts() {
    let ctx = status_case(OwnWrites::default(), "own-write-status").await;
    assert_eq!(
        ctx.tally.conflicts.load(Ordering::Relaxed),
        0,
        "no update from a stale read"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_write_ignored_lets_status_updates_conflict() {
    let ctx = status_case(OwnWrites::Ignored, "own-write-status-ignored").await;
    assert!(
        ctx.tally.conflicts.load(Ordering::Relaxed) > 0,
        "without waiting, an immediate requeue reads the status it just replaced"
    );
}
