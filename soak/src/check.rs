//! The checks: every stream of events (one handler of one subject, one resource) and
//! every controller's reconciles held against the server's history. The leader-elected
//! subject's rules are checked in [`crate::leader_check`], the warm restarts' in
//! [`crate::warm`].

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

use crate::record::{
    EventRecord, EventType, ObjectId, ReconcileRecord, Resource, ServerHistory, Stream,
};

/// What a violation broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    /// A key's events went back in resourceVersion.
    Ordered,
    /// An update or delete of a key the handler had no object for, or an add of one it had.
    Lifecycle,
    /// An event showed a state the server never had.
    RealState,
    /// The handler's last state of a key is not the server's final state.
    FinalState,
    /// A write made while no fault was active reached the handler late, or never.
    Lag,
    /// A handler went from one state of a key to a later one, skipping states between,
    /// without a relist in between: a watch resumed from a version delivers every
    /// change after it, so only a relist may pass over one.
    Complete,
    /// A controller's last reconcile of a key did not see the key's final state.
    LevelTriggered,
    /// A controller reconciled one key twice at once (in one process, or in two of its
    /// replicas).
    Exclusive,
    /// A replica of the leader-elected controller reconciled, created a child or ran a
    /// cleanup outside its own term of the Lease ([`crate::leader_check`]).
    Fenced,
    /// A parent got a second child that its creator's reads should have shown it already
    /// had: its cache's version, its term's fence, or its own write.
    SingleChild,
    /// A deleted parent's cleanup never ran, ran for a parent that lives on, or ran again
    /// where the finalizer promises once.
    CleanupOnce,
    /// A warm-restarted informer, synced, held something other than the server's state
    /// at its version, or did not sync ([`crate::warm`]).
    WarmRestart,
    /// Something the run itself observed: a panic, an error logged without its cause,
    /// tasks left running, a subject that did not stop cleanly.
    Process,
}

/// One broken promise.
#[derive(Clone, Debug, Serialize)]
pub struct Violation {
    pub rule: Rule,
    /// The stream or controller, or the process.
    pub source: String,
    pub key: String,
    pub detail: String,
}

/// The bounds the checks hold the run to.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// The most a write made in calm may take to reach a fast handler.
    pub calm_lag_ns: i64,
}

/// When the checks count a write as made in calm: no fault active, none lifted within
/// the grace before it, none applied within the lag bound after it, and the subjects
/// synced.
#[derive(Clone, Debug, Default)]
pub struct Calm {
    /// Windows (from, to), Unix ns, in which writes are not held to the lag bound.
    pub unsettled: Vec<(i64, i64)>,
}

impl Calm {
    pub fn contains(&self, at_ns: i64) -> bool {
        !self
            .unsettled
            .iter()
            .any(|&(from, to)| at_ns >= from && at_ns <= to)
    }
}

/// What the checks found and measured.
#[derive(Debug, Default, Serialize)]
pub struct Findings {
    pub violations: Vec<Violation>,
    /// Events checked, per stream.
    pub events: BTreeMap<String, usize>,
    /// Calm writes' delivery lag per stream, milliseconds: p50, p99, max, count.
    pub calm_lag_ms: BTreeMap<String, LagSummary>,
    pub reconciles: BTreeMap<String, usize>,
    /// Per controller, deletions no live replica could see (see [`Kills`]).
    pub unseen_deletions: BTreeMap<String, usize>,
}

/// When each replica of a controller run as processes was killed, Unix ns. A deletion
/// made after the last reconcile of its key by a replica killed since is not held against
/// the controller if no replica reconciled the key after the kill: the object's owner died
/// knowing it, and whoever took its slot listed after the deletion (a controller down for
/// a moment misses deletions the same way; a finalizer is how one makes sure to see them).
pub type Kills = BTreeMap<String, Vec<i64>>;

/// A lag distribution.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct LagSummary {
    pub count: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl LagSummary {
    pub fn of(mut lags_ns: Vec<i64>) -> Self {
        lags_ns.sort_unstable();
        let at = |p: f64| {
            if lags_ns.is_empty() {
                return 0.0;
            }
            let rank = ((p * lags_ns.len() as f64).ceil() as usize).clamp(1, lags_ns.len());
            lags_ns[rank - 1] as f64 / 1e6
        };
        Self {
            count: lags_ns.len(),
            p50_ms: at(0.5),
            p99_ms: at(0.99),
            max_ms: at(1.0),
        }
    }
}

/// The events of each stream, in the order its handler saw them.
pub fn streams(events: &[EventRecord]) -> BTreeMap<Stream, Vec<&EventRecord>> {
    let mut streams: BTreeMap<Stream, Vec<&EventRecord>> = BTreeMap::new();
    for event in events {
        streams.entry(event.stream()).or_default().push(event);
    }
    streams
}

