//! The traefik-operator and Traefik sharing an etcd that serves TLS only, requires client
//! certificates (`--client-cert-auth`) and has authentication enabled: the operator's
//! user may read and write under the `traefik/` prefix, Traefik's user may only read it.
//! All real: the local control plane, etcd, Traefik, loopback HTTP backends, and the
//! operator's manager in-process as its binary runs it.

use std::path::PathBuf;

use clap::Parser as _;
use etcd_client::{Certificate, ConnectOptions, Identity, Permission, TlsOptions};
use kube_client::{Api, Client, api::PostParams};
use kube_testenv::{EtcdServer, EtcdTls, TestEnv};
use tests::{eventually_some_within, test_namespace};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use traefik_operator::{
    crd::TraefikService,
    etcd::{EtcdOptions, Password},
    kv::{KvError, TraefikKv},
    manager::{self, Cli, ManagerError},
};

mod traefik_support;

use traefik_support::{
    Backend, TRAEFIK_PATIENCE as PATIENCE, Traefik, init_logs, install_crd, traefik_service,
};
const ROOT_PASSWORD: &str = "root-pw-for-the-test";
const OPERATOR_USER: &str = "traefik-operator";
const OPERATOR_PASSWORD: &str = "operator-pw-for-the-test";
const TRAEFIK_USER: &str = "traefik";
const TRAEFIK_PASSWORD: &str = "traefik-pw-for-the-test";

fn tls_of(etcd: &EtcdServer) -> &EtcdTls {
    etcd.tls().expect("started with TLS")
}

/// A client of the test itself (not of the code under test), for setting etcd up.
async fn etcd_client(etcd: &EtcdServer, user: Option<(&str, &str)>) -> etcd_client::Client {
    let tls = tls_of(etcd);
    let read = |p: &PathBuf| std::fs::read(p).unwrap();
    let mut options = ConnectOptions::new().with_tls(
        TlsOptions::new()
            .ca_certificate(Certificate::from_pem(read(&tls.ca_cert)))
            .identity(Identity::from_pem(
                read(&tls.client_cert),
                read(&tls.client_key),
            )),
    );
    if let Some((name, password)) = user {
        options = options.with_user(name, password);
    }
    etcd_client::Client::connect([etcd.endpoint()], Some(options))
        .await
        .expect("connecting to etcd over TLS")
}

