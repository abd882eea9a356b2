//! sharded-controller end to end: the real binary run as separate processes over the real
//! control plane, with its `ShardedListAndWatch` gate on and off. Each replica records its
//! finished reconciles (`--reconcile-log`); the test checks from those records that every
//! object is reconciled by one replica at a time, through a SIGKILL and a replica added.
//! `SHARDED_CONTROLLER_LOG` sets the replicas' `RUST_LOG` (their logs are kept on failure).

use std::{
    collections::{BTreeMap, BTreeSet},
    fs::File,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::api::{coordination::v1::Lease, core::v1::ConfigMap};
use kube_client::{
    Api, Client,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use kube_testenv::TestEnv;
use serde::Deserialize;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    process::{Child, Command},
};

const OBJECTS: usize = 3_000;
const SLOTS: usize = 16;
const LEASE: Duration = Duration::from_secs(3);
const RING: &str = "sharded";
const PATIENCE: Duration = Duration::from_secs(120);

/// One finished reconcile, as the example records it.
#[derive(Clone, Debug, Deserialize)]
struct Reconciled {
    replica: String,
    key: String,
    labels: BTreeMap<String, String>,
    started_ns: u128,
    ended_ns: u128,
}

impl Reconciled {
    fn round(&self) -> Option<&str> {
        self.labels.get("round").map(String::as_str)
    }
}

/// The example running as a child process.
struct Replica {
    identity: String,
    child: Child,
    metrics: SocketAddr,
    output: PathBuf,
}

impl Replica {
    fn start(env: &TestEnv, namespace: &str, identity: &str, dir: &Path) -> Self {
        let metrics = free_address();
        let output = dir.join(format!("{identity}.out"));
        let out = File::create(&output).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_sharded-controller"))
            .arg("--kubeconfig")
            .arg(env.kubeconfig_path())
            .args([
                "--namespace",
                namespace,
                "--ring",
                RING,
                "--identity",
                identity,
            ])
            .args(["--slots", &SLOTS.to_string()])
            .args(["--lease-seconds", &LEASE.as_secs_f64().to_string()])
            .args(["--hold-ms", "5", "--workers", "2"])
            .arg("--reconcile-log")
            .arg(dir.join(format!("{identity}.jsonl")))
            .args(["--metrics-address", &metrics.to_string()])
            .env(
                "RUST_LOG",
                std::env::var("SHARDED_CONTROLLER_LOG")
                    .unwrap_or_else(|_| "warn,kube_informer::sharding=info".into()),
            )
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out))
            .kill_on_drop(true)
            .spawn()
            .expect("starting sharded-controller");
        Self {
            identity: identity.to_owned(),
            child,
            metrics,
            output,
        }
    }

    /// `/metrics`, as text.
    async fn scrape(&self) -> String {
        let mut stream = tokio::net::TcpStream::connect(self.metrics).await.unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut body = String::new();
        stream.read_to_string(&mut body).await.unwrap();
        body
    }

    /// Ends the process gracefully (SIGTERM) and waits for it.
    async fn terminate(mut self) {
        let pid = self.child.id().expect("still running").to_string();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(sent.success());
        let status = tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .expect("the replica stops within the patience")
            .unwrap();
        assert!(
            status.success(),
            "{} exited with {status}: {}",
            self.identity,
            tail(&self.output)
        );
    }
}

fn free_address() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// Every reconcile recorded so far by every replica in `dir`.
fn records(dir: &Path) -> Vec<Reconciled> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "jsonl") {
            let text = std::fs::read_to_string(&path).unwrap();
            // A line being written as the file is read is left for the next look.
            all.extend(
                text.lines()
                    .filter_map(|line| serde_json::from_str::<Reconciled>(line).ok()),
            );
        }
    }
    all
}

