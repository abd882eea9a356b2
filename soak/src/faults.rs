//! Faults: a schedule drawn from the run's seed, and the code that injects each fault
//! into the real control plane and the Toxiproxies in front of it.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use clap::ValueEnum;
use kube_testenv::{FaultProxy, TestEnv};
use rand::{Rng, SeedableRng, rngs::StdRng, seq::IndexedRandom};
use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::record::unix_nanos;

/// A kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// Every connection through the subjects' proxies is reset, for the whole hold.
    Reset,
    /// Nothing passes the subjects' proxies, and nothing is closed: a stalled link.
    Stall,
    /// The subjects' links get 200 to 800 ms of latency each way down.
    Latency,
    /// The subjects' links are limited to 32 to 256 KB/s.
    Bandwidth,
    /// kube-apiserver is killed (SIGKILL) and started again after the hold.
    KillApiserver,
    /// etcd is compacted to its current revision: a watch resumed from before it, once
    /// the API server's watch cache no longer serves it, gets 410 Gone.
    Compact,
    /// etcd is compacted, then kube-apiserver killed and started again: every watch
    /// resumes from a version the new watch cache no longer has, and relists.
    CompactAndKill,
    /// etcd is stopped and started again after the hold, the API server left running.
    RestartEtcd,
}

impl FaultKind {
    /// Whether the fault holds the writer up too (the writer talks to the API server
    /// directly, not through the subjects' proxies).
    /// The Toxiproxy toxics a proxy fault adds, as the proxy names them.
    fn toxics(self) -> &'static [&'static str] {
        match self {
            FaultKind::Reset => &["reset_peer_upstream", "reset_peer_downstream"],
            FaultKind::Stall => &["timeout_upstream", "timeout_downstream"],
            FaultKind::Latency => &["latency_downstream"],
            FaultKind::Bandwidth => &["bandwidth_downstream"],
            _ => &[],
        }
    }

    fn on_proxies(self) -> bool {
        matches!(
            self,
            FaultKind::Reset | FaultKind::Stall | FaultKind::Latency | FaultKind::Bandwidth
        )
    }
}

/// The run's calendar: calm spells of `calm` and storms of `storm` in turn from `start`,
/// the run starting calm, until `span` has passed: the calendar [`plan`] draws faults on,
/// which the subjects' own disruptions (replicas killed, informers restarted) follow too.
#[derive(Clone, Copy, Debug)]
pub struct Calendar {
    pub start: Instant,
    pub span: Duration,
    pub calm: Duration,
    pub storm: Duration,
}

impl Calendar {
    /// When storm `n` (from 0) starts, counted from `start`; `None` once past the span.
    pub fn storm(&self, n: u32) -> Option<Duration> {
        let cycle = self.calm + self.storm;
        let at = self.calm + cycle * n;
        (!cycle.is_zero() && at < self.span).then_some(at)
    }
}

/// One fault of the schedule.
#[derive(Clone, Debug, Serialize)]
pub struct PlannedFault {
    pub kind: FaultKind,
    /// From the start of the load.
    pub at: Duration,
    pub hold: Duration,
    /// A size drawn for the fault (latency ms, bandwidth KB/s), 0 for the others.
    pub amount: u64,
}

