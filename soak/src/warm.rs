//! The warm-restarted subject: a Pod informer in the driver's process, on the subject's
//! faulty link, that keeps a snapshot of its cache ([`WarmRestart`]). Once in each storm it
//! is stopped (which writes the snapshot), left down a few seconds while the writer goes
//! on, and started again from the snapshot. Once it says it has synced, its cache must be
//! the server's state at the version it says it holds: the driver reads that version and
//! the cached objects, then lists the Pods from the server at exactly that version
//! (`resourceVersionMatch=Exact`, straight from the API server) and compares keys and
//! resourceVersions. At the end of the run it is compared once more.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use k8s_openapi::api::core::v1::Pod;
use kube_client::{
    Api, Client,
    api::{ListParams, VersionMatch},
};
use kube_informer::{
    CancellationToken, InformerHandle, RunningInformer, SharedInformer, reflector::WarmRestart,
};
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::{
    check::{Rule, Violation},
    faults::Calendar,
    record::unix_nanos,
};

/// The subject's name in reports.
pub const NAME: &str = "warm-restart";

/// How long a restarted informer may take to sync, storm or not.
const SYNC_BOUND: Duration = Duration::from_secs(90);

/// How often a comparison is tried again when the cache and the list differ: an event
/// applied between reading the cache's version and its objects would show as a
/// difference once, never twice.
const ATTEMPTS: usize = 3;

/// One comparison of the cache with the server.
#[derive(Clone, Debug, Serialize)]
pub struct WarmCheck {
    /// `restart 0`, `restart 1`, …, or `end`.
    pub when: String,
    pub at_ns: i64,
    /// For a restart: the snapshot's size, how long it took to sync, and how it caught up
    /// (`Version`, `Bookmark`; `None`: it fell back to a full list).
    pub snapshot_bytes: Option<u64>,
    pub synced_ms: Option<u64>,
    pub caught_up: Option<String>,
    pub lists: u64,
    pub outcome: Outcome,
}

/// What a comparison found.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// The cache held exactly the server's Pods at `version`.
    Equal { version: u64, objects: usize },
    /// It did not, on every attempt; the last attempt's differences.
    Differs {
        version: u64,
        differences: Vec<String>,
    },
    /// The server could not list at the version (compacted away, or unreachable).
    Unverifiable { reason: String },
    /// The informer did not sync within the bound after its restart.
    NotSynced,
}

/// What the warm restarts showed.
#[derive(Clone, Debug, Default, Serialize)]
pub struct WarmSummary {
    pub restarts: usize,
    /// Restarts whose watch resumed from the snapshot, and those that listed again.
    pub resumed: usize,
    pub relisted: usize,
    /// Comparisons that found the cache equal to the server's list at its version.
    pub verified: usize,
    pub unverifiable: usize,
    pub checks: Vec<WarmCheck>,
}

/// The informer and where it keeps its snapshot.
pub struct WarmSubject {
    client: Client,
    snapshot: PathBuf,
    informer: Option<RunningInformer<Pod>>,
    cancel: CancellationToken,
}

impl WarmSubject {
    /// Starts the informer on `client` (the fault proxy's), keeping its snapshot at
    /// `snapshot`.
    pub fn start(client: Client, snapshot: PathBuf) -> Self {
        let cancel = CancellationToken::new();
        let mut subject = Self {
            client,
            snapshot,
            informer: None,
            cancel,
        };
        subject.spawn();
        subject
    }

    fn spawn(&mut self) {
        let informer = SharedInformer::builder(Api::<Pod>::all(self.client.clone()))
            .warm_restart(WarmRestart::at(&self.snapshot))
            .build()
            .spawn(self.cancel.child_token());
        self.informer = Some(informer);
    }

    pub fn has_synced(&self) -> bool {
        self.informer.as_ref().is_some_and(|i| i.has_synced())
    }

    fn handle(&self) -> Option<InformerHandle<Pod>> {
        self.informer.as_ref().map(RunningInformer::handle)
    }

