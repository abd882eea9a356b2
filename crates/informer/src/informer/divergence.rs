//! The divergence check: is the cache still the server's state? Compared, at a chosen
//! interval, with a fresh list of keys and resourceVersions.

use std::{
    collections::HashMap,
    fmt,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::future::BoxFuture;
use kube_client::api::VersionMatch;
use kube_core::Resource;
use tokio::sync::Notify;
use tracing::{debug, warn};

use super::processor::Processor;
use crate::{
    error::Error,
    key::ObjectKey,
    list_watch::{ListOptions, ListWatch, Shard, VersionPage},
};

/// When and how an informer checks its cache against the server; see
/// [`InformerBuilder::divergence_check`](crate::informer::InformerBuilder::divergence_check).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DivergenceCheck {
    interval: Option<Duration>,
    repair: Repair,
}

/// What a divergence check does about a cache that drifted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Repair {
    /// Report it (log, hook, counters) and nothing more.
    #[default]
    Report,
    /// Report it, then relist from a consistent read (`resourceVersion=""`), which does not
    /// depend on the API server's watch cache.
    Relist,
}

impl DivergenceCheck {
    /// A check every `interval`.
    pub fn every(interval: Duration) -> Self {
        Self {
            interval: Some(interval),
            repair: Repair::Report,
        }
    }

    /// No periodic check; only [`InformerHandle::check_divergence`](crate::InformerHandle::check_divergence).
    pub fn on_demand() -> Self {
        Self {
            interval: None,
            repair: Repair::Report,
        }
    }

    /// What to do on drift (default [`Repair::Report`]).
    #[must_use]
    pub fn repair(mut self, repair: Repair) -> Self {
        self.repair = repair;
        self
    }

    pub(super) fn interval(&self) -> Option<Duration> {
        self.interval
    }
}

/// How a cache differs from the server at one resourceVersion.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Drift {
    /// The server's version both were compared at.
    pub resource_version: String,
    /// On the server, not in the cache (a missed add).
    pub missing: Vec<ObjectKey>,
    /// In the cache, not on the server (a missed delete).
    pub stale: Vec<ObjectKey>,
    /// In both, at different versions (a missed update).
    pub outdated: Vec<OutdatedObject>,
}

/// An object cached at another version than the server's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutdatedObject {
    /// The object's key.
    pub key: ObjectKey,
    /// The cached resourceVersion.
    pub cached: String,
    /// The server's.
    pub server: String,
}

impl Drift {
    /// No difference.
    pub fn is_empty(&self) -> bool {
        self.missing.is_empty() && self.stale.is_empty() && self.outdated.is_empty()
    }

    /// How many objects differ.
    pub fn len(&self) -> usize {
        self.missing.len() + self.stale.len() + self.outdated.len()
    }
}

/// At most this many keys of each kind are named in a drift's message.
const NAMED: usize = 10;

impl fmt::Display for Drift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn keys<'a>(keys: impl ExactSizeIterator<Item = &'a ObjectKey>) -> String {
            let total = keys.len();
            let mut named: Vec<&str> = keys.take(NAMED).map(ObjectKey::as_str).collect();
            if total > NAMED {
                named.push("...");
            }
            named.join(", ")
        }
        write!(
            f,
            "at resourceVersion {}: {} missing [{}], {} stale [{}], {} outdated [{}]",
            self.resource_version,
            self.missing.len(),
            keys(self.missing.iter()),
            self.stale.len(),
            keys(self.stale.iter()),
            self.outdated.len(),
            keys(self.outdated.iter().map(|o| &o.key)),
        )
    }
}

/// What an informer's divergence checks found, from
/// [`InformerHandle::divergence_stats`](crate::InformerHandle::divergence_stats).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DivergenceStats {
    /// Checks that compared the cache with the server.
    pub checks: u64,
    /// Checks skipped: a full list was being applied, or the version to compare at had
    /// been compacted away.
    pub skipped: u64,
    /// Checks that found a drift.
    pub drifts: u64,
    /// Objects found drifted, summed over all checks.
    pub drifted_objects: u64,
}

/// The counters behind [`DivergenceStats`].
#[derive(Debug, Default)]
pub(super) struct DivergenceCounters {
    checks: AtomicU64,
    skipped: AtomicU64,
    drifts: AtomicU64,
    drifted_objects: AtomicU64,
}

impl DivergenceCounters {
    pub(super) fn snapshot(&self) -> DivergenceStats {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        DivergenceStats {
            checks: read(&self.checks),
            skipped: read(&self.skipped),
            drifts: read(&self.drifts),
            drifted_objects: read(&self.drifted_objects),
        }
    }
}