/// Draws the schedule: calm spells of `calm` and storms of `storm` in turn, the run
/// starting calm; during a storm a fault starts about every `every`, of the enabled kinds,
/// sometimes while another is still held (faults of one kind never overlap: a proxy's
/// toxic of one kind is one toxic). Calm spells are where the checks hold delivery to its
/// bound.
pub fn plan(
    seed: u64,
    span: Duration,
    every: Duration,
    calm: Duration,
    storm: Duration,
    kinds: &[FaultKind],
) -> Vec<PlannedFault> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_fa17);
    let mut faults = Vec::new();
    let mut busy_until: Vec<(FaultKind, Duration)> = Vec::new();
    let cycle = calm + storm;
    let mut at = calm;
    while at < span && !cycle.is_zero() {
        let in_cycle = Duration::from_nanos((at.as_nanos() % cycle.as_nanos()) as u64);
        if in_cycle < calm {
            at += calm - in_cycle;
            continue;
        }
        let storm_ends = at + (cycle - in_cycle);
        let Some(&kind) = kinds.choose(&mut rng) else {
            break;
        };
        let free = busy_until
            .iter()
            .all(|&(k, until)| k != kind || until <= at);
        if free {
            let hold = match kind {
                FaultKind::Compact => Duration::ZERO,
                FaultKind::KillApiserver | FaultKind::CompactAndKill => {
                    Duration::from_millis(rng.random_range(500..4_000))
                }
                FaultKind::RestartEtcd => Duration::from_millis(rng.random_range(500..3_000)),
                _ => Duration::from_millis(rng.random_range(1_000..8_000)),
            }
            .min(storm_ends.min(span).saturating_sub(at));
            let amount = match kind {
                FaultKind::Latency => rng.random_range(200..800),
                FaultKind::Bandwidth => rng.random_range(32..256),
                _ => 0,
            };
            faults.push(PlannedFault {
                kind,
                at,
                hold,
                amount,
            });
            busy_until.retain(|&(k, _)| k != kind);
            busy_until.push((kind, at + hold));
        }
        // Mostly spaced out, sometimes on top of the last one.
        let gap = if rng.random_bool(0.3) {
            every / 4
        } else {
            every.mul_f64(rng.random_range(0.5..1.5))
        };
        at += gap;
    }
    faults
}

/// A fault as it happened.
#[derive(Clone, Debug, Serialize)]
pub struct Injected {
    pub kind: FaultKind,
    pub applied_ns: i64,
    pub lifted_ns: i64,
    /// Whether the fault also held up the writer.
    pub on_writer: bool,
    /// Set when injecting or lifting failed.
    pub error: Option<String>,
}

/// Faults as they happen, shared with the driver.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<Injected>>>);

impl Log {
    pub fn snapshot(&self) -> Vec<Injected> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn push(&self, injected: Injected) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(injected);
    }
}

/// Injects the schedule, from `start`, until it ends or `stop` fires; then lifts
/// whatever is still held and leaves the control plane up.
pub async fn inject(
    env: Arc<TestEnv>,
    proxies: Arc<Vec<FaultProxy>>,
    schedule: Vec<PlannedFault>,
    start: Instant,
    log: Log,
    stop: CancellationToken,
) {
    let mut held = tokio::task::JoinSet::new();
    // The API server and etcd are one each: their faults take turns. So do two faults of
    // one kind on the proxies: they share toxic names, and the first one's lift would
    // remove the second's toxics.
    let control_plane = Arc::new(tokio::sync::Mutex::new(()));
    let proxy_turns: Arc<std::collections::BTreeMap<FaultKind, tokio::sync::Mutex<()>>> = Arc::new(
        FaultKind::value_variants()
            .iter()
            .filter(|kind| kind.on_proxies())
            .map(|kind| (*kind, tokio::sync::Mutex::new(())))
            .collect(),
    );
    for fault in schedule {
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep_until(start + fault.at) => {}
        }
        let (env, proxies, log, control_plane, proxy_turns) = (
            env.clone(),
            proxies.clone(),
            log.clone(),
            control_plane.clone(),
            proxy_turns.clone(),
        );
        held.spawn(async move {
            let turn = match proxy_turns.get(&fault.kind) {
                Some(kind_turn) => kind_turn,
                None => &*control_plane,
            };
            let _turn = turn.lock().await;
            let applied_ns = unix_nanos();
            info!(kind = ?fault.kind, hold_ms = fault.hold.as_millis() as u64, amount = fault.amount, "fault");
            let outcome = apply(&env, &proxies, &fault).await;
            let outcome = match outcome {
                Ok(()) => {
                    tokio::time::sleep(fault.hold).await;
                    lift(&env, &proxies, fault.kind).await
                }
                Err(error) => {
                    // Whatever half happened is undone.
                    let _ = lift(&env, &proxies, fault.kind).await;
                    Err(error)
                }
            };
            if let Err(error) = &outcome {
                warn!(kind = ?fault.kind, %error, "a fault could not be injected or lifted");
            }
            log.push(Injected {
                kind: fault.kind,
                applied_ns,
                lifted_ns: unix_nanos(),
                on_writer: !fault.kind.on_proxies(),
                error: outcome.err().map(|e| format!("{e:#}")),
            });
        });
    }
    while held.join_next().await.is_some() {}
    for proxy in proxies.iter() {
        if let Err(error) = proxy.reset().await {
            warn!(%error, "a proxy could not be reset");
        }
    }
}