    /// Stops the informer (writing its snapshot), waits `down` (or until `stop`), starts
    /// it again from the snapshot, and compares it with the server once it has synced.
    async fn restart(
        &mut self,
        n: u32,
        down: Duration,
        admin: &Client,
        stop: &CancellationToken,
    ) -> WarmCheck {
        if let Some(informer) = self.informer.take() {
            informer.stop().await;
        }
        let snapshot_bytes = std::fs::metadata(&self.snapshot).map(|m| m.len()).ok();
        info!(
            restart = n,
            ?snapshot_bytes,
            down_ms = down.as_millis() as u64,
            "warm restart: stopped"
        );
        tokio::select! {
            () = stop.cancelled() => {}
            () = tokio::time::sleep(down) => {}
        }
        self.spawn();
        let started = tokio::time::Instant::now();
        let handle = self.handle().expect("just started");
        let synced = tokio::time::timeout(SYNC_BOUND, handle.wait_synced())
            .await
            .is_ok();
        let stats = handle.reflector_stats();
        let mut check = WarmCheck {
            when: format!("restart {n}"),
            at_ns: unix_nanos(),
            snapshot_bytes,
            synced_ms: synced.then(|| started.elapsed().as_millis() as u64),
            caught_up: stats.warm_restart_caught_up.map(|c| format!("{c:?}")),
            lists: stats.lists,
            outcome: Outcome::NotSynced,
        };
        if synced {
            check.outcome = compare(&handle, admin).await;
        }
        info!(restart = n, synced_ms = check.synced_ms, caught_up = ?check.caught_up, outcome = ?check.outcome, "warm restart: checked");
        check
    }

    /// Compares the cache with the server now.
    pub async fn check_now(&self, when: &str, admin: &Client) -> WarmCheck {
        let outcome = match self.handle() {
            Some(handle) => compare(&handle, admin).await,
            None => Outcome::NotSynced,
        };
        WarmCheck {
            when: when.to_owned(),
            at_ns: unix_nanos(),
            snapshot_bytes: None,
            synced_ms: None,
            caught_up: None,
            lists: 0,
            outcome,
        }
    }

    /// Stops the informer and waits for its tasks.
    pub async fn stop(mut self) {
        self.cancel.cancel();
        if let Some(informer) = self.informer.take() {
            informer.stop().await;
        }
    }
}

/// Restarts `subject` once in each storm of `calendar`, a moment into it, until `stop`;
/// returns it with the checks made.
pub async fn restarts(
    mut subject: WarmSubject,
    admin: Client,
    seed: u64,
    calendar: Calendar,
    stop: CancellationToken,
) -> (WarmSubject, Vec<WarmCheck>) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x3a7d_5eed);
    let mut checks = Vec::new();
    for n in 0u32.. {
        let Some(storm) = calendar.storm(n) else {
            break;
        };
        let at = calendar.start + storm + calendar.storm.mul_f64(rng.random_range(0.1..0.6));
        let down = Duration::from_millis(rng.random_range(1_000..5_000));
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep_until(at) => {}
        }
        checks.push(subject.restart(n, down, &admin, &stop).await);
    }
    (subject, checks)
}

/// The cache's objects against the server's at the cache's version, up to [`ATTEMPTS`]
/// times while they differ.
async fn compare(handle: &InformerHandle<Pod>, admin: &Client) -> Outcome {
    let mut last = None;
    for _ in 0..ATTEMPTS {
        let (version, cached) = match cached_at_one_version(handle).await {
            Ok(read) => read,
            Err(reason) => return Outcome::Unverifiable { reason },
        };
        let server = match listed_at(admin, version).await {
            Ok(server) => server,
            Err(reason) => return Outcome::Unverifiable { reason },
        };
        if server == cached {
            return Outcome::Equal {
                version,
                objects: cached.len(),
            };
        }
        last = Some((version, differences(&cached, &server)));
    }
    let (version, differences) = last.unwrap_or_default();
    Outcome::Differs {
        version,
        differences,
    }
}

