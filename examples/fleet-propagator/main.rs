//! `fleet-propagator`: propagates `PropagatedConfig`s from a hub cluster to the member
//! clusters named by kubeconfig Secrets on the hub. See `examples/fleet-propagator/README.md`
//! and `fleet-propagator --help`.

use std::{process::ExitCode, time::Duration};

use anyhow::Context;
use clap::{Parser, Subcommand};
use fleet_propagator::{
    crd::{self, PROPAGATED, PropagatedConfig, PropagatedConfigSpec},
    run::{Options, run},
};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube_client::{
    Api,
    api::{DeleteParams, PostParams},
};
use kube_informer::{
    CancellationToken,
    fleet::{KUBECONFIG_SECRET_KEY, KUBECONFIG_SECRET_LABEL},
};
use kube_informer::{Manager, cli::OperatorArgs};
use kube_testenv::TestEnv;

/// Propagates `PropagatedConfig`s (group fleet.kube-informer.dev) from a hub cluster to
/// member clusters: each member named by a kubeconfig Secret in the hub's
/// `--secrets-namespace` (label fleet.kube-informer.dev/kubeconfig=true, key `kubeconfig`)
/// gets a ConfigMap of the same namespace and name; each object's status says, per
/// member, whether its copy is current.
#[derive(Parser, Debug)]
#[command(version)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// The hub (--kubeconfig, --context), probes, metrics, leader election, and the shard
    /// ring the members are dealt over (--shard-ring).
    #[command(flatten)]
    operator: OperatorArgs,
    /// The hub namespace holding the members' kubeconfig Secrets.
    #[arg(long, default_value = "fleet-system")]
    secrets_namespace: String,
    /// Reconciles at once over every member, shared fairly between them.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Start a hub and two member control planes on this machine, propagate a sample
    /// object through them, show what each step did, and stop.
    #[arg(long)]
    demo: bool,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the PropagatedConfig CRD (YAML) and exit.
    Crd,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::Crd) = cli.command {
        return examples::print_manifest(crd::crd_yaml());
    }
    examples::init_tracing();
    let outcome = if cli.demo {
        demo(&cli).await
    } else {
        serve(&cli).await
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = format!("{err:#}"), "the propagator failed");
            ExitCode::FAILURE
        }
    }
}

fn options(cli: &Cli) -> Options {
    Options {
        secrets_namespace: cli.secrets_namespace.clone(),
        workers: cli.workers,
    }
}

/// Runs against the configured hub until Ctrl-C or SIGTERM.
async fn serve(cli: &Cli) -> anyhow::Result<()> {
    let manager = Manager::from_args(&cli.operator)
        .await
        .context("no hub cluster to talk to (--demo starts local ones)")?;
    run(
        manager,
        options(cli),
        kube_informer::cancel_on_signals(),
        |_| {},
    )
    .await
}