async fn apply(env: &TestEnv, proxies: &[FaultProxy], fault: &PlannedFault) -> anyhow::Result<()> {
    for proxy in proxies {
        match fault.kind {
            FaultKind::Reset => proxy.reset_connections().await?,
            FaultKind::Stall => proxy.stall().await?,
            FaultKind::Latency => {
                let latency = Duration::from_millis(fault.amount);
                proxy.latency(latency, latency / 4).await?;
            }
            FaultKind::Bandwidth => proxy.bandwidth(fault.amount).await?,
            _ => {}
        }
    }
    match fault.kind {
        FaultKind::KillApiserver => env.kill_apiserver().await,
        FaultKind::Compact => compact(env).await?,
        FaultKind::CompactAndKill => {
            compact(env).await?;
            env.kill_apiserver().await;
        }
        FaultKind::RestartEtcd => env.stop_etcd().await,
        _ => {}
    }
    Ok(())
}

/// Compacts etcd to its current revision; one already compacted there (no write since
/// the last compaction) is compacted already.
async fn compact(env: &TestEnv) -> anyhow::Result<()> {
    match env.compact_etcd().await {
        Err(error)
            if error
                .to_string()
                .contains("required revision has been compacted") =>
        {
            Ok(())
        }
        outcome => outcome.map(drop).map_err(Into::into),
    }
}

async fn lift(env: &TestEnv, proxies: &[FaultProxy], kind: FaultKind) -> anyhow::Result<()> {
    match kind {
        FaultKind::KillApiserver | FaultKind::CompactAndKill => {
            if !env.apiserver_running() {
                env.start_apiserver().await?;
            }
        }
        FaultKind::RestartEtcd => env.start_etcd().await?,
        FaultKind::Compact => {}
        kind => {
            // Only this fault's toxics: another fault may still be held on the proxies.
            for proxy in proxies {
                for toxic in kind.toxics() {
                    proxy.remove_toxic(toxic).await?;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_is_the_seed_s_and_keeps_its_calm_spells() {
        let kinds = [FaultKind::Reset, FaultKind::Stall, FaultKind::KillApiserver];
        let (span, every) = (Duration::from_secs(300), Duration::from_secs(4));
        let (calm, storm) = (Duration::from_secs(15), Duration::from_secs(30));
        let one = plan(7, span, every, calm, storm, &kinds);
        let again = plan(7, span, every, calm, storm, &kinds);
        assert_eq!(format!("{one:?}"), format!("{again:?}"));
        assert_ne!(
            format!("{one:?}"),
            format!("{:?}", plan(8, span, every, calm, storm, &kinds))
        );
        assert!(one.len() > 20, "{} faults", one.len());
        for fault in &one {
            let start = fault.at.as_secs_f64() % 45.0;
            let end = start + fault.hold.as_secs_f64();
            assert!(
                start >= 15.0 && end <= 45.0 + 1e-9,
                "{fault:?} outside a storm"
            );
        }
        for (i, a) in one.iter().enumerate() {
            for b in &one[i + 1..] {
                if a.kind == b.kind {
                    assert!(b.at >= a.at + a.hold, "{a:?} overlaps {b:?}");
                }
            }
        }
    }
}
