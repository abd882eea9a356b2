//! How far an informer's cache is behind the server, measured: at each period a cheap
//! consistent read of the server's current resourceVersion (a metadata list of at most one
//! object, served from etcd's revision), then the time until the cache has passed it.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::future::BoxFuture;
use kube_core::Resource;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::{latency::Latency, lock};
use crate::{
    error::Error,
    list_watch::{ListOptions, ListWatch},
    reflector::SyncedVersion,
};

/// How stale an informer's cache is, from
/// [`InformerHandle::staleness`](crate::InformerHandle::staleness), for an informer built
/// with a [staleness probe](crate::informer::InformerBuilder::staleness_probe).
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct StalenessStats {
    /// How long ago the oldest probe the cache has not passed yet was sent: zero while the
    /// cache keeps up, growing while its watch is stalled or the server cannot be read.
    pub behind: Duration,
    /// How long the cache took to pass the last probe that it passed.
    pub last: Option<Duration>,
    /// Probes the cache passed.
    pub passed: u64,
    /// Reads of the server's version that failed (the probe is sent again at the next
    /// period, and its age keeps growing).
    pub failed_reads: u64,
    /// Probes passed within each bound (seconds), cumulative, as a Prometheus histogram's
    /// buckets.
    pub buckets: Vec<(f64, u64)>,
    /// The time spent waiting over every passed probe.
    pub total: Duration,
}

/// The server's current resourceVersion, read consistently.
type VersionReader = Arc<dyn Fn() -> BoxFuture<'static, Result<String, Error>> + Send + Sync>;

/// A probe sent and not yet passed.
#[derive(Clone, Copy, Debug)]
struct Pending {
    sent: Instant,
    /// The server's version then, once read.
    target: Option<u64>,
}

/// The probe's current state.
#[derive(Default)]
struct Probes {
    /// The oldest probe the cache has not passed.
    pending: Option<Pending>,
    /// How long the cache took to pass the last probe it passed.
    last: Option<Duration>,
}

/// An informer's staleness probe: its period, its source, and what it measured.
pub(super) struct Staleness {
    period: Duration,
    read: VersionReader,
    probes: Mutex<Probes>,
    measured: Latency,
    failed_reads: AtomicU64,
}

impl Staleness {
    pub(super) fn new<K, L>(period: Duration, list_watch: L) -> Self
    where
        K: Resource + Send + 'static,
        L: ListWatch<K> + Clone,
    {
        let read: VersionReader = Arc::new(move || {
            let list_watch = list_watch.clone();
            Box::pin(async move {
                // No resourceVersion: a consistent read, the storage's current revision.
                let options = ListOptions {
                    limit: Some(1),
                    ..ListOptions::default()
                };
                Ok(list_watch.list_versions(&options).await?.resource_version)
            })
        });
        Self {
            period: period.max(Duration::from_millis(100)),
            read,
            probes: Mutex::default(),
            measured: Latency::default(),
            failed_reads: AtomicU64::new(0),
        }
    }

    pub(super) fn stats(&self) -> StalenessStats {
        let probes = lock(&self.probes);
        StalenessStats {
            behind: probes.pending.map_or(Duration::ZERO, |p| p.sent.elapsed()),
            last: probes.last,
            passed: self.measured.count(),
            failed_reads: self.failed_reads.load(Ordering::Relaxed),
            buckets: self.measured.cumulative_buckets(),
            total: self.measured.total(),
        }
    }

    /// Probes every period until `token`: a probe stays pending (and its age grows) until
    /// the cache has passed the version read for it.
    pub(super) async fn run(&self, version: SyncedVersion, token: CancellationToken) {
        let mut versions = version.subscribe();
        loop {
            let probe = *lock(&self.probes).pending.get_or_insert(Pending {
                sent: Instant::now(),
                target: None,
            });
            let next = Instant::now() + self.period;
            let target = match probe.target {
                Some(target) => Some(target),
                None => tokio::select! {
                    biased;
                    () = token.cancelled() => return,
                    target = self.read_target() => target,
                },
            };
            if let Some(target) = target {
                let passed = |synced: &crate::reflector::Synced| {
                    synced.stopped
                        || synced
                            .resource_version
                            .as_deref()
                            .and_then(|v| v.parse::<u64>().ok())
                            .is_some_and(|v| v >= target)
                };
                let waited = tokio::select! {
                    biased;
                    () = token.cancelled() => return,
                    waited = tokio::time::timeout_at(next, versions.wait_for(passed)) => waited,
                };
                if let Ok(Ok(synced)) = waited
                    && !synced.stopped
                {
                    let took = probe.sent.elapsed();
                    self.measured.record(took);
                    *lock(&self.probes) = Probes {
                        pending: None,
                        last: Some(took),
                    };
                    debug!(took = ?took, "staleness probe passed");
                }
            }
            tokio::select! {
                biased;
                () = token.cancelled() => return,
                () = tokio::time::sleep_until(next) => {}
            }
        }
    }

    /// Reads the server's current version for the pending probe, within the period;
    /// `None` when it could not be read (counted, and read again next period) or is not a
    /// number (a server whose versions are not etcd's revisions: nothing to measure, the
    /// probe is dropped).
    async fn read_target(&self) -> Option<u64> {
        let text = match tokio::time::timeout(self.period, (self.read)()).await {
            Ok(Ok(text)) => text,
            Ok(Err(error)) => {
                self.failed_reads.fetch_add(1, Ordering::Relaxed);
                debug!(%error, "staleness probe: the server's version could not be read");
                return None;
            }
            Err(_) => {
                self.failed_reads.fetch_add(1, Ordering::Relaxed);
                debug!(period = ?self.period, "staleness probe: no answer within the period");
                return None;
            }
        };
        let mut probes = lock(&self.probes);
        match text.parse::<u64>() {
            Ok(target) => {
                if let Some(pending) = probes.pending.as_mut() {
                    pending.target = Some(target);
                }
                Some(target)
            }
            Err(_) => {
                debug!(version = %text, "staleness probe: the server's version is not a number");
                probes.pending = None;
                None
            }
        }
    }
}
