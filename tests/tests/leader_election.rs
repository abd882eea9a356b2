//! Leader election on a real Lease: one candidate leads at a time, a released lease is
//! taken over at once, an abandoned one after it expires, and a leader whose lease is
//! taken stops leading.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::api::coordination::v1::Lease;
use kube_client::{
    Api, Client,
    api::{Patch, PatchParams},
};
use kube_informer::leader_election::{
    LeaderElectionConfig, LeaderElectionError, LeaderElector, OnCancel,
};
use kube_informer::lease::LeaseConfig;
use kube_testenv::TestEnv;
use tests::{eventually, eventually_some, lease_holder, test_namespace, within};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const LEASE: Duration = Duration::from_secs(3);

fn config(namespace: &str, identity: &str) -> LeaderElectionConfig {
    LeaderElectionConfig::new(
        LeaseConfig::new("the-lease")
            .in_namespace(namespace)
            .with_identity(identity)
            .timing(LEASE, Duration::from_secs(2), Duration::from_millis(300)),
    )
}

/// A candidate campaigning in a task; `leading` tells whether its lead future runs.
struct Candidate {
    elector: Arc<LeaderElector>,
    stop: CancellationToken,
    task: JoinHandle<Result<Option<()>, LeaderElectionError>>,
}

impl Candidate {
    fn start(client: Client, namespace: &str, identity: &str) -> Self {
        Self::with_config(client, config(namespace, identity))
    }

    fn with_config(client: Client, config: LeaderElectionConfig) -> Self {
        let elector = Arc::new(LeaderElector::new(client, config).unwrap());
        let stop = CancellationToken::new();
        let task = {
            let elector = elector.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                elector
                    .run(stop, |leading| async move { leading.cancelled().await })
                    .await
            })
        };
        Self {
            elector,
            stop,
            task,
        }
    }
}