/// Polls `check` every 200 ms until it gives a value, failing after [`PATIENCE`].
async fn until<T>(what: &str, dir: &Path, mut check: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "{what}: not within {PATIENCE:?}; logs in {}",
            dir.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The replicas that reconciled each key at `round`, once every key has been.
fn reconciled_at(
    dir: &Path,
    keys: &BTreeSet<String>,
    round: &str,
) -> Option<BTreeMap<String, Vec<String>>> {
    let mut by_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for record in records(dir)
        .into_iter()
        .filter(|r| r.round() == Some(round))
    {
        by_key.entry(record.key).or_default().push(record.replica);
    }
    (by_key.len() == keys.len()).then_some(by_key)
}

/// Waits until every key has been reconciled at `round`, and checks each was reconciled
/// once, by one replica; returns who reconciled each.
async fn reconciled_once(
    dir: &Path,
    keys: &BTreeSet<String>,
    round: &str,
) -> BTreeMap<String, Vec<String>> {
    let what = format!("every update of round {round} reconciled");
    let by_key = until(&what, dir, || reconciled_at(dir, keys, round)).await;
    let twice: Vec<_> = by_key.iter().filter(|(_, by)| by.len() != 1).collect();
    assert!(
        twice.is_empty(),
        "round {round}: updates reconciled more than once: {:?}",
        &twice[..twice.len().min(5)]
    );
    by_key
}

/// Whether the ring's slot Leases are held by `live` alone, in equal shares.
async fn settled(client: &Client, namespace: &str, live: &[&Replica]) -> bool {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let Ok(list) = leases
        .list(&ListParams::default().labels(&format!("sharding.kube-informer.dev/ring={RING}")))
        .await
    else {
        return false;
    };
    let mut held: BTreeMap<String, usize> = BTreeMap::new();
    let mut slots = 0;
    for lease in list.items {
        let name = lease.metadata.name.unwrap_or_default();
        if !name.starts_with(&format!("{RING}-slot-")) {
            continue;
        }
        slots += 1;
        if let Some(holder) = lease.spec.and_then(|s| s.holder_identity) {
            *held.entry(holder).or_default() += 1;
        }
    }
    let names: BTreeSet<&str> = live.iter().map(|r| r.identity.as_str()).collect();
    let fair = SLOTS / live.len();
    slots == SLOTS
        && held.keys().map(String::as_str).collect::<BTreeSet<_>>() == names
        && held.values().all(|n| *n == fair || *n == fair + 1)
        && held.values().sum::<usize>() == SLOTS
}

async fn label_all(api: &Api<ConfigMap>, round: &str) {
    futures::stream::iter(0..OBJECTS)
        .for_each_concurrent(32, |i| async move {
            let patch = serde_json::json!({ "metadata": { "labels": { "round": round } } });
            api.patch(
                &format!("cm-{i:04}"),
                &PatchParams::default(),
                &Patch::Merge(patch),
            )
            .await
            .unwrap();
        })
        .await;
}

/// The value of the metric line starting with `prefix`, summed over its series.
fn metric(text: &str, prefix: &str) -> i64 {
    text.lines()
        .filter(|line| line.starts_with(prefix))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<i64>().ok())
        .sum()
}