/// Lists one page of keys and versions; the informer's [`ListWatch`], type-erased.
type VersionLister =
    Arc<dyn Fn(ListOptions) -> BoxFuture<'static, Result<VersionPage, Error>> + Send + Sync>;

/// An informer's divergence check: its settings, its source and its counters.
pub(super) struct Divergence {
    pub(super) check: DivergenceCheck,
    lister: VersionLister,
    pub(super) stats: DivergenceCounters,
    /// Wakes the reflector for a relist from a consistent read.
    pub(super) relist: Arc<Notify>,
    resource: String,
    /// The informer's shard: the check compares the cache with the shard's objects.
    shard: Option<Shard>,
}

/// Objects per page of a check's list.
const PAGE: u32 = 500;

impl Divergence {
    pub(super) fn new<K, L>(check: DivergenceCheck, list_watch: L, relist: Arc<Notify>) -> Self
    where
        K: Resource + Send + 'static,
        L: ListWatch<K> + Clone,
    {
        let resource = list_watch.resource();
        let lister: VersionLister = Arc::new(move |options: ListOptions| {
            let list_watch = list_watch.clone();
            Box::pin(async move { list_watch.list_versions(&options).await })
        });
        Self {
            check,
            lister,
            stats: DivergenceCounters::default(),
            relist,
            resource,
            shard: None,
        }
    }

    /// Compares with `shard`'s objects only (the informer's shard).
    pub(super) fn set_shard(&mut self, shard: Option<Shard>) {
        self.shard = shard;
    }

    /// Compares the cache with the server at the version the cache holds, exactly (a list
    /// with `resourceVersionMatch=Exact`), so events in flight cannot look like drift.
    /// `None` when the check was skipped. A drift is logged, counted and repaired as the
    /// check says.
    ///
    /// # Errors
    ///
    /// The list's error, other than an expired version (which skips the check).
    pub(super) async fn run_once<K: Resource + Send + Sync + 'static>(
        &self,
        processor: &Processor<K>,
    ) -> Result<Option<Drift>, Error> {
        let Some((version, mut cached)) = processor.versions() else {
            debug!(resource = %self.resource, "divergence check skipped: a list is being applied");
            self.stats.skipped.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        };
        let server = match self.list_at(&version).await {
            Ok(server) => server,
            Err(error) if error.is_gone() => {
                debug!(resource = %self.resource, %version, "divergence check skipped: version compacted");
                self.stats.skipped.fetch_add(1, Ordering::Relaxed);
                return Ok(None);
            }
            Err(error) => return Err(error),
        };
        let mut drift = Drift {
            resource_version: version,
            ..Drift::default()
        };
        for (key, server_rv) in server {
            match cached.remove(&key) {
                None => drift.missing.push(key),
                Some(cached_rv) if cached_rv != server_rv => drift.outdated.push(OutdatedObject {
                    key,
                    cached: cached_rv,
                    server: server_rv,
                }),
                Some(_) => {}
            }
        }
        drift.stale = cached.into_keys().collect();
        drift.missing.sort();
        drift.stale.sort();
        drift.outdated.sort_by(|a, b| a.key.cmp(&b.key));
        self.stats.checks.fetch_add(1, Ordering::Relaxed);
        if drift.is_empty() {
            debug!(resource = %self.resource, version = %drift.resource_version, "cache matches the server");
            return Ok(Some(drift));
        }
        self.stats.drifts.fetch_add(1, Ordering::Relaxed);
        self.stats
            .drifted_objects
            .fetch_add(drift.len() as u64, Ordering::Relaxed);
        warn!(
            resource = %self.resource,
            missing = drift.missing.len(),
            stale = drift.stale.len(),
            outdated = drift.outdated.len(),
            repair = ?self.check.repair,
            "the cache diverged from the server: {drift}"
        );
        if self.check.repair == Repair::Relist {
            self.relist.notify_one();
        }
        Ok(Some(drift))
    }

    /// Every key and version the server had at `version`.
    async fn list_at(&self, version: &str) -> Result<HashMap<ObjectKey, String>, Error> {
        let mut objects = HashMap::new();
        let mut options = ListOptions {
            limit: Some(PAGE),
            continue_token: None,
            resource_version: Some(version.to_owned()),
            version_match: Some(VersionMatch::Exact),
            shard: self.shard.clone(),
        };
        loop {
            let page = (self.lister)(options.clone()).await?;
            objects.extend(
                page.items
                    .into_iter()
                    .map(|item| (item.key, item.resource_version)),
            );
            match page.continue_token {
                Some(token) => {
                    options = ListOptions {
                        limit: Some(PAGE),
                        continue_token: Some(token),
                        resource_version: None,
                        version_match: None,
                        shard: self.shard.clone(),
                    };
                }
                None => return Ok(objects),
            }
        }
    }
}