/// A handler's view of one key after its events: the marker it holds, if any.
pub fn handler_state(events: &[&EventRecord]) -> HashMap<String, Option<u64>> {
    let mut state = HashMap::new();
    for event in events {
        let held = match event.kind {
            EventType::Add | EventType::Update => event.marker(),
            EventType::Delete => None,
        };
        state.insert(event.key.clone(), held);
    }
    state
}

/// Whether a stream's handler holds every object's final state.
pub fn converged(history: &ServerHistory, resource: Resource, events: &[&EventRecord]) -> bool {
    let held = handler_state(events);
    history
        .states
        .iter()
        .filter(|(id, _)| id.resource == resource)
        .all(|(id, states)| {
            let last = states.last().and_then(|s| s.marker);
            held.get(&id.key).copied().flatten() == last
        })
}

/// Checks every stream and controller.
pub fn check(
    history: &ServerHistory,
    events: &[EventRecord],
    reconciles: &[ReconcileRecord],
    relists: &Relists,
    calm: &Calm,
    bounds: Bounds,
    kills: &Kills,
) -> Findings {
    let mut findings = Findings::default();
    for (stream, events) in streams(events) {
        findings.events.insert(stream.to_string(), events.len());
        check_stream(history, &stream, &events, &mut findings.violations);
        let relisted = relists.get(&stream.subject).map_or(&[][..], Vec::as_slice);
        check_complete(
            history,
            &stream,
            &events,
            relisted,
            &mut findings.violations,
        );
        if stream.handler == "fast" {
            let lags = calm_lags(
                history,
                &stream,
                &events,
                relisted,
                calm,
                bounds,
                &mut findings.violations,
            );
            findings
                .calm_lag_ms
                .insert(stream.to_string(), LagSummary::of(lags));
        }
    }
    let mut by_controller: BTreeMap<&str, Vec<&ReconcileRecord>> = BTreeMap::new();
    for record in reconciles {
        by_controller
            .entry(&record.controller)
            .or_default()
            .push(record);
    }
    for (controller, records) in by_controller {
        findings
            .reconciles
            .insert(controller.to_owned(), records.len());
        let unseen = check_controller(
            history,
            controller,
            &records,
            kills,
            &mut findings.violations,
        );
        if unseen > 0 {
            findings
                .unseen_deletions
                .insert(controller.to_owned(), unseen);
        }
    }
    findings
}

fn check_stream(
    history: &ServerHistory,
    stream: &Stream,
    events: &[&EventRecord],
    violations: &mut Vec<Violation>,
) {
    let mut violate = |rule, key: &str, detail: String| {
        violations.push(Violation {
            rule,
            source: stream.to_string(),
            key: key.to_owned(),
            detail,
        });
    };
    let mut held: HashMap<&str, Option<u64>> = HashMap::new();
    let mut last_rv: HashMap<&str, u64> = HashMap::new();
    for event in events {
        let key = event.key.as_str();
        let id = ObjectId {
            resource: stream.resource,
            key: key.to_owned(),
        };
        let Some(rv) = event.resource_version() else {
            violate(
                Rule::RealState,
                key,
                format!("resourceVersion {:?} is not a number", event.rv),
            );
            continue;
        };
        if let Some(&before) = last_rv.get(key)
            && rv < before
        {
            violate(
                Rule::Ordered,
                key,
                format!("{:?} at resourceVersion {rv} after {before}", event.kind),
            );
        }
        last_rv.insert(key, rv);
        let present = held.get(key).copied().flatten().is_some();
        match (event.kind, present) {
            (EventType::Add, true) => violate(
                Rule::Lifecycle,
                key,
                format!("add at {rv} of an object the handler already had"),
            ),
            (EventType::Update, false) => violate(
                Rule::Lifecycle,
                key,
                format!(
                    "update at {rv} of an object the handler did not have (deleted, never added)"
                ),
            ),
            (EventType::Delete, false) => violate(
                Rule::Lifecycle,
                key,
                format!("delete at {rv} of an object the handler did not have"),
            ),
            _ => {}
        }
        let states = history
            .states
            .get(&id)
            .map(Vec::as_slice)
            .unwrap_or_default();
        match event.marker() {
            None => violate(
                Rule::RealState,
                key,
                format!("{:?} at {rv} of an object no write made", event.kind),
            ),
            Some(marker) => {
                let with_marker: Vec<_> =
                    states.iter().filter(|s| s.marker == Some(marker)).collect();
                if with_marker.is_empty() {
                    violate(
                        Rule::RealState,
                        key,
                        format!(
                            "{:?} at {rv} shows write {marker}, which the server never held for this key",
                            event.kind
                        ),
                    );
                } else if event.kind != EventType::Delete
                    && !(event.deleting && deleted_after(states, marker))
                    && !with_marker
                        .iter()
                        .any(|s| s.resource_version.is_none_or(|known| known == rv))
                {
                    violate(
                        Rule::RealState,
                        key,
                        format!(
                            "{:?} shows write {marker} at resourceVersion {rv}; the server gave it {:?}",
                            event.kind,
                            with_marker
                                .iter()
                                .map(|s| s.resource_version)
                                .collect::<Vec<_>>()
                        ),
                    );
                }
            }
        }
        held.insert(
            key,
            match event.kind {
                EventType::Delete => None,
                _ => event.marker().or(Some(0)),
            },
        );
    }
    for (id, states) in history
        .states
        .iter()
        .filter(|(id, _)| id.resource == stream.resource)
    {
        let last = states.last().and_then(|s| s.marker);
        let holds = held.get(id.key.as_str()).copied().flatten();
        if holds != last {
            violate(
                Rule::FinalState,
                &id.key,
                format!(
                    "the handler holds write {holds:?}; the server's final state is write {last:?}"
                ),
            );
        }
    }
}

