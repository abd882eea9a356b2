//! `subject-workqueue`: kube-informer's workqueue through the cases of
//! `benches::workqueue_cases`, for `informer-bench` to set against client-go's
//! (`go-subject/workqueue`). Prints one JSON line, a [`WorkqueueLine`].

use std::time::Duration;

use benches::workqueue_cases::{WorkqueueLine, run_all};
use clap::Parser;

/// Runs every workqueue case and prints items per second as one JSON line.
#[derive(Debug, Parser)]
#[command(name = "subject-workqueue")]
struct Args {
    /// Time each case for at least this long, ms.
    #[arg(long, default_value_t = 1000)]
    min_ms: u64,
    /// And at least this many iterations.
    #[arg(long, default_value_t = 3)]
    min_iterations: usize,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let line = WorkqueueLine {
        subject: "kube-informer".to_owned(),
        min_ms: args.min_ms,
        cases: run_all(Duration::from_millis(args.min_ms), args.min_iterations),
    };
    println!("{}", serde_json::to_string(&line)?);
    Ok(())
}