/// A cached Pod's name and version, read from its bytes without decoding the rest.
#[derive(Deserialize)]
struct Named {
    metadata: NamedMeta,
}

#[derive(Deserialize)]
struct NamedMeta {
    name: String,
    namespace: String,
    #[serde(rename = "resourceVersion")]
    resource_version: String,
}

/// The cache's keys and resourceVersions with the version they are the state at: read
/// again until the version is the same before and after the objects and no object is
/// newer than it (an event applied meanwhile). Why no read would do is the error.
async fn cached_at_one_version(
    handle: &InformerHandle<Pod>,
) -> Result<(u64, BTreeMap<String, u64>), String> {
    let version = || {
        handle
            .last_sync_resource_version()
            .and_then(|v| v.parse::<u64>().ok())
    };
    let (mut moved, mut newer, mut unknown) = (0, 0, 0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline {
        let before = version();
        let objects = handle
            .store()
            .list_as::<Named>()
            .map_err(|error| format!("reading the cache: {error}"))?;
        let after = version();
        let cached: BTreeMap<String, u64> = objects
            .iter()
            .filter_map(|pod| {
                let meta = &pod.metadata;
                Some((
                    format!("{}/{}", meta.namespace, meta.name),
                    meta.resource_version.parse().ok()?,
                ))
            })
            .collect();
        match (before, after) {
            (Some(before), Some(after)) if before != after => moved += 1,
            (Some(before), Some(_)) if cached.len() != objects.len() => {
                return Err(format!(
                    "cached Pods without a numeric resourceVersion at {before}"
                ));
            }
            (Some(before), Some(_)) if cached.values().any(|&rv| rv > before) => newer += 1,
            (Some(before), Some(_)) => return Ok((before, cached)),
            _ => unknown += 1,
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Err(format!(
        "no read of the cache within 10 s held one version ({moved} reads saw it move, {newer} found an object newer than it, {unknown} found it unknown)"
    ))
}

/// The server's Pods at exactly `version`, read straight from the API server; retried
/// while it is unreachable.
async fn listed_at(admin: &Client, version: u64) -> Result<BTreeMap<String, u64>, String> {
    let pods = Api::<Pod>::all(admin.clone());
    let params = ListParams::default()
        .at(&version.to_string())
        .matching(VersionMatch::Exact);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match pods.list_metadata(&params).await {
            Ok(list) => {
                return Ok(list
                    .items
                    .iter()
                    .filter_map(|pod| {
                        let meta = &pod.metadata;
                        Some((
                            format!("{}/{}", meta.namespace.as_deref()?, meta.name.as_deref()?),
                            meta.resource_version.as_deref()?.parse().ok()?,
                        ))
                    })
                    .collect());
            }
            Err(kube_client::Error::Api(status)) if status.code == 410 => {
                return Err(format!("version {version} was compacted away"));
            }
            Err(error) if tokio::time::Instant::now() < deadline => {
                warn!(%error, version, "listing at the cache's version failed; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(error) => return Err(format!("listing at version {version}: {error}")),
        }
    }
}

/// What differs, a few keys of each kind.
fn differences(cached: &BTreeMap<String, u64>, server: &BTreeMap<String, u64>) -> Vec<String> {
    let mut found = Vec::new();
    for (key, rv) in server {
        match cached.get(key) {
            None => found.push(format!("{key} missing (the server has it at {rv})")),
            Some(cached) if cached != rv => {
                found.push(format!("{key} at {cached}; the server has it at {rv}"));
            }
            Some(_) => {}
        }
    }
    for (key, rv) in cached {
        if !server.contains_key(key) {
            found.push(format!("{key} cached at {rv}; the server does not have it"));
        }
    }
    let more = found.len().saturating_sub(8);
    found.truncate(8);
    if more > 0 {
        found.push(format!("and {more} more"));
    }
    found
}

/// The violations the checks found, and the summary.
pub fn check(checks: Vec<WarmCheck>, storms: bool) -> (Vec<Violation>, WarmSummary) {
    let mut violations = Vec::new();
    let mut summary = WarmSummary::default();
    for check in &checks {
        let restart = check.when.starts_with("restart");
        if restart {
            summary.restarts += 1;
            if check.caught_up.is_some() {
                summary.resumed += 1;
            } else if check.synced_ms.is_some() {
                summary.relisted += 1;
            }
        }
        let mut violate = |detail: String| {
            violations.push(Violation {
                rule: Rule::WarmRestart,
                source: NAME.to_owned(),
                key: check.when.clone(),
                detail,
            });
        };
        match &check.outcome {
            Outcome::Equal { .. } => summary.verified += usize::from(restart),
            Outcome::Unverifiable { .. } => summary.unverifiable += 1,
            Outcome::Differs {
                version,
                differences,
            } => violate(format!(
                "the synced cache is not the server's state at {version}: {}",
                differences.join("; ")
            )),
            Outcome::NotSynced => violate(format!(
                "not synced within {} s of its restart",
                SYNC_BOUND.as_secs()
            )),
        }
    }
    if storms && summary.verified == 0 {
        violations.push(Violation {
            rule: Rule::WarmRestart,
            source: NAME.to_owned(),
            key: String::new(),
            detail: format!(
                "no restart's cache was compared with the server ({} restarts, {} unverifiable): the check held nothing",
                summary.restarts, summary.unverifiable
            ),
        });
    }
    summary.checks = checks;
    (violations, summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn restart(n: u32, caught_up: Option<&str>, outcome: Outcome) -> WarmCheck {
        WarmCheck {
            when: format!("restart {n}"),
            at_ns: 0,
            snapshot_bytes: Some(1),
            synced_ms: Some(5),
            caught_up: caught_up.map(str::to_owned),
            lists: 0,
            outcome,
        }
    }

    fn rules(checks: Vec<WarmCheck>, storms: bool) -> Vec<Rule> {
        check(checks, storms)
            .0
            .into_iter()
            .map(|v| v.rule)
            .collect()
    }

    #[test]
    fn a_cache_unlike_the_server_s_or_never_synced_is_caught() {
        let equal = Outcome::Equal {
            version: 10,
            objects: 3,
        };
        assert_eq!(
            rules(vec![restart(0, Some("Version"), equal.clone())], true),
            []
        );
        let differs = Outcome::Differs {
            version: 10,
            differences: vec!["ns/a missing (the server has it at 9)".into()],
        };
        assert_eq!(
            rules(
                vec![
                    restart(0, Some("Version"), equal.clone()),
                    restart(1, None, differs)
                ],
                true
            ),
            [Rule::WarmRestart]
        );
        assert_eq!(
            rules(
                vec![
                    restart(0, None, equal),
                    restart(1, None, Outcome::NotSynced)
                ],
                true
            ),
            [Rule::WarmRestart]
        );
    }

    #[test]
    fn a_run_whose_restarts_were_never_compared_fails() {
        let unverifiable = Outcome::Unverifiable {
            reason: "compacted".into(),
        };
        assert_eq!(
            rules(vec![restart(0, None, unverifiable)], true),
            [Rule::WarmRestart]
        );
        // A run without a storm restarts nothing, and says so without failing.
        assert_eq!(rules(Vec::new(), false), []);
    }

    #[test]
    fn differences_name_missing_stale_and_extra_objects() {
        let cached = BTreeMap::from([("ns/a".to_owned(), 5), ("ns/b".to_owned(), 6)]);
        let server = BTreeMap::from([("ns/a".to_owned(), 7), ("ns/c".to_owned(), 8)]);
        assert_eq!(
            differences(&cached, &server),
            [
                "ns/a at 5; the server has it at 7",
                "ns/c missing (the server has it at 8)",
                "ns/b cached at 6; the server does not have it",
            ]
        );
    }
}