/// When each subject started a relist, Unix ns, sorted.
pub type Relists = BTreeMap<String, Vec<i64>>;

/// How far after the event a relist may be recorded and still count as the one that
/// delivered it (a subject's relists are observed by polling, a few ms late).
const RELIST_SLACK_NS: i64 = 1_000_000_000;

/// The position in a key's server history of the state an event shows.
fn position(states: &[crate::record::ServerState], event: &EventRecord) -> Option<usize> {
    let marker = event.marker()?;
    let last_with_marker = states.iter().rposition(|s| s.marker == Some(marker))?;
    match event.kind {
        EventType::Delete => states[last_with_marker..]
            .iter()
            .position(|s| !s.exists())
            .map(|offset| last_with_marker + offset),
        // A deletion in progress follows the write's last recorded state.
        _ if event.deleting => Some(last_with_marker),
        _ => {
            let rv = event.resource_version();
            states
                .iter()
                .position(|s| {
                    s.marker == Some(marker)
                        && s.resource_version.is_none_or(|known| Some(known) == rv)
                })
                .or(Some(last_with_marker))
        }
    }
}

fn check_complete(
    history: &ServerHistory,
    stream: &Stream,
    events: &[&EventRecord],
    relists: &[i64],
    violations: &mut Vec<Violation>,
) {
    // Per key: the position of the last event's state, when it came, and whether it was a
    // relist's tombstone.
    let mut previous: HashMap<&str, (usize, i64, bool)> = HashMap::new();
    for event in events {
        let id = ObjectId {
            resource: stream.resource,
            key: event.key.clone(),
        };
        let Some(states) = history.states.get(&id) else {
            continue;
        };
        let Some(at) = position(states, event) else {
            continue;
        };
        let before = previous
            .get(event.key.as_str())
            .map(|&(before, before_ns, tombstone)| {
                // A tombstone says the object was gone when the relist listed, not which
                // deletion it saw: the latest one before this event's state.
                let before = match tombstone {
                    true if at > before => states[before..at]
                        .iter()
                        .rposition(|s| !s.exists())
                        .map_or(before, |offset| before + offset),
                    _ => before,
                };
                (before, before_ns)
            });
        if let Some((before, before_ns)) = before
            && at > before + 1
        {
            let relisted = relists
                .iter()
                .any(|&t| t > before_ns && t <= event.at_ns + RELIST_SLACK_NS);
            if !relisted {
                let skipped: Vec<_> = states[before + 1..at].iter().map(|s| s.marker).collect();
                violations.push(Violation {
                    rule: Rule::Complete,
                    source: stream.to_string(),
                    key: event.key.clone(),
                    detail: format!(
                        "{:?} of write {} passed over {skipped:?} without a relist",
                        event.kind, event.marker
                    ),
                });
            }
        }
        previous.insert(&event.key, (at, event.at_ns, event.tombstone));
    }
}

/// Whether the server deleted the object after write `marker`: the states a deletion
/// passes through (deletionTimestamp set, finalizers and conditions written) show that
/// write's marker at versions the writer never saw.
fn deleted_after(states: &[crate::record::ServerState], marker: u64) -> bool {
    states
        .iter()
        .skip_while(|s| s.marker != Some(marker))
        .any(|s| !s.exists())
}

