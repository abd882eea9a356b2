//! How far an informer's cache is behind the server, measured: at each period a cheap
//! consistent read of the server's current resourceVersion (a metadata list of at most one
//! object, served from etcd's revision), then the time until the cache has passed it.

use std::{
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::future::BoxFuture;
use kube_core::Resource;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::latency::Latency;
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

/// An informer's staleness probe: its period, its source, and what it measured.
pub(super) struct Staleness {
    pub(super) period: Duration,
    read: VersionReader,
    pending: Mutex<Option<Pending>>,
    last: Mutex<Option<Duration>>,
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
            pending: Mutex::new(None),
            last: Mutex::new(None),
            measured: Latency::default(),
            failed_reads: AtomicU64::new(0),
        }
    }

    pub(super) fn stats(&self) -> StalenessStats {
        let behind = lock(&self.pending).map_or(Duration::ZERO, |p| p.sent.elapsed());
        StalenessStats {
            behind,
            last: *lock(&self.last),
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
            let probe = *lock(&self.pending).get_or_insert(Pending {
                sent: Instant::now(),
                target: None,
            });
            let next = Instant::now() + self.period;
            let target = match probe.target {
                Some(target) => Some(target),
                None => {
                    let read = tokio::select! {
                        biased;
                        () = token.cancelled() => return,
                        read = tokio::time::timeout(self.period, (self.read)()) => read,
                    };
                    match read {
                        Ok(Ok(text)) => match text.parse::<u64>() {
                            Ok(target) => {
                                if let Some(pending) = lock(&self.pending).as_mut() {
                                    pending.target = Some(target);
                                }
                                Some(target)
                            }
                            Err(_) => {
                                // A server whose versions are not etcd's revisions cannot be
                                // compared; nothing to measure.
                                debug!(version = %text, "staleness probe: the server's version is not a number");
                                *lock(&self.pending) = None;
                                None
                            }
                        },
                        Ok(Err(error)) => {
                            self.failed_reads.fetch_add(1, Ordering::Relaxed);
                            debug!(%error, "staleness probe: the server's version could not be read");
                            None
                        }
                        Err(_) => {
                            self.failed_reads.fetch_add(1, Ordering::Relaxed);
                            debug!(period = ?self.period, "staleness probe: no answer within the period");
                            None
                        }
                    }
                }
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
                    *lock(&self.last) = Some(took);
                    *lock(&self.pending) = None;
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
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