/// Three replicas over [`OBJECTS`] ConfigMaps; one SIGKILLed, then a fourth added.
async fn three_replicas_a_kill_and_a_fourth(env: &TestEnv, prefix: &str, server_side: bool) {
    let namespace = env.create_namespace(prefix).await.unwrap();
    let client = env.client().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    futures::stream::iter(0..OBJECTS)
        .for_each_concurrent(32, |i| {
            let api = api.clone();
            async move {
                let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                    "metadata": { "name": format!("cm-{i:04}"), "labels": { "round": "1" } },
                }))
                .unwrap();
                api.create(&PostParams::default(), &cm).await.unwrap();
            }
        })
        .await;
    let keys: BTreeSet<String> = (0..OBJECTS)
        .map(|i| format!("{namespace}/cm-{i:04}"))
        .collect();
    let dir = tempfile_dir(prefix);

    let a = Replica::start(env, &namespace, "a", &dir);
    let b = Replica::start(env, &namespace, "b", &dir);
    let c = Replica::start(env, &namespace, "c", &dir);
    until("every object reconciled", &dir, || {
        reconciled_at(&dir, &keys, "1")
    })
    .await;
    wait_settled(&client, &namespace, &[&a, &b, &c], &dir).await;

    // The ring's metrics and the shard's mode, as each replica serves them once its
    // cache follows its share (a replica relists its shard after the Leases settle).
    let started = Instant::now();
    loop {
        let mut texts = Vec::new();
        for replica in [&a, &b, &c] {
            texts.push((replica.identity.as_str(), replica.scrape().await));
        }
        let held: i64 = texts
            .iter()
            .map(|(_, text)| metric(text, "shard_ring_slots_held{"))
            .sum();
        let followed = texts.iter().all(|(_, text)| {
            let objects = metric(text, "shard_ring_objects{");
            metric(text, "informer_shard_server_side{") == i64::from(server_side)
                && objects > 0
                && objects < OBJECTS as i64
        });
        if held == SLOTS as i64 && followed {
            break;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "the replicas never served their shares (held {held} of {SLOTS} slots; \
             the shard applied by the server: {server_side}): {texts:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // An update is reconciled once, by one replica.
    label_all(&api, "2").await;
    let round = reconciled_once(&dir, &keys, "2").await;
    let shares: BTreeMap<&str, usize> = round.values().fold(BTreeMap::new(), |mut m, by| {
        *m.entry(by[0].as_str()).or_default() += 1;
        m
    });
    assert_eq!(shares.len(), 3, "each replica has a share: {shares:?}");

    // SIGKILL one replica: the others take its objects once its Leases expire.
    let mut b = b;
    b.child.start_kill().unwrap();
    b.child.wait().await.unwrap();
    let killed = Instant::now();
    label_all(&api, "3").await;
    let round = until("every update reconciled after the kill", &dir, || {
        reconciled_at(&dir, &keys, "3")
    })
    .await;
    let handover = killed.elapsed();
    assert!(
        round.values().flatten().all(|replica| replica != "b"),
        "the killed replica reconciled nothing"
    );
    // The slots expire after a Lease duration; a relist and the reconciles follow. How
    // soon is the ring benchmark's to measure; here only that they all are.
    eprintln!("{prefix}: every change reconciled {handover:?} after the SIGKILL");

    // A fourth replica joins while every object changes: the ring rebalances under load.
    let d = Replica::start(env, &namespace, "d", &dir);
    label_all(&api, "4").await;
    wait_settled(&client, &namespace, &[&a, &c, &d], &dir).await;
    until(
        "every update reconciled while the fourth replica joined",
        &dir,
        || reconciled_at(&dir, &keys, "4"),
    )
    .await;
    // Settled: each update is again reconciled once, and the new replica has a share.
    label_all(&api, "5").await;
    let round = reconciled_once(&dir, &keys, "5").await;
    assert!(
        round.values().flatten().any(|replica| replica == "d"),
        "the new replica has a share"
    );

    // Over the whole run, no key was reconciled by two replicas at once.
    let mut by_key: BTreeMap<String, Vec<Reconciled>> = BTreeMap::new();
    for record in records(&dir) {
        by_key.entry(record.key.clone()).or_default().push(record);
    }
    let mut checked = 0;
    for (key, runs) in &by_key {
        for (i, x) in runs.iter().enumerate() {
            for y in &runs[i + 1..] {
                checked += 1;
                let overlap = x.started_ns < y.ended_ns && y.started_ns < x.ended_ns;
                assert!(
                    !(overlap && x.replica != y.replica),
                    "{key} reconciled by {} and {} at once",
                    x.replica,
                    y.replica
                );
            }
        }
    }
    assert!(
        checked >= 4 * OBJECTS,
        "pairs of reconciles compared: {checked}"
    );

    // A graceful stop lets go of the slots at once and deletes the member Lease.
    for replica in [a, c, d] {
        replica.terminate().await;
    }
    let leases: Api<Lease> = Api::namespaced(client, &namespace);
    let left = leases
        .list(&ListParams::default().labels(&format!("sharding.kube-informer.dev/ring={RING}")))
        .await
        .unwrap();
    for lease in left.items {
        let name = lease.metadata.name.unwrap_or_default();
        let holder = lease.spec.and_then(|s| s.holder_identity);
        if name.starts_with(&format!("{RING}-slot-")) {
            assert!(holder.is_none(), "{name} released, not held by {holder:?}");
        } else {
            assert_eq!(
                name,
                format!("{RING}-member-b"),
                "only the killed replica's member Lease is left"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

async fn wait_settled(client: &Client, namespace: &str, live: &[&Replica], dir: &Path) {
    let started = Instant::now();
    while !settled(client, namespace, live).await {
        assert!(
            started.elapsed() < PATIENCE,
            "the ring never settled on {:?}; logs in {}",
            live.iter().map(|r| &r.identity).collect::<Vec<_>>(),
            dir.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn tempfile_dir(prefix: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "sharded-controller-{prefix}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_processes_with_the_gate_on_split_the_objects_through_a_kill() {
    let env = TestEnv::builder()
        .apiserver_arg("--feature-gates=ShardedListAndWatch=true")
        .start()
        .await
        .expect("a control plane with the ShardedListAndWatch gate");
    three_replicas_a_kill_and_a_fourth(&env, "shard-processes-on", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_processes_with_the_gate_off_split_the_objects_through_a_kill() {
    let env = TestEnv::shared().await;
    three_replicas_a_kill_and_a_fourth(env, "shard-processes-off", false).await;
}