/// A Lease far longer than any wait in the test: a takeover inside [`PATIENCE`] can only
/// come from a release (the takeover is awaited for [`tests::PATIENCE`]), and a leader's renewals cannot lapse on a busy machine.
const LONG_LEASE: Duration = Duration::from_secs(600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_candidate_leads_and_another_takes_over_a_released_lease_at_once() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "lease-release").await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &namespace);
    let long = |identity| {
        LeaderElectionConfig::new(
            LeaseConfig::new("the-lease")
                .in_namespace(&namespace)
                .with_identity(identity)
                .timing(LONG_LEASE, LONG_LEASE * 2 / 3, Duration::from_millis(300)),
        )
    };

    let a = Candidate::with_config(client.clone(), long("a"));
    eventually("a to lead", || a.elector.is_leader()).await;
    let b = Candidate::with_config(client.clone(), long("b"));
    // b campaigns while a renews three times: each of b's tries finds a's Lease held.
    let mut renewals = Vec::new();
    while renewals.len() < 4 {
        let last = renewals.last().copied();
        let leases = &leases;
        let renewed = eventually_some("a's next renewal", || async move {
            let renewed = leases.get("the-lease").await.ok()?.spec?.renew_time?.0;
            (last != Some(renewed)).then_some(renewed)
        })
        .await;
        assert!(!b.elector.is_leader(), "b led while a renewed");
        renewals.push(renewed);
    }
    assert!(a.elector.is_leader());
    assert_eq!(
        lease_holder(&leases, "the-lease").await.as_deref(),
        Some("a")
    );

    a.stop.cancel();
    assert!(matches!(a.task.await.unwrap(), Ok(Some(()))));
    assert!(!a.elector.is_leader());
    // Within the patience, far inside LONG_LEASE: b took the released Lease, not an expired one.
    eventually("b to lead", || b.elector.is_leader()).await;
    assert_eq!(
        lease_holder(&leases, "the-lease").await.as_deref(),
        Some("b")
    );
    let transitions = leases
        .get("the-lease")
        .await
        .unwrap()
        .spec
        .unwrap()
        .lease_transitions;
    assert_eq!(transitions, Some(1));

    b.stop.cancel();
    assert!(b.task.await.unwrap().is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_told_to_keep_its_lease_leaves_it_held_when_it_stops() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "lease-keep").await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &namespace);

    let a = Candidate::with_config(
        client.clone(),
        config(&namespace, "a").on_cancel(OnCancel::Keep),
    );
    eventually("a to lead", || a.elector.is_leader()).await;
    a.stop.cancel();
    assert!(matches!(a.task.await.unwrap(), Ok(Some(()))));
    assert!(!a.elector.is_leader());
    assert_eq!(
        lease_holder(&leases, "the-lease").await.as_deref(),
        Some("a"),
        "the stopped leader's lease is left to expire"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_lease_is_taken_over_after_it_expires() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "lease-expire").await;

    let a = Candidate::start(client.clone(), &namespace, "a");
    eventually("a to lead", || a.elector.is_leader()).await;
    let b = Candidate::start(client.clone(), &namespace, "b");
    // a dies without releasing the lease (as a crashed process would).
    a.task.abort();
    let crashed = Instant::now();
    eventually("b to lead", || b.elector.is_leader()).await;
    let takeover = crashed.elapsed();
    assert!(
        takeover >= LEASE - Duration::from_millis(500),
        "b must wait for the lease to expire, took over after {takeover:?}"
    );
    b.stop.cancel();
    assert!(b.task.await.unwrap().is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_lease_is_taken_stops_leading() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "lease-lost").await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &namespace);

    let a = Candidate::start(client.clone(), &namespace, "a");
    eventually("a to lead", || a.elector.is_leader()).await;
    let patch = serde_json::json!({ "spec": { "holderIdentity": "intruder" } });
    leases
        .patch("the-lease", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let result = within("a to stop leading", a.task).await.unwrap();
    match result {
        Err(LeaderElectionError::Lost { reason, .. }) => {
            assert!(reason.contains("intruder"), "{reason}")
        }
        other => panic!("expected lost leadership, got {other:?}"),
    }
    assert!(!a.elector.is_leader());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_without_rbac_gets_a_clear_error() {
    let env = TestEnv::shared().await;
    let namespace = env.create_namespace("lease-rbac").await.unwrap();
    let client = env
        .client_as(&format!("system:serviceaccount:{namespace}:nobody"))
        .await
        .unwrap();
    let elector = LeaderElector::new(client, config_for_rbac(&namespace)).unwrap();
    let result = within(
        "the candidate to fail",
        elector.run(CancellationToken::new(), |_| async {}),
    )
    .await;
    let err = result.unwrap_err();
    assert!(
        matches!(err, LeaderElectionError::Forbidden { .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("leases.coordination.k8s.io"),
        "{err}"
    );
}

fn config_for_rbac(namespace: &str) -> LeaderElectionConfig {
    config(namespace, "nobody")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_stops_working_before_another_can_acquire() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "lease-fence").await;
    let proxy = within(
        "the fault proxy",
        kube_testenv::FaultProxy::for_apiserver(env),
    )
    .await
    .unwrap();
    let timing = |identity| {
        LeaderElectionConfig::new(
            LeaseConfig::new("the-lease")
                .in_namespace(&namespace)
                .with_identity(identity)
                .timing(
                    Duration::from_secs(4),
                    Duration::from_secs(2),
                    Duration::from_millis(500),
                ),
        )
    };
    let through = env.client_via(&proxy).await.unwrap();
    let a = Arc::new(LeaderElector::new(through, timing("a")).unwrap());
    // A's work ignores its token, as a reconcile stuck in a call would: only fencing
    // can stop it.
    let worked: Arc<std::sync::Mutex<Vec<Instant>>> = Arc::default();
    let a_task = {
        let (a, worked) = (a.clone(), worked.clone());
        tokio::spawn(async move {
            a.run(CancellationToken::new(), |_leading| async move {
                loop {
                    worked.lock().unwrap().push(Instant::now());
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await
        })
    };
    eventually("a to lead", || a.is_leader()).await;
    let b = Arc::new(LeaderElector::new(client, timing("b")).unwrap());
    let b_acquired: Arc<std::sync::Mutex<Option<Instant>>> = Arc::default();
    let b_task = {
        let (b, acquired) = (b.clone(), b_acquired.clone());
        tokio::spawn(async move {
            b.run(CancellationToken::new(), |leading| async move {
                *acquired.lock().unwrap() = Some(Instant::now());
                leading.cancelled().await;
            })
            .await
        })
    };

    proxy.cut().await.unwrap();
    let a_result = within("a to give up leading", a_task).await.unwrap();
    assert!(
        matches!(a_result, Err(LeaderElectionError::Lost { .. })),
        "{a_result:?}"
    );
    assert!(!a.is_leader());
    eventually("b to acquire", || b_acquired.lock().unwrap().is_some()).await;
    let acquired = b_acquired.lock().unwrap().unwrap();
    let last_work = *worked.lock().unwrap().last().unwrap();
    assert!(
        last_work < acquired,
        "a worked until {:?} after b acquired",
        last_work - acquired
    );
    b_task.abort();
}