/// An etcd with TLS and client certificates required, and authentication enabled: a
/// root user (etcd requires one), the operator's user with readwrite on `traefik/` and on
/// its ownership records, and Traefik's with read only.
async fn secure_etcd(env: &TestEnv) -> EtcdServer {
    let etcd = EtcdServer::start_tls(env.binaries()).await.unwrap();
    let mut admin = etcd_client(&etcd, None).await;
    admin.user_add("root", ROOT_PASSWORD, None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    let writes = [
        Permission::read_write("traefik/").with_prefix(),
        Permission::read_write("kube-informer/traefik-operator/traefik/").with_prefix(),
    ];
    // Traefik reads the range of the root key itself, without the slash.
    let reads = [Permission::read("traefik").with_prefix()];
    for (user, password, role, permissions) in [
        (
            OPERATOR_USER,
            OPERATOR_PASSWORD,
            "traefik-writer",
            &writes[..],
        ),
        (TRAEFIK_USER, TRAEFIK_PASSWORD, "traefik-reader", &reads[..]),
    ] {
        admin.role_add(role).await.unwrap();
        for permission in permissions {
            admin
                .role_grant_permission(role, permission.clone())
                .await
                .unwrap();
        }
        admin.user_add(user, password, None).await.unwrap();
        admin.user_grant_role(user, role).await.unwrap();
    }
    admin.auth_enable().await.unwrap();
    etcd
}

/// Every key under `traefik/`, read as root.
async fn etcd_keys(etcd: &EtcdServer) -> Vec<String> {
    let mut root = etcd_client(etcd, Some(("root", ROOT_PASSWORD))).await;
    let response = root
        .get(
            "traefik/",
            Some(
                etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_keys_only(),
            ),
        )
        .await
        .unwrap();
    response
        .kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect()
}

/// The operator's etcd flags: TLS with the CA, optionally a client certificate, and the
/// operator's user with `password`.
fn etcd_flags(etcd: &EtcdServer, client_cert: bool, password: &str) -> Vec<String> {
    let tls = tls_of(etcd);
    let mut flags = vec![
        format!("--etcd-endpoints={}", etcd.endpoint()),
        format!("--etcd-ca-file={}", tls.ca_cert.display()),
        format!("--etcd-username={OPERATOR_USER}"),
        format!("--etcd-password={password}"),
    ];
    if client_cert {
        flags.push(format!("--etcd-cert-file={}", tls.client_cert.display()));
        flags.push(format!("--etcd-key-file={}", tls.client_key.display()));
    }
    flags
}

/// Traefik reading the secure etcd with its read-only user and the client certificate.
async fn secure_traefik(etcd: &EtcdServer) -> Traefik {
    let tls = tls_of(etcd);
    let flags = [
        format!("--providers.etcd.tls.ca={}", tls.ca_cert.display()),
        format!("--providers.etcd.tls.cert={}", tls.client_cert.display()),
        format!("--providers.etcd.tls.key={}", tls.client_key.display()),
        format!("--providers.etcd.username={TRAEFIK_USER}"),
        format!("--providers.etcd.password={TRAEFIK_PASSWORD}"),
    ];
    Traefik::start_with(etcd, &flags).await
}

struct Operator {
    cancel: CancellationToken,
    task: JoinHandle<Result<(), ManagerError>>,
}

impl Operator {
    fn start(client: Client, namespace: &str, etcd_flags: &[String]) -> Self {
        let mut args = vec![
            "traefik-operator".to_owned(),
            format!("--namespace={namespace}"),
            "--controllers=traefikservices".to_owned(),
            "--health-probe-bind-address=0".to_owned(),
            "--metrics-bind-address=0".to_owned(),
            "--max-retry-delay=2s".to_owned(),
            // The backend here is a loopback server, denied by default.
            "--allow-backends=127.0.0.0/8".to_owned(),
        ];
        args.extend(etcd_flags.iter().cloned());
        let cli = Cli::try_parse_from(args).expect("valid flags");
        let cancel = CancellationToken::new();
        let task = tokio::spawn(manager::run(cli.options, client, cancel.clone()));
        Self { cancel, task }
    }

    async fn stop(self) {
        self.cancel.cancel();
        tokio::time::timeout(PATIENCE, self.task)
            .await
            .expect("the operator stops in time")
            .expect("the operator does not panic")
            .expect("the operator stops cleanly");
    }
}

/// Waits for the object's status message to satisfy `pred`, and returns the message.
async fn wait_message(
    api: &Api<TraefikService>,
    name: &str,
    what: &str,
    pred: impl Fn(&str, bool) -> bool,
) -> String {
    let pred = &pred;
    eventually_some_within(PATIENCE, what, || async move {
        let obj = api.get_opt(name).await.ok().flatten()?;
        let status = obj.status?;
        pred(&status.message, status.active).then_some(status.message)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_with_tls_client_certificates_and_passwords_routes_through_traefik() {
    init_logs();
    let env = TestEnv::shared().await;
    install_crd(env).await;
    let (client, namespace) = test_namespace(env, "etcd-secure").await;
    let etcd = secure_etcd(env).await;
    let traefik = secure_traefik(&etcd).await;
    let backend = Backend::start("behind a secure etcd").await;

    let operator = Operator::start(
        client.clone(),
        &namespace,
        &etcd_flags(&etcd, true, OPERATOR_PASSWORD),
    );
    let api: Api<TraefikService> = Api::namespaced(client, &namespace);
    api.create(
        &PostParams::default(),
        &traefik_service("secure", &backend.url()),
    )
    .await
    .unwrap();
    let message = wait_message(&api, "secure", "the route to be active", |_, active| active).await;
    assert_eq!(message, "");
    let host = format!("secure.{namespace}");
    traefik
        .wait_routed(&host, 200, Some("behind a secure etcd"))
        .await;
    let route = format!("tsvc_{namespace}_secure");
    let keys = etcd_keys(&etcd).await;
    assert!(
        keys.contains(&format!(
            "traefik/http/services/{route}/loadBalancer/servers/0/url"
        )),
        "{keys:?}"
    );

    // The same settings through the library: the operator's user reads its keys back.
    let mut options = EtcdOptions::plaintext(vec![etcd.endpoint()], "traefik");
    options.ca_file = Some(tls_of(&etcd).ca_cert.clone());
    options.cert_file = Some(tls_of(&etcd).client_cert.clone());
    options.key_file = Some(tls_of(&etcd).client_key.clone());
    options.username = Some(OPERATOR_USER.into());
    options.password = Some(Password::new(OPERATOR_PASSWORD));
    let kv = TraefikKv::connect_with(&options).unwrap();
    let dump = kv.dump().await.unwrap();
    assert!(dump.keys().any(|k| k.contains(&route)), "{dump:?}");
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_client_certificate_or_a_wrong_password_is_a_clear_error_and_routes_nothing() {
    init_logs();
    let env = TestEnv::shared().await;
    install_crd(env).await;
    let (client, namespace) = test_namespace(env, "etcd-denied").await;
    let etcd = secure_etcd(env).await;
    let backend = Backend::start("never routed").await;
    let api: Api<TraefikService> = Api::namespaced(client.clone(), &namespace);
    let route = format!("tsvc_{namespace}_denied");

    // A file that does not exist: the manager stops at once, naming it.
    let flags = etcd_flags(&etcd, true, OPERATOR_PASSWORD)
        .into_iter()
        .map(|f| {
            if f.starts_with("--etcd-ca-file=") {
                "--etcd-ca-file=/nonexistent/etcd-ca.crt".to_owned()
            } else {
                f
            }
        });
    let cli = Cli::try_parse_from(
        [
            "traefik-operator",
            "--controllers=traefikservices",
            "--health-probe-bind-address=0",
            "--metrics-bind-address=0",
            &format!("--namespace={namespace}"),
        ]
        .into_iter()
        .map(str::to_owned)
        .chain(flags),
    )
    .unwrap();
    let err = tokio::time::timeout(
        PATIENCE,
        manager::run(cli.options, client.clone(), CancellationToken::new()),
    )
    .await
    .expect("the manager fails fast")
    .unwrap_err();
    assert!(matches!(err, ManagerError::EtcdConfig(_)), "{err}");
    assert!(
        err.to_string().contains("/nonexistent/etcd-ca.crt"),
        "{err}"
    );

    // No client certificate: etcd ends the TLS handshake.
    let operator = Operator::start(
        client.clone(),
        &namespace,
        &etcd_flags(&etcd, false, OPERATOR_PASSWORD),
    );
    api.create(
        &PostParams::default(),
        &traefik_service("denied", &backend.url()),
    )
    .await
    .unwrap();
    let message = wait_message(&api, "denied", "a TLS error in the status", |m, active| {
        !active && m.contains("TLS with etcd failed")
    })
    .await;
    assert!(message.contains("--etcd-cert-file"), "{message}");
    assert!(!message.contains(&etcd.endpoint()), "{message}");
    operator.stop().await;
    assert!(
        !etcd_keys(&etcd).await.iter().any(|k| k.contains(&route)),
        "no route without a client certificate"
    );
    let mut no_cert = EtcdOptions::plaintext(vec![etcd.endpoint()], "traefik");
    no_cert.ca_file = Some(tls_of(&etcd).ca_cert.clone());
    let kv = TraefikKv::connect_with(&no_cert).unwrap();
    // etcd closes the connection right after its alert, so an attempt may see only the
    // closed connection (on a busy machine, several in a row); the alert must come, and
    // nothing but the alert or the closed connection before it.
    let mut errors = Vec::new();
    while errors.len() < 50 && !matches!(errors.last(), Some(KvError::Tls { .. })) {
        errors.push(kv.dump().await.unwrap_err());
    }
    assert!(
        matches!(errors.last(), Some(KvError::Tls { .. })),
        "no TLS error in {errors:?}"
    );
    assert!(
        errors
            .iter()
            .all(|e| matches!(e, KvError::Tls { .. } | KvError::Unreachable { .. })),
        "{errors:?}"
    );
    assert!(
        !errors
            .last()
            .unwrap()
            .to_string()
            .contains(&etcd.endpoint()),
        "{}",
        errors.last().unwrap()
    );

    // The client certificate but a wrong password: etcd rejects the credentials.
    let operator = Operator::start(
        client.clone(),
        &namespace,
        &etcd_flags(&etcd, true, "not-the-password"),
    );
    let message = wait_message(
        &api,
        "denied",
        "a credentials error in the status",
        |m, active| !active && m.contains("rejected the credentials"),
    )
    .await;
    assert!(message.contains("--etcd-password"), "{message}");
    assert!(!message.contains("not-the-password"), "{message}");
    operator.stop().await;
    assert!(
        !etcd_keys(&etcd).await.iter().any(|k| k.contains(&route)),
        "no route with a wrong password"
    );

    // Fixed settings: the same object becomes active.
    let operator = Operator::start(
        client,
        &namespace,
        &etcd_flags(&etcd, true, OPERATOR_PASSWORD),
    );
    wait_message(
        &api,
        "denied",
        "active with the right settings",
        |m, active| active && m.is_empty(),
    )
    .await;
    assert!(etcd_keys(&etcd).await.iter().any(|k| k.contains(&route)));
    operator.stop().await;
}