/// The lag of every write made in calm to its first event in the stream; a missing
/// event or a lag past the bound is a violation.
fn calm_lags(
    history: &ServerHistory,
    stream: &Stream,
    events: &[&EventRecord],
    relists: &[i64],
    calm: &Calm,
    bounds: Bounds,
    violations: &mut Vec<Violation>,
) -> Vec<i64> {
    let mut first_seen: HashMap<(&str, u64), i64> = HashMap::new();
    for event in events {
        if let (Some(marker), false) = (event.marker(), event.kind == EventType::Delete) {
            first_seen
                .entry((&event.key, marker))
                .or_insert(event.at_ns);
        }
    }
    let mut lags = Vec::new();
    for (id, states) in history
        .states
        .iter()
        .filter(|(id, _)| id.resource == stream.resource)
    {
        let mut checked = HashSet::new();
        for (i, state) in states.iter().enumerate() {
            let Some(marker) = state.marker else { continue };
            if !state.answered || !calm.contains(state.known_at_ns) || !checked.insert(marker) {
                continue;
            }
            // A relist lists the latest state only: a write replaced before one finished
            // may never be delivered (a watch resumed after a compaction gets 410 at its
            // next restart, calm or not).
            let replaced_ns = states.get(i + 1).map_or(i64::MAX, |next| next.known_at_ns);
            let relisted = relists.iter().any(|&t| {
                t > state.known_at_ns - RELIST_SLACK_NS
                    && t <= replaced_ns.saturating_add(RELIST_SLACK_NS)
            });
            match first_seen.get(&(id.key.as_str(), marker)) {
                Some(&seen) => {
                    let lag = (seen - state.known_at_ns).max(0);
                    if lag > bounds.calm_lag_ns {
                        violations.push(Violation {
                            rule: Rule::Lag,
                            source: stream.to_string(),
                            key: id.key.clone(),
                            detail: format!("write {marker} took {} ms to arrive", lag / 1_000_000),
                        });
                    }
                    lags.push(lag);
                }
                None if relisted => {}
                None => violations.push(Violation {
                    rule: Rule::Lag,
                    source: stream.to_string(),
                    key: id.key.clone(),
                    detail: format!("write {marker}, made in calm, never arrived"),
                }),
            }
        }
    }
    lags
}

/// A key whose last reconcile missed its final state: the key, the write that reconcile
/// saw, and the final write (`None`: deleted).
pub type Missed<'a> = (&'a str, Option<u64>, Option<u64>);

/// The Pods whose last reconcile by one controller (`records`) did not see their final
/// state. Deletions no live replica could see (see [`Kills`]) are left out.
pub fn unreconciled<'a>(
    history: &'a ServerHistory,
    records: &[&ReconcileRecord],
    kills: &Kills,
) -> Vec<Missed<'a>> {
    unreconciled_and_unseen(history, records, kills).0
}

/// [`unreconciled`], and how many deletions it left out.
fn unreconciled_and_unseen<'a>(
    history: &'a ServerHistory,
    records: &[&ReconcileRecord],
    kills: &Kills,
) -> (Vec<Missed<'a>>, usize) {
    // A key can name several objects in turn (deleted, then created again), and a
    // controller sharded by UID reconciles each where its UID falls: a reconcile of an
    // earlier object, even one that ends after the last object's (its deletion, or a
    // stale cache's view of it), says nothing of the last one. The objects are told
    // apart by the writes their reconciles saw.
    let mut by_key: HashMap<&str, Vec<&ReconcileRecord>> = HashMap::new();
    for record in records {
        by_key.entry(&record.key).or_default().push(record);
    }
    let last_object_records = |states: &[crate::record::ServerState], key: &str| {
        let records = by_key.get(key).map(Vec::as_slice).unwrap_or_default();
        let (earlier, last) = objects(states);
        let uids_of = |markers: &HashSet<u64>| -> HashSet<&str> {
            records
                .iter()
                .filter(|r| r.marker.is_some_and(|m| markers.contains(&m)))
                .filter_map(|r| r.uid.as_deref())
                .collect()
        };
        let (earlier, last) = (uids_of(&earlier), uids_of(&last));
        records
            .iter()
            .copied()
            .filter(|r| match r.uid.as_deref() {
                None => true,
                Some(uid) if !last.is_empty() => last.contains(uid),
                Some(uid) => !earlier.contains(uid),
            })
            .max_by_key(|r| r.started_ns)
    };
    let mut unseen = 0;
    let missed = history
        .states
        .iter()
        .filter(|(id, _)| id.resource == Resource::Pods)
        .filter_map(|(id, states)| {
            let final_marker = states.last().and_then(|s| s.marker);
            // Never reconciled counts as having seen nothing: right for a key whose
            // final state is deleted.
            let last = last_object_records(states, &id.key);
            let seen = last.and_then(|r| r.marker);
            if seen == final_marker {
                return None;
            }
            let owner_died = final_marker.is_none()
                && last.is_some_and(|r| {
                    r.replica.as_ref().is_some_and(|replica| {
                        kills
                            .get(replica)
                            .is_some_and(|k| k.iter().any(|&at| at > r.started_ns))
                    })
                });
            if owner_died {
                unseen += 1;
                return None;
            }
            Some((id.key.as_str(), seen, final_marker))
        })
        .collect();
    (missed, unseen)
}

