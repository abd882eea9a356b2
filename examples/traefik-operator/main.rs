//! `traefik-operator`: see `examples/traefik-operator/README.md` and
//! `traefik-operator --help`.

use std::process::ExitCode;

use clap::Parser;
use traefik_operator::{
    crd,
    manager::{self, Cli, Command},
};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::Crd) = cli.command {
        return examples::print_manifest(crd::crd_yaml());
    }
    examples::init_tracing();
    // `--kubeconfig`, in-cluster or $KUBECONFIG; HTTP/2 with pings, so a stalled
    // connection to the API server is found in seconds.
    let client = match cli.options.operator.cluster().client().await {
        Ok(client) => client,
        Err(err) => {
            tracing::error!(error = %err, "no usable Kubernetes configuration");
            return ExitCode::FAILURE;
        }
    };
    // Ctrl-C or SIGTERM starts a graceful shutdown; a second one exits at once.
    let cancel = kube_informer::cancel_on_signals();
    match manager::run(cli.options, client, cancel).await {
        Ok(()) => ExitCode::SUCCESS,
        // manager::run has logged the error.
        Err(_) => ExitCode::FAILURE,
    }
}