/// The demo: a hub and two members on this machine, one object propagated, a failure
/// shown and repaired, and the object deleted with its copies.
async fn demo(cli: &Cli) -> anyhow::Result<()> {
    const NAMESPACE: &str = "demo";
    tracing::info!("starting three local control planes: a hub and members a and b");
    let (hub_env, a_env, b_env) = tokio::join!(
        TestEnv::builder().start(),
        TestEnv::builder().start(),
        TestEnv::builder().start()
    );
    let (hub_env, a_env, b_env) = (
        hub_env.context("starting the hub")?,
        a_env.context("starting member a")?,
        b_env.context("starting member b")?,
    );
    tracing::info!(hub = %hub_env.kubeconfig_path().display(), a = %a_env.kubeconfig_path().display(), b = %b_env.kubeconfig_path().display(), "control planes ready; kubectl --kubeconfig works with these files while the demo runs");
    let hub = hub_env.client().await?;
    let (a, b) = (a_env.client().await?, b_env.client().await?);
    examples::ensure_namespace(&hub, &cli.secrets_namespace).await?;
    for client in [&hub, &a] {
        examples::ensure_namespace(client, NAMESPACE).await?;
    }

    let cancel = CancellationToken::new();
    // The demo serves no probes or metrics: nothing scrapes it, and their ports stay free.
    let manager = Manager::new(hub.clone())
        .probe_address(None)
        .metrics_address(None);
    let propagator = tokio::spawn(run(manager, options(cli), cancel.clone(), |_| {}));
    let secrets = Api::<Secret>::namespaced(hub.clone(), &cli.secrets_namespace);
    for (name, env) in [("a", &a_env), ("b", &b_env)] {
        let kubeconfig = std::fs::read_to_string(env.kubeconfig_path())?;
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "labels": { KUBECONFIG_SECRET_LABEL: "true" } },
            "stringData": { KUBECONFIG_SECRET_KEY: kubeconfig },
        }))?;
        secrets.create(&PostParams::default(), &secret).await?;
        tracing::info!(
            member = name,
            "member registered: a kubeconfig Secret on the hub"
        );
    }

    let configs = Api::<PropagatedConfig>::namespaced(hub.clone(), NAMESPACE);
    // The CRD is installed by the propagator as it starts.
    let sample = PropagatedConfig::new(
        "settings",
        PropagatedConfigSpec {
            data: [("log-level".to_owned(), "debug".to_owned())].into(),
            clusters: vec!["a".into(), "b".into()],
        },
    );
    wait_for("the CRD", || async {
        configs
            .create(&PostParams::default(), &sample)
            .await
            .is_ok()
    })
    .await?;
    tracing::info!(
        "created PropagatedConfig demo/settings for members a and b; b has no namespace demo yet"
    );
    wait_for("b's failure in the status", || async {
        condition(&configs, "b").await.as_deref() == Some("False")
            && condition(&configs, "a").await.as_deref() == Some("True")
    })
    .await?;
    show(&configs).await?;
    tracing::info!("creating namespace demo in b: its copy follows at the next retry");
    examples::ensure_namespace(&b, NAMESPACE).await?;
    wait_for("b's copy", || async {
        condition(&configs, "b").await.as_deref() == Some("True")
    })
    .await?;
    show(&configs).await?;
    for (member, client) in [("a", &a), ("b", &b)] {
        let copy = Api::<ConfigMap>::namespaced(client.clone(), NAMESPACE)
            .get("settings")
            .await?;
        tracing::info!(member, data = ?copy.data, "the member's copy");
    }

    tracing::info!("deleting demo/settings: each member removes its copy, then its finalizer");
    configs.delete("settings", &DeleteParams::default()).await?;
    wait_for("the copies and the object to go", || async {
        let mut gone = matches!(configs.get_opt("settings").await, Ok(None));
        for client in [&a, &b] {
            let copies = Api::<ConfigMap>::namespaced(client.clone(), NAMESPACE);
            gone &= matches!(copies.get_opt("settings").await, Ok(None));
        }
        gone
    })
    .await?;
    tracing::info!("demo/settings and both copies are gone; the demo is done");
    cancel.cancel();
    propagator.await??;
    Ok(())
}

/// Member `cluster`'s `Propagated` status, if it has one.
async fn condition(configs: &Api<PropagatedConfig>, cluster: &str) -> Option<String> {
    let config = configs.get_opt("settings").await.ok()??;
    let entry = config.member_status(cluster)?;
    kube_informer::conditions::find_condition(&entry.conditions, PROPAGATED)
        .map(|c| c.status.clone())
}

/// Logs each member's entry of the status.
async fn show(configs: &Api<PropagatedConfig>) -> anyhow::Result<()> {
    let config = configs.get("settings").await?;
    for entry in config.status.map(|s| s.clusters).unwrap_or_default() {
        for condition in &entry.conditions {
            tracing::info!(member = %entry.cluster, status = %condition.status, reason = %condition.reason, message = %condition.message, "status of demo/settings");
        }
    }
    Ok(())
}

/// Polls `done` every 200 ms for at most a minute.
async fn wait_for<F, Fut>(what: &str, mut done: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !done().await {
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("waited a minute for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}