/// The writes of the earlier objects a key named, and of the last one (deleted or not):
/// a write after a deletion is a new object's.
fn objects(states: &[crate::record::ServerState]) -> (HashSet<u64>, HashSet<u64>) {
    let mut earlier = HashSet::new();
    let mut last = HashSet::new();
    let mut deleted = false;
    for state in states {
        match state.marker {
            Some(marker) => {
                if deleted {
                    earlier.extend(last.drain());
                    deleted = false;
                }
                last.insert(marker);
            }
            None => deleted = true,
        }
    }
    (earlier, last)
}

/// Reconciles of one key whose spans overlap, each pair as (earlier, later): what two
/// workers or two replicas of one controller must never do. Two objects of one name (one
/// deleted, one created again) are not one: a controller sharded by UID may find them in
/// two slots of two replicas, and reconcile both at once (see [`recreated_at_once`]).
pub fn overlapping<'a>(
    records: &[&'a ReconcileRecord],
) -> Vec<(&'a ReconcileRecord, &'a ReconcileRecord)> {
    let mut by_key: HashMap<&str, Vec<&ReconcileRecord>> = HashMap::new();
    for record in records {
        by_key.entry(&record.key).or_default().push(record);
    }
    let mut overlaps = Vec::new();
    for spans in by_key.values_mut() {
        spans.sort_by_key(|r| r.started_ns);
        // The span still running longest among those started so far.
        let mut open: Option<&ReconcileRecord> = None;
        for record in spans.iter().copied() {
            if let Some(earlier) = open
                && record.started_ns < earlier.finished_ns
                && !two_objects(earlier, record)
            {
                overlaps.push((earlier, record));
            }
            if open.is_none_or(|earlier| record.finished_ns > earlier.finished_ns) {
                open = Some(record);
            }
        }
    }
    overlaps.sort_by_key(|(_, later)| later.started_ns);
    overlaps
}

/// Checks one controller's reconciles; returns the deletions no live replica could see.
/// Whether two reconciles of one key were of two objects (known UIDs that differ).
fn two_objects(a: &ReconcileRecord, b: &ReconcileRecord) -> bool {
    matches!((&a.uid, &b.uid), (Some(a), Some(b)) if a != b)
}

/// Reconciles of two objects of one name that overlapped: allowed, and counted.
pub fn recreated_at_once(records: &[&ReconcileRecord]) -> usize {
    let mut by_key: HashMap<&str, Vec<&ReconcileRecord>> = HashMap::new();
    for record in records {
        by_key.entry(&record.key).or_default().push(record);
    }
    by_key
        .values()
        .map(|spans| {
            spans
                .iter()
                .enumerate()
                .flat_map(|(i, a)| spans[i + 1..].iter().map(move |b| (a, b)))
                .filter(|(a, b)| {
                    two_objects(a, b)
                        && a.started_ns < b.finished_ns
                        && b.started_ns < a.finished_ns
                })
                .count()
        })
        .sum()
}

