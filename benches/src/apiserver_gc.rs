//! kube-apiserver's Go garbage collector, counted and started from outside.
//!
//! On this benchmark's two cores, a collection of kube-apiserver's heap (hundreds of MiB
//! once it caches 10,000 Pods) costs a few hundred ms of CPU, and it starts whenever the
//! server's heap reaches its goal: during whichever subject's sync or burst happens to
//! allocate past it. That lands on one run in two or three at random and widens every
//! subject's spread more than the differences between subjects. The driver therefore
//! collects the server's garbage just before each timed phase, so that every subject
//! meets a server with the same headroom, and counts the collections during the phase,
//! so that a run that still met one shows it.

use anyhow::{Context, bail};
use futures::AsyncReadExt;

/// The Go runtime's count of completed collections, from kube-apiserver's `/metrics`.
const GC_COUNT_METRIC: &str = "go_gc_duration_seconds_count";

/// How many garbage collections kube-apiserver has completed since it started.
///
/// # Errors
///
/// When `/metrics` cannot be read or does not carry the Go runtime's collection count.
pub async fn collections(client: &kube_client::Client) -> anyhow::Result<u64> {
    let request = http::Request::get("/metrics")
        .header(http::header::ACCEPT, "text/plain")
        .body(Vec::new())
        .context("building GET /metrics")?;
    let text = client
        .request_text(request)
        .await
        .context("GET /metrics of kube-apiserver")?;
    parse_collections(&text)
}

fn parse_collections(metrics: &str) -> anyhow::Result<u64> {
    let Some(line) = metrics
        .lines()
        .find(|line| line.split_whitespace().next() == Some(GC_COUNT_METRIC))
    else {
        bail!("kube-apiserver's /metrics has no {GC_COUNT_METRIC}");
    };
    let value = line.split_whitespace().nth(1).unwrap_or_default();
    // Prometheus' text format may write a count as a float.
    value
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .map(|v| v as u64)
        .with_context(|| format!("{GC_COUNT_METRIC} is not a count: {line:?}"))
}

/// Makes kube-apiserver collect its garbage now and waits until it has: the Go profiler's
/// heap profile with `gc=1` runs a full collection before it answers (kube-apiserver
/// serves the profiler unless started with `--profiling=false`).
///
/// # Errors
///
/// When the request fails, e.g. because profiling is off.
pub async fn collect(client: &kube_client::Client) -> anyhow::Result<()> {
    const URI: &str = "/debug/pprof/heap?gc=1";
    let request = http::Request::get(URI)
        .body(Vec::new())
        .context("building GET of the heap profile")?;
    let mut body = client
        .request_stream(request)
        .await
        .with_context(|| format!("GET {URI} of kube-apiserver"))?;
    let mut profile = Vec::new();
    body.read_to_end(&mut profile)
        .await
        .with_context(|| format!("reading {URI}"))?;
    if profile.is_empty() {
        bail!("kube-apiserver answered {URI} with an empty body");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_count_among_the_summary_lines() {
        let metrics = "# HELP go_gc_duration_seconds A summary.\n\
                       # TYPE go_gc_duration_seconds summary\n\
                       go_gc_duration_seconds{quantile=\"0\"} 1.2e-05\n\
                       go_gc_duration_seconds_sum 0.25\n\
                       go_gc_duration_seconds_count 417\n\
                       go_goroutines 900\n";
        assert_eq!(parse_collections(metrics).unwrap(), 417);
    }

    #[test]
    fn a_missing_or_broken_count_is_an_error() {
        let missing = parse_collections("go_goroutines 900\n").unwrap_err();
        assert!(missing.to_string().contains(GC_COUNT_METRIC), "{missing}");
        let broken = parse_collections("go_gc_duration_seconds_count NaN\n").unwrap_err();
        assert!(broken.to_string().contains("not a count"), "{broken}");
    }
}
