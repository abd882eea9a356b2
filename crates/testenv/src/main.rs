//! `kube-testenv`: a local Kubernetes control plane without containers.
//!
//! ```text
//! cargo run -p kube-testenv -- up --controller-manager --kubeconfig ./kubeconfig
//! ```
//! prints `KUBECONFIG=<path>` once the API server is ready and runs until
//! Ctrl-C or `SIGTERM`, then stops every process it started.

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use kube_testenv::{Binaries, JaegerBinary, TestEnv, ToxiproxyBinary};
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    version,
    about = "A local Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager) built from Go modules"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a control plane and keep it running in the foreground.
    Up {
        /// Also run kube-controller-manager, so Deployments get Pods.
        #[arg(long)]
        controller_manager: bool,
        /// Also write the admin kubeconfig to this path.
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
    },
    /// Build the binaries (if the cache lacks them) and print the control
    /// plane's directory, then the paths of toxiproxy-server and jaeger.
    Build,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| {
            // The readiness probe expects 500s while the API server starts; the
            // client would log each of them as an error.
            EnvFilter::new("info,kube_client::client::builder=off")
        }))
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), kube_testenv::Error> {
    match cli.command {
        Command::Build => {
            let binaries = tokio::task::spawn_blocking(Binaries::ensure)
                .await
                .expect("the build does not panic")?;
            println!("{}", binaries.dir().display());
            // Second, so the control plane's directory stays the first line
            // for scripts that read it.
            let toxiproxy = tokio::task::spawn_blocking(ToxiproxyBinary::ensure)
                .await
                .expect("the build does not panic")?;
            println!("{}", toxiproxy.path().display());
            let jaeger = tokio::task::spawn_blocking(JaegerBinary::ensure)
                .await
                .expect("the build does not panic")?;
            println!("{}", jaeger.path().display());
            Ok(())
        }
        Command::Up {
            controller_manager,
            kubeconfig,
        } => {
            let env = TestEnv::builder()
                .controller_manager(controller_manager)
                .start()
                .await?;
            let path = match kubeconfig {
                Some(path) => {
                    std::fs::copy(env.kubeconfig_path(), &path).map_err(|source| {
                        kube_testenv::Error::Io {
                            action: "writing the kubeconfig",
                            path: path.clone(),
                            source,
                        }
                    })?;
                    std::path::absolute(&path).unwrap_or(path)
                }
                None => env.kubeconfig_path().to_owned(),
            };
            println!("KUBECONFIG={}", path.display());
            wait_for_stop_signal().await;
            tracing::info!("stopping the control plane");
            drop(env);
            Ok(())
        }
    }
}

async fn wait_for_stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}