fn check_controller(
    history: &ServerHistory,
    controller: &str,
    records: &[&ReconcileRecord],
    kills: &Kills,
    violations: &mut Vec<Violation>,
) -> usize {
    let replica = |r: &ReconcileRecord| r.replica.clone().unwrap_or_else(|| "a worker".into());
    for (earlier, later) in overlapping(records) {
        violations.push(Violation {
            rule: Rule::Exclusive,
            source: controller.to_owned(),
            key: later.key.clone(),
            detail: format!(
                "{} started it {} µs before {} finished it",
                replica(later),
                (earlier.finished_ns - later.started_ns) / 1_000,
                replica(earlier),
            ),
        });
    }
    let (missed, unseen) = unreconciled_and_unseen(history, records, kills);
    for (key, seen, final_marker) in missed {
        violations.push(Violation {
            rule: Rule::LevelTriggered,
            source: controller.to_owned(),
            key: key.to_owned(),
            detail: format!(
                "last reconcile saw write {seen:?}; the final state is write {final_marker:?}"
            ),
        });
    }
    unseen
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::ServerState;

    fn state(marker: Option<u64>, rv: Option<u64>, at: i64) -> ServerState {
        ServerState {
            marker,
            resource_version: rv,
            known_at_ns: at,
            answered: true,
        }
    }

    fn event(kind: EventType, key: &str, rv: u64, marker: u64, at: i64) -> EventRecord {
        EventRecord {
            subject: "s".into(),
            handler: "fast".into(),
            resource: Resource::Pods,
            kind,
            key: key.into(),
            rv: rv.to_string(),
            marker: marker.to_string(),
            initial: false,
            resync: false,
            tombstone: false,
            deleting: false,
            at_ns: at,
        }
    }

    /// The Pod `ns/a` through `states`.
    fn history_of(states: Vec<ServerState>) -> ServerHistory {
        let mut history = ServerHistory::default();
        history.states.insert(
            ObjectId {
                resource: Resource::Pods,
                key: "ns/a".into(),
            },
            states,
        );
        history
    }

    /// One object created (write 1 at rv 10), updated (write 2 at rv 11), deleted, and
    /// created again (write 4 at rv 13).
    fn history() -> ServerHistory {
        history_of(vec![
            state(Some(1), Some(10), 1_000),
            state(Some(2), Some(11), 2_000),
            state(None, None, 3_000),
            state(Some(4), Some(13), 4_000),
        ])
    }

    fn faithful() -> Vec<EventRecord> {
        vec![
            event(EventType::Add, "ns/a", 10, 1, 1_100),
            event(EventType::Update, "ns/a", 11, 2, 2_100),
            event(EventType::Delete, "ns/a", 12, 2, 3_100),
            event(EventType::Add, "ns/a", 13, 4, 4_100),
        ]
    }

    fn rules(events: &[EventRecord], reconciles: &[ReconcileRecord]) -> Vec<Rule> {
        let bounds = Bounds { calm_lag_ns: 500 };
        check(
            &history(),
            events,
            reconciles,
            &Relists::default(),
            &Calm::default(),
            bounds,
            &Kills::new(),
        )
        .violations
        .into_iter()
        .map(|v| v.rule)
        .collect()
    }

    #[test]
    fn a_faithful_history_passes() {
        assert_eq!(rules(&faithful(), &[]), []);
    }

    #[test]
    fn a_dropped_update_is_caught_unless_a_relist_passed_over_it() {
        let mut events = faithful();
        events.remove(1);
        assert_eq!(rules(&events, &[]), [Rule::Complete, Rule::Lag]);
        // A relist after the write, before it was replaced, passes over it: even in calm.
        let relists = Relists::from([("s".to_owned(), vec![2_500])]);
        let bounds = Bounds { calm_lag_ns: 500 };
        let found = check(
            &history(),
            &events,
            &[],
            &relists,
            &Calm::default(),
            bounds,
            &Kills::new(),
        );
        assert!(found.violations.is_empty(), "{:?}", found.violations);
        // One long after it was replaced excuses nothing.
        let relists = Relists::from([("s".to_owned(), vec![9_000_000_000])]);
        let found = check(
            &history(),
            &events,
            &[],
            &relists,
            &Calm::default(),
            bounds,
            &Kills::new(),
        );
        let rules: Vec<_> = found.violations.iter().map(|v| v.rule).collect();
        assert_eq!(rules, [Rule::Complete, Rule::Lag]);
    }

    #[test]
    fn a_relist_s_tombstone_stands_for_the_last_deletion_before_what_follows() {
        // Created (1), deleted, created again (2), deleted, created a third time (3).
        let history = history_of(vec![
            state(Some(1), Some(10), 1_000),
            state(None, None, 2_000),
            state(Some(2), Some(12), 3_000),
            state(None, None, 4_000),
            state(Some(3), Some(14), 5_000),
        ]);
        let complete = |events: &[EventRecord]| {
            let streams = streams(events);
            let mut violations = Vec::new();
            for (stream, events) in &streams {
                check_complete(&history, stream, events, &[], &mut violations);
            }
            violations
        };
        // A relist after the second deletion: a tombstone for write 1, then write 3.
        let mut tombstone = event(EventType::Delete, "ns/a", 10, 1, 4_500);
        tombstone.tombstone = true;
        let third = event(EventType::Add, "ns/a", 14, 3, 5_100);
        let added = event(EventType::Add, "ns/a", 10, 1, 1_100);
        let found = complete(&[added.clone(), tombstone.clone(), third.clone()]);
        assert!(found.is_empty(), "{found:?}");
        // A plain delete stands for the first deletion: write 2 was passed over.
        let mut plain = tombstone;
        plain.tombstone = false;
        let found = complete(&[added, plain, third]);
        assert_eq!(found.len(), 1, "{found:?}");
    }

    #[test]
    fn a_lost_delete_is_caught() {
        let mut events = faithful();
        events.remove(2);
        assert_eq!(rules(&events, &[]), [Rule::Lifecycle, Rule::Complete]);
    }

    #[test]
    fn a_state_the_server_never_had_is_caught() {
        let mut events = faithful();
        events[1].marker = "3".into();
        let found = rules(&events, &[]);
        assert!(found.contains(&Rule::RealState), "{found:?}");
        let mut events = faithful();
        events[1].rv = "12".into();
        assert!(rules(&events, &[]).contains(&Rule::RealState));
    }

    #[test]
    fn a_deletion_in_progress_is_a_real_state_only_before_a_delete() {
        // Write 2 being deleted, at a version the writer never saw: the server had it.
        let mut events = faithful();
        let mut deleting = event(EventType::Update, "ns/a", 12, 2, 2_900);
        deleting.deleting = true;
        events.insert(2, deleting.clone());
        assert_eq!(rules(&events, &[]), []);
        // Write 4 was never deleted: no such state.
        let mut events = faithful();
        deleting.marker = "4".into();
        deleting.rv = "14".into();
        events.push(deleting);
        assert!(rules(&events, &[]).contains(&Rule::RealState));
    }

    #[test]
    fn events_out_of_order_are_caught() {
        let mut events = faithful();
        events.swap(0, 1);
        let found = rules(&events, &[]);
        assert!(found.contains(&Rule::Ordered), "{found:?}");
        assert!(found.contains(&Rule::Lifecycle), "{found:?}");
    }

    #[test]
    fn a_missed_final_state_is_caught() {
        let mut events = faithful();
        events.pop();
        let found = rules(&events, &[]);
        assert!(found.contains(&Rule::FinalState), "{found:?}");
    }

    #[test]
    fn a_late_write_breaks_the_lag_bound() {
        let mut events = faithful();
        events[1].at_ns = 2_000 + 501;
        assert_eq!(rules(&events, &[]), [Rule::Lag]);
        // The same write, made while a fault was settling, is not held to it.
        let calm = Calm {
            unsettled: vec![(1_900, 2_100)],
        };
        let bounds = Bounds { calm_lag_ns: 500 };
        assert!(
            check(
                &history(),
                &events,
                &[],
                &Relists::default(),
                &calm,
                bounds,
                &Kills::new()
            )
            .violations
            .is_empty()
        );
    }

    #[test]
    fn a_controller_must_see_the_final_state_last() {
        let reconcile = |marker, at| ReconcileRecord {
            controller: "c".into(),
            replica: None,
            uid: None,
            key: "ns/a".into(),
            marker,
            started_ns: at,
            finished_ns: at + 1,
        };
        let events = faithful();
        assert_eq!(
            rules(
                &events,
                &[reconcile(Some(2), 2_200), reconcile(Some(4), 4_200)]
            ),
            []
        );
        assert_eq!(
            rules(
                &events,
                &[reconcile(Some(4), 4_200), reconcile(None, 4_300)]
            ),
            [Rule::LevelTriggered]
        );
        assert_eq!(
            rules(&events, &[reconcile(Some(2), 2_200)]),
            [Rule::LevelTriggered]
        );
    }

    #[test]
    fn replicas_reconciling_one_key_at_once_are_caught() {
        let reconcile = |replica: &str, key: &str, started_ns, finished_ns| ReconcileRecord {
            controller: "sharded".into(),
            replica: Some(replica.into()),
            uid: None,
            key: key.into(),
            marker: Some(4),
            started_ns,
            finished_ns,
        };
        let handed_over = [
            reconcile("a", "ns/a", 4_100_000, 4_200_000),
            reconcile("b", "ns/a", 4_200_000, 4_300_000),
            reconcile("b", "ns/b", 4_150_000, 4_250_000),
        ];
        assert_eq!(rules(&faithful(), &handed_over), []);
        // c starts while a's long reconcile still runs, after b's short one ended.
        let mut overlapped = handed_over.to_vec();
        overlapped.insert(0, reconcile("a", "ns/a", 4_000_000, 4_500_000));
        overlapped.push(reconcile("c", "ns/a", 4_400_000, 4_600_000));
        let found = check(
            &history(),
            &faithful(),
            &overlapped,
            &Relists::default(),
            &Calm::default(),
            Bounds { calm_lag_ns: 500 },
            &Kills::new(),
        );
        let found: Vec<_> = found
            .violations
            .iter()
            .map(|v| (v.rule, v.detail.as_str()))
            .collect();
        assert_eq!(
            found,
            [
                (Rule::Exclusive, "a started it 400 µs before a finished it"),
                (Rule::Exclusive, "b started it 300 µs before a finished it"),
                (Rule::Exclusive, "c started it 100 µs before a finished it"),
            ]
        );
    }

    #[test]
    fn a_deletion_after_its_owner_was_killed_is_unseen_not_missed() {
        // Write 4 reconciled by r0, then the key deleted; r0 was killed in between.
        let mut history = history();
        history
            .states
            .values_mut()
            .for_each(|states| states.push(state(None, None, 5_000)));
        let reconciled = ReconcileRecord {
            controller: "sharded".into(),
            replica: Some("r0".into()),
            uid: None,
            key: "ns/a".into(),
            marker: Some(4),
            started_ns: 4_200,
            finished_ns: 4_300,
        };
        let records = [&reconciled];
        let killed = |at| Kills::from([("r0".to_owned(), vec![at])]);
        assert_eq!(
            unreconciled_and_unseen(&history, &records, &killed(4_500)).1,
            1
        );
        assert!(unreconciled(&history, &records, &killed(4_500)).is_empty());
        // Killed before that reconcile, or another replica killed: a deletion missed.
        assert_eq!(unreconciled(&history, &records, &killed(4_100)).len(), 1);
        let other = Kills::from([("r1".to_owned(), vec![4_500])]);
        assert_eq!(unreconciled(&history, &records, &other).len(), 1);
    }

    #[test]
    fn two_objects_of_one_name_may_be_reconciled_at_once() {
        let reconcile = |replica: &str, uid: &str, started_ns, finished_ns| ReconcileRecord {
            controller: "sharded".into(),
            replica: Some(replica.into()),
            uid: Some(uid.into()),
            key: "ns/a".into(),
            marker: Some(4),
            started_ns,
            finished_ns,
        };
        // The deleted object's reconcile on r0, the one created again on r1.
        let gone = reconcile("r0", "uid-old", 4_000_000, 4_500_000);
        let again = reconcile("r1", "uid-new", 4_100_000, 4_600_000);
        assert!(overlapping(&[&gone, &again]).is_empty());
        assert_eq!(recreated_at_once(&[&gone, &again]), 1);
        let same = reconcile("r1", "uid-old", 4_100_000, 4_600_000);
        assert_eq!(overlapping(&[&gone, &same]).len(), 1);
        assert_eq!(recreated_at_once(&[&gone, &same]), 0);
    }

    /// A sharded controller's reconcile of the object `uid` named `ns/a` (on a replica
    /// named after it), seeing write `marker` (`None`: deleted), 1 ns long.
    fn of_object(uid: &str, marker: Option<u64>, started_ns: i64) -> ReconcileRecord {
        ReconcileRecord {
            controller: "sharded".into(),
            replica: Some(uid.into()),
            uid: Some(uid.into()),
            key: "ns/a".into(),
            marker,
            started_ns,
            finished_ns: started_ns + 1,
        }
    }

    #[test]
    fn an_earlier_object_s_deletion_reconciled_last_says_nothing_of_the_new_one() {
        // Write 4 is the object created again; the first one's deletion comes last.
        let new = of_object("uid-new", Some(4), 4_200);
        let old_gone = of_object("uid-old", None, 4_300);
        let kills = Kills::new();
        assert!(unreconciled(&history(), &[&new, &old_gone], &kills).is_empty());
        // The new object's own deletion does count.
        let new_gone = of_object("uid-new", None, 4_300);
        assert_eq!(
            unreconciled(&history(), &[&new, &new_gone], &kills),
            [("ns/a", None, Some(4))]
        );
    }

    #[test]
    fn a_stale_cache_s_view_of_an_earlier_object_reconciled_last_says_nothing_of_the_new_one() {
        let kills = Kills::new();
        let old = of_object("uid-old", Some(2), 2_100);
        let new = of_object("uid-new", Some(4), 4_200);
        // Another replica, its cache behind, still sees the first object after that.
        let stale = of_object("uid-old", Some(2), 4_300);
        assert!(unreconciled(&history(), &[&old, &new, &stale], &kills).is_empty());

        // Deleted for good: its last reconcile must see the deletion.
        let mut gone = history();
        for states in gone.states.values_mut() {
            states.push(state(None, None, 5_000));
        }
        assert_eq!(
            unreconciled(&gone, &[&old, &new, &stale], &kills),
            [("ns/a", Some(4), None)]
        );
        let new_gone = of_object("uid-new", None, 5_100);
        assert!(unreconciled(&gone, &[&old, &new, &stale, &new_gone], &kills).is_empty());
        // The first object's deletion is no stand-in for the last one's.
        let old_gone = of_object("uid-old", None, 5_100);
        assert_eq!(
            unreconciled(&gone, &[&old, &new, &stale, &old_gone], &kills).len(),
            1
        );
    }
}
