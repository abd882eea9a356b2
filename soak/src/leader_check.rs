//! The leader-elected subject's checks: what its replicas recorded, the children they
//! made, the cleanups the counter counted and the Lease's history as observed, held to
//! what the library promises.
//!
//! - **`fenced`**: a replica acts only in its own term. A term starts at the Lease's
//!   `acquireTime`, as its holder wrote it (the replicas share the machine's clock with
//!   the checks), and ends when the next one starts. The library stops a leader that
//!   cannot renew before another could acquire: its leading token is cancelled a renew
//!   deadline after its last renewal, and work still running a lease duration after it is
//!   dropped, where the next holder's `acquireTime` can be at the earliest. So a reconcile
//!   must start in its replica's term, and may finish, call the counter or send a create
//!   only until [`FENCE_TOLERANCE_NS`] past the next term's start. Terms the observer did
//!   not see (their `leaseTransitions` skipped) leave what falls around them unjudged, and
//!   counted.
//! - **`single-child`**: no parent gets a second child that its creator's reads should
//!   have shown. Every child carries the version its creator's cache was at before the
//!   read that found no child, and the version of its creator's term fence, which that
//!   read waited for. An earlier child created at or before either version, or created
//!   by the same term with an answer before the read began (a read through the
//!   controller's client waits for its own writes), is a violation. An earlier child the
//!   server applied after both (a previous leader's create, held up in the server past
//!   the next term's fence) is one no reader could have known of: counted apart.
//! - **`cleanup-once`**: every parent seen holding the finalizer and gone at the end had
//!   its cleanup counted; none was counted for a parent alive at the end and not being
//!   deleted; a term that removed the finalizer never ran the cleanup again (its reads
//!   wait for that removal), where the removal is known to be its own: it succeeded, and
//!   no earlier call of the parent's cleanup, by another term or by one of its own
//!   reconciles whose removal failed or went unrecorded, could have removed it first
//!   (that removal would answer 404, which the finalizer takes as done); and no term ran
//!   it for a parent deleted before that term's fence. Cleanups repeated otherwise (a
//!   removal that failed, or whose answer was lost; a new leader after a removal that
//!   landed late, or that never came) are at-least-once, as the library says, and
//!   counted.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

use crate::{
    check::{Rule, Violation},
    leader::LeaderRecord,
    parents::{ChildSeen, CountedCall, EndState, LeaseSeen, Observed},
};

/// How far past the next term's start a term's work may still finish or send: the fence
/// drops it when another replica could acquire, at its next await (a runtime aborts a task
/// between polls, and its timers fire at millisecond granularity).
pub const FENCE_TOLERANCE_NS: i64 = 50_000_000;

/// What the leader subject's checks covered.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LeaderSummary {
    /// Terms of the Lease seen, holders' and releases'.
    pub terms: usize,
    /// Terms the observer missed (the Lease's transitions skipped them).
    pub terms_missed: usize,
    /// Terms that wrote their fences (began leading) and that lost the Lease.
    pub terms_led: usize,
    pub terms_lost: usize,
    pub reconciles: usize,
    /// Reconcile starts and ends, cleanup calls and child creates held to their terms.
    pub actions_checked: usize,
    /// Those that fell where a term was missed.
    pub actions_unjudged: usize,
    pub children: usize,
    pub parents_with_children: usize,
    /// Parents with more than one child, and those of them no reader could have prevented.
    pub duplicates: usize,
    pub duplicates_unpromised: usize,
    /// Deleted parents that needed their cleanup, and the counter's calls.
    pub cleanups_required: usize,
    pub cleanup_calls: usize,
    /// Parents whose cleanup ran exactly once.
    pub cleaned_once: usize,
    /// Parents cleaned up more than once, by one term and across terms (at-least-once).
    pub cleaned_again_same_term: usize,
    pub cleaned_again_later_term: usize,
}

/// What became of a cleanup's removal of the finalizer.
#[derive(Clone, Copy, Debug)]
enum Removal {
    /// The reconcile succeeded when it finished (ns): removed, or gone already (404).
    Done(i64),
    /// The removal failed: it may have gone through with its answer lost.
    Maybe,
    /// The reconcile failed before sending it.
    NotSent,
}

/// One term of the Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Term {
    holder: Option<String>,
    from_ns: i64,
    /// Whether a term the observer missed came right before this one.
    after_gap: bool,
}

/// Everything the checks read.
pub struct Inputs<'a> {
    pub records: &'a [LeaderRecord],
    pub observed: &'a Observed,
    pub calls: &'a [CountedCall],
    pub end: &'a EndState,
    /// UIDs of parents the writer deleted while they held the finalizer.
    pub deleted_holding: &'a BTreeSet<String>,
}

/// Runs the checks.
pub fn check(inputs: &Inputs<'_>) -> (Vec<Violation>, LeaderSummary) {
    let mut violations = Vec::new();
    let mut summary = LeaderSummary::default();
    for record in inputs.records {
        match record {
            LeaderRecord::Term { .. } => summary.terms_led += 1,
            LeaderRecord::Lost { .. } => summary.terms_lost += 1,
            LeaderRecord::Reconcile { .. } => summary.reconciles += 1,
            LeaderRecord::Child { .. } => {}
        }
    }
    check_fenced(inputs, &mut violations, &mut summary);
    check_children(inputs, &mut violations, &mut summary);
    check_cleanups(inputs, &mut violations, &mut summary);
    let vacuous = [
        (Rule::Fenced, summary.reconciles, "reconciles"),
        (Rule::SingleChild, summary.children, "children"),
        (
            Rule::CleanupOnce,
            summary.cleanups_required,
            "deleted parents",
        ),
    ];
    for (rule, count, what) in vacuous {
        if count == 0 {
            violations.push(violation(
                rule,
                "",
                format!("no {what} to check: the check held nothing"),
            ));
        }
    }
    (violations, summary)
}

fn violation(rule: Rule, key: &str, detail: String) -> Violation {
    Violation {
        rule,
        source: crate::leader::LEASE.to_owned(),
        key: key.to_owned(),
        detail,
    }
}

/// The terms of the Lease in order, and how many the observer missed.
fn terms(lease: &[LeaseSeen]) -> (Vec<Term>, usize) {
    let mut seen: Vec<&LeaseSeen> = lease.iter().collect();
    seen.sort_by_key(|s| s.resource_version);
    let mut terms: Vec<Term> = Vec::new();
    let mut missed = 0;
    let mut last_transitions: Option<i32> = None;
    for state in seen {
        let Some(from_ns) = state.acquired_ns else {
            continue;
        };
        if terms
            .last()
            .is_some_and(|t| t.holder == state.holder && t.from_ns == from_ns)
        {
            continue;
        }
        // Each new holder adds one transition; a release adds none.
        let gap = match (state.holder.is_some(), last_transitions, state.transitions) {
            (true, Some(before), Some(now)) => usize::try_from(now - before - 1).unwrap_or(0),
            _ => 0,
        };
        missed += gap;
        if state.holder.is_some() {
            last_transitions = state.transitions.or(last_transitions);
        }
        terms.push(Term {
            holder: state.holder.clone(),
            from_ns,
            after_gap: gap > 0,
        });
    }
    (terms, missed)
}

/// Whether `identity` held the Lease at `at_ns`: `None` when a missed term may have
/// started between the term in effect then and the next one seen.
fn held_at(terms: &[Term], identity: &str, at_ns: i64) -> Option<Result<(), String>> {
    let index = terms.partition_point(|t| t.from_ns <= at_ns);
    if terms.get(index).is_some_and(|next| next.after_gap) {
        return None;
    }
    let Some(term) = index.checked_sub(1).map(|i| &terms[i]) else {
        return Some(Err("before any term of the Lease".to_owned()));
    };
    match &term.holder {
        Some(holder) if holder == identity => Some(Ok(())),
        Some(holder) => Some(Err(format!(
            "in {holder}'s term (from {} ms before)",
            (at_ns - term.from_ns) / 1_000_000
        ))),
        None => Some(Err(format!(
            "after the Lease was released ({} ms before)",
            (at_ns - term.from_ns) / 1_000_000
        ))),
    }
}

fn check_fenced(inputs: &Inputs<'_>, violations: &mut Vec<Violation>, summary: &mut LeaderSummary) {
    let (terms, missed) = terms(&inputs.observed.lease);
    summary.terms = terms.len();
    summary.terms_missed = missed;
    // (identity, key, what, when, how far past its term it may be)
    let mut actions: Vec<(&str, &str, &str, i64, i64)> = Vec::new();
    for record in inputs.records {
        match record {
            LeaderRecord::Reconcile {
                identity,
                key,
                started_ns,
                finished_ns,
                ..
            } => {
                actions.push((identity, key, "started a reconcile", *started_ns, 0));
                actions.push((
                    identity,
                    key,
                    "finished a reconcile",
                    *finished_ns,
                    FENCE_TOLERANCE_NS,
                ));
            }
            LeaderRecord::Child { .. } | LeaderRecord::Term { .. } | LeaderRecord::Lost { .. } => {}
        }
    }
    for call in inputs.calls {
        actions.push((
            &call.call.identity,
            &call.call.key,
            "called the cleanup counter",
            call.call.sent_ns,
            FENCE_TOLERANCE_NS,
        ));
    }
    let children = all_children(inputs);
    for child in children.values() {
        actions.push((
            &child.creator,
            &child.name,
            "sent the create of a child",
            child.sent_ns,
            FENCE_TOLERANCE_NS,
        ));
    }
    for (identity, key, what, at_ns, tolerance) in actions {
        // Held at the moment, or within the tolerance before it: a term's end stretches,
        // its start does not.
        let held = match held_at(&terms, identity, at_ns) {
            Some(Err(_)) if tolerance > 0 => match held_at(&terms, identity, at_ns - tolerance) {
                Some(Ok(())) => Some(Ok(())),
                None => None,
                Some(Err(_)) => held_at(&terms, identity, at_ns),
            },
            held => held,
        };
        match held {
            None => summary.actions_unjudged += 1,
            Some(Ok(())) => summary.actions_checked += 1,
            Some(Err(when)) => {
                summary.actions_checked += 1;
                violations.push(violation(
                    Rule::Fenced,
                    key,
                    format!("{identity} {what} {when}"),
                ));
            }
        }
    }
}

/// Every child seen, by UID: the observer's, and the last list's.
fn all_children<'a>(inputs: &Inputs<'a>) -> BTreeMap<&'a str, &'a ChildSeen> {
    let mut children: BTreeMap<&str, &ChildSeen> = BTreeMap::new();
    for child in inputs
        .observed
        .children
        .values()
        .chain(&inputs.end.children)
    {
        children.entry(&child.uid).or_insert(child);
    }
    children
}

fn check_children(
    inputs: &Inputs<'_>,
    violations: &mut Vec<Violation>,
    summary: &mut LeaderSummary,
) {
    // When each term's answered creates came back, by child name.
    let mut answered: HashMap<&str, (i64, u64)> = HashMap::new();
    for record in inputs.records {
        if let LeaderRecord::Child {
            name,
            answered_ns,
            resource_version,
            ..
        } = record
        {
            answered.insert(name, (*answered_ns, *resource_version));
        }
    }
    let alive_at_end: BTreeSet<&str> = inputs.end.children.iter().map(|c| c.uid.as_str()).collect();
    let children = all_children(inputs);
    summary.children = children.len();
    let mut by_parent: BTreeMap<&str, Vec<&ChildSeen>> = BTreeMap::new();
    for child in children.values() {
        by_parent.entry(&child.parent_uid).or_default().push(child);
    }
    summary.parents_with_children = by_parent.len();
    let created = |c: &ChildSeen| {
        answered
            .get(c.name.as_str())
            .map_or(c.resource_version, |&(_, rv)| rv.min(c.resource_version))
    };
    for (parent, mut children) in by_parent {
        if children.len() < 2 {
            continue;
        }
        children.sort_by_key(|c| created(c));
        let (mut duplicate, mut promised) = (false, false);
        for (i, later) in children.iter().enumerate().skip(1) {
            for earlier in &children[..i] {
                // Whether the earlier child still existed when the later was created (the
                // garbage collector deletes a gone parent's children; a stale cache of
                // parents may still reconcile one).
                match (
                    earlier.deleted_at,
                    alive_at_end.contains(earlier.uid.as_str()),
                ) {
                    (Some(deleted), _) if deleted < created(later) => continue,
                    (None, false) => {
                        // Gone, and when is not known.
                        duplicate = true;
                        continue;
                    }
                    _ => duplicate = true,
                }
                let at = created(earlier);
                let why = if at <= later.read_at {
                    Some(format!(
                        "its cache was at version {} or later, and {} was created at {at}",
                        later.read_at, earlier.name
                    ))
                } else if at < later.fenced_at {
                    Some(format!(
                        "its read waited for its term's fence at {}, after {} was created at {at}",
                        later.fenced_at, earlier.name
                    ))
                } else {
                    match answered.get(earlier.name.as_str()) {
                        Some(&(answered_ns, _))
                            if earlier.creator == later.creator
                                && answered_ns < later.listed_ns =>
                        {
                            Some(format!(
                                "its read began {} µs after its own create of {} was answered",
                                (later.listed_ns - answered_ns) / 1_000,
                                earlier.name
                            ))
                        }
                        _ => None,
                    }
                };
                if let Some(why) = why {
                    promised = true;
                    violations.push(violation(
                        Rule::SingleChild,
                        &later.name,
                        format!(
                            "{} created a second child of parent {parent}: {why}",
                            later.creator
                        ),
                    ));
                }
            }
        }
        summary.duplicates += usize::from(duplicate);
        summary.duplicates_unpromised += usize::from(duplicate && !promised);
    }
}

fn check_cleanups(
    inputs: &Inputs<'_>,
    violations: &mut Vec<Violation>,
    summary: &mut LeaderSummary,
) {
    summary.cleanup_calls = inputs.calls.len();
    let mut calls: BTreeMap<&str, Vec<&CountedCall>> = BTreeMap::new();
    for call in inputs.calls {
        calls.entry(&call.call.uid).or_default().push(call);
    }
    for calls in calls.values_mut() {
        calls.sort_by_key(|c| c.call.sent_ns);
    }
    // The reconcile each call was made in, by (identity, when it was sent): when it
    // finished, and whether its removal of the finalizer may have reached the server.
    let mut reconciles: HashMap<(&str, i64), Removal> = HashMap::new();
    let mut fences: HashMap<&str, u64> = HashMap::new();
    for record in inputs.records {
        match record {
            LeaderRecord::Reconcile {
                identity,
                cleanup_sent_ns: Some(sent),
                finished_ns,
                succeeded,
                failed,
                ..
            } => {
                let removal = match (succeeded, failed) {
                    (true, _) => Removal::Done(*finished_ns),
                    (false, Some((step, _))) if step == "remove" => Removal::Maybe,
                    (false, _) => Removal::NotSent,
                };
                reconciles.insert((identity, *sent), removal);
            }
            LeaderRecord::Term {
                identity,
                parents_fence,
                ..
            } => {
                fences.insert(identity, *parents_fence);
            }
            _ => {}
        }
    }
    let mut required: BTreeSet<&str> = inputs
        .observed
        .parents
        .iter()
        .filter(|(_, p)| p.held_finalizer)
        .map(|(uid, _)| uid.as_str())
        .collect();
    required.extend(inputs.deleted_holding.iter().map(String::as_str));
    required.retain(|uid| !inputs.end.parents.contains_key(*uid));
    summary.cleanups_required = required.len();
    let key_of = |uid: &str| {
        inputs
            .observed
            .parents
            .get(uid)
            .map_or_else(|| uid.to_owned(), |p| p.key.clone())
    };
    for uid in &required {
        if !calls.contains_key(uid) {
            violations.push(violation(
                Rule::CleanupOnce,
                &key_of(uid),
                format!("parent {uid} held the finalizer and is gone, and its cleanup never ran"),
            ));
        }
    }
    for (uid, calls) in &calls {
        if let Some(parent) = inputs.end.parents.get(*uid)
            && !parent.deleting
        {
            violations.push(violation(
                Rule::CleanupOnce,
                &parent.key,
                format!(
                    "{} cleaned up parent {uid}, which lives on",
                    calls[0].call.identity
                ),
            ));
        }
        summary.cleaned_once += usize::from(calls.len() == 1);
        let first = calls[0];
        let deleted_at = inputs.observed.parents.get(*uid).and_then(|p| p.deleted_at);
        let (mut same_term, mut later_term) = (false, false);
        // Per term: when its own removal of the finalizer is known to have succeeded, and
        // whether a removal before it (another term's, or one of its own that failed or
        // left no record) may have gone through, making a later success a 404.
        let mut removed: HashMap<&str, i64> = HashMap::new();
        let mut uncertain: BTreeSet<&str> = BTreeSet::new();
        for (i, call) in calls.iter().enumerate() {
            let identity = call.call.identity.as_str();
            if i > 0 {
                if identity == first.call.identity {
                    same_term = true;
                } else {
                    later_term = true;
                }
            }
            if let Some(&removed_at) = removed.get(identity)
                && call.call.sent_ns > removed_at
            {
                violations.push(violation(
                    Rule::CleanupOnce,
                    &call.call.key,
                    format!(
                        "{identity} ran the cleanup of parent {uid} again, {} ms after its own removal of the finalizer succeeded",
                        (call.call.sent_ns - removed_at) / 1_000_000
                    ),
                ));
            }
            if i > 0
                && let (Some(deleted_at), Some(&fence)) = (deleted_at, fences.get(identity))
                && deleted_at < fence
            {
                violations.push(violation(
                    Rule::CleanupOnce,
                    &call.call.key,
                    format!(
                        "{identity} ran the cleanup of parent {uid}, which was deleted at version {deleted_at}, before its term's fence at {fence}"
                    ),
                ));
            }
            let others_before = calls[..i].iter().any(|c| c.call.identity != identity);
            match reconciles.get(&(identity, call.call.sent_ns)) {
                Some(Removal::Done(finished_ns))
                    if !others_before && !uncertain.contains(identity) =>
                {
                    removed.entry(identity).or_insert(*finished_ns);
                }
                Some(Removal::NotSent) => {}
                _ => {
                    uncertain.insert(identity);
                }
            }
        }
        summary.cleaned_again_same_term += usize::from(same_term);
        summary.cleaned_again_later_term += usize::from(later_term);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        leader::CleanupCall,
        parents::{ParentAtEnd, ParentSeen},
    };

    fn lease(rv: u64, holder: Option<&str>, acquired_ns: i64, transitions: i32) -> LeaseSeen {
        LeaseSeen {
            resource_version: rv,
            holder: holder.map(str::to_owned),
            acquired_ns: Some(acquired_ns),
            transitions: Some(transitions),
            seen_ns: acquired_ns,
        }
    }

    fn reconcile(identity: &str, started_ns: i64, finished_ns: i64) -> LeaderRecord {
        LeaderRecord::Reconcile {
            identity: identity.into(),
            key: "ns/p".into(),
            uid: Some("u".into()),
            started_ns,
            finished_ns,
            cleanup_sent_ns: None,
            succeeded: true,
            failed: None,
        }
    }

    fn child(name: &str, creator: &str, rv: u64, read_at: u64, fenced_at: u64) -> ChildSeen {
        ChildSeen {
            name: name.into(),
            uid: format!("uid-{name}"),
            parent_uid: "parent".into(),
            creator: creator.into(),
            resource_version: rv,
            read_at,
            fenced_at,
            listed_ns: 5_000,
            sent_ns: 5_100,
            deleted_at: None,
        }
    }

    /// a leads from 1 s, b from 10 s (after a's term lapsed).
    fn observed() -> Observed {
        Observed {
            lease: vec![
                lease(1, Some("a"), 1_000_000_000, 0),
                lease(2, Some("a"), 1_000_000_000, 0),
                lease(3, Some("b"), 10_000_000_000, 1),
            ],
            ..Observed::default()
        }
    }

    fn rules(inputs: &Inputs<'_>) -> Vec<Rule> {
        check(inputs).0.into_iter().map(|v| v.rule).collect()
    }

    fn fenced(records: &[LeaderRecord], observed: &Observed) -> Vec<Violation> {
        let inputs = Inputs {
            records,
            observed,
            calls: &[],
            end: &EndState::default(),
            deleted_holding: &BTreeSet::new(),
        };
        let mut violations = Vec::new();
        check_fenced(&inputs, &mut violations, &mut LeaderSummary::default());
        violations
    }

    #[test]
    fn work_inside_each_holder_s_term_passes() {
        let records = [
            reconcile("a", 2_000_000_000, 2_001_000_000),
            // Dropped at the fence: ends within the tolerance of b's start.
            reconcile("a", 9_000_000_000, 10_010_000_000),
            reconcile("b", 11_000_000_000, 11_001_000_000),
        ];
        assert!(fenced(&records, &observed()).is_empty());
    }

    #[test]
    fn a_reconcile_after_losing_the_lease_is_caught() {
        // a starts one after b acquired.
        let found = fenced(
            &[reconcile("a", 10_500_000_000, 10_501_000_000)],
            &observed(),
        );
        assert_eq!(found.len(), 2, "{found:?}");
        // a still running well after b acquired.
        let found = fenced(
            &[reconcile("a", 9_000_000_000, 10_200_000_000)],
            &observed(),
        );
        assert_eq!(found.len(), 1, "{found:?}");
        // b before its term.
        let found = fenced(&[reconcile("b", 9_000_000_000, 9_001_000_000)], &observed());
        assert_eq!(found.len(), 2, "{found:?}");
    }

    #[test]
    fn work_around_a_term_the_observer_missed_is_not_judged() {
        // Transitions 0 then 2: someone held it in between, from an unknown time.
        let mut observed = observed();
        observed.lease[2].transitions = Some(2);
        let inputs_records = [reconcile("a", 9_000_000_000, 9_001_000_000)];
        assert!(fenced(&inputs_records, &observed).is_empty());
        let (_, missed) = terms(&observed.lease);
        assert_eq!(missed, 1);
    }

    /// The children seen, and at the end those not seen deleted.
    fn children_rules(children: Vec<ChildSeen>, records: &[LeaderRecord]) -> Vec<Violation> {
        let end = EndState {
            children: children
                .iter()
                .filter(|c| c.deleted_at.is_none())
                .cloned()
                .collect(),
            ..EndState::default()
        };
        let observed = Observed {
            children: children.into_iter().map(|c| (c.uid.clone(), c)).collect(),
            ..Observed::default()
        };
        let inputs = Inputs {
            records,
            observed: &observed,
            calls: &[],
            end: &end,
            deleted_holding: &BTreeSet::new(),
        };
        let mut violations = Vec::new();
        check_children(&inputs, &mut violations, &mut LeaderSummary::default());
        violations
    }

    #[test]
    fn a_second_child_a_read_should_have_shown_is_caught() {
        // One child each: fine.
        assert!(children_rules(vec![child("c1", "a", 100, 90, 80)], &[]).is_empty());
        // The second's creator read at 120, after the first was created at 100.
        let found = children_rules(
            vec![
                child("c1", "a", 100, 90, 80),
                child("c2", "b", 130, 120, 110),
            ],
            &[],
        );
        assert_eq!(found.len(), 1, "{found:?}");
        // Its read waited for its fence at 105, after the first.
        let found = children_rules(
            vec![
                child("c1", "a", 100, 90, 80),
                child("c2", "b", 130, 95, 105),
            ],
            &[],
        );
        assert_eq!(found.len(), 1, "{found:?}");
        // The same term, whose own create was answered before its read began.
        let answered = LeaderRecord::Child {
            identity: "a".into(),
            parent_uid: "parent".into(),
            name: "c1".into(),
            resource_version: 100,
            sent_ns: 4_000,
            answered_ns: 4_500,
        };
        let found = children_rules(
            vec![child("c1", "a", 100, 90, 80), child("c2", "a", 130, 95, 80)],
            &[answered],
        );
        assert_eq!(found.len(), 1, "{found:?}");
        // A previous leader's create the server applied after the fence: no reader knew.
        let found = children_rules(
            vec![child("c1", "a", 100, 90, 80), child("c2", "b", 130, 95, 99)],
            &[],
        );
        assert!(found.is_empty(), "{found:?}");
        // A child made after the first was deleted (its parent gone) is not a second one.
        let mut deleted = child("c1", "a", 100, 90, 80);
        deleted.deleted_at = Some(110);
        let found = children_rules(vec![deleted, child("c2", "b", 130, 120, 110)], &[]);
        assert!(found.is_empty(), "{found:?}");
    }

    fn call(uid: &str, identity: &str, sent_ns: i64) -> CountedCall {
        CountedCall {
            call: CleanupCall {
                uid: uid.into(),
                key: "ns/p".into(),
                identity: identity.into(),
                sent_ns,
            },
            received_ns: sent_ns + 1,
        }
    }

    fn cleanup(identity: &str, sent_ns: i64, finished_ns: i64, succeeded: bool) -> LeaderRecord {
        LeaderRecord::Reconcile {
            identity: identity.into(),
            key: "ns/p".into(),
            uid: Some("u".into()),
            started_ns: sent_ns - 1,
            finished_ns,
            cleanup_sent_ns: Some(sent_ns),
            succeeded,
            failed: (!succeeded).then(|| ("remove".to_owned(), "conflict".to_owned())),
        }
    }

    fn cleanup_rules(calls: &[CountedCall], records: &[LeaderRecord], end: &EndState) -> Vec<Rule> {
        let mut observed = observed();
        observed.parents.insert(
            "u".into(),
            ParentSeen {
                key: "ns/p".into(),
                held_finalizer: true,
                deleting: true,
                deleted_at: Some(500),
            },
        );
        let inputs = Inputs {
            records,
            observed: &observed,
            calls,
            end,
            deleted_holding: &BTreeSet::new(),
        };
        let mut violations = Vec::new();
        check_cleanups(&inputs, &mut violations, &mut LeaderSummary::default());
        violations.into_iter().map(|v| v.rule).collect()
    }

    #[test]
    fn cleanups_are_held_to_the_finalizer_s_promises() {
        let end = EndState::default();
        // Once: fine.
        assert_eq!(
            cleanup_rules(&[call("u", "a", 10)], &[cleanup("a", 10, 20, true)], &end),
            []
        );
        // Never.
        assert_eq!(cleanup_rules(&[], &[], &end), [Rule::CleanupOnce]);
        // Again by the term that removed the finalizer.
        let again = [call("u", "a", 10), call("u", "a", 30)];
        assert_eq!(
            cleanup_rules(&again, &[cleanup("a", 10, 20, true)], &end),
            [Rule::CleanupOnce]
        );
        // Again after a removal that failed: at-least-once.
        assert_eq!(
            cleanup_rules(&again, &[cleanup("a", 10, 20, false)], &end),
            []
        );
        // A removal that failed may have gone through: the success after it may be a 404,
        // and a third run is at-least-once too.
        let thrice = [call("u", "a", 10), call("u", "a", 30), call("u", "a", 50)];
        let records = [cleanup("a", 10, 20, false), cleanup("a", 30, 40, true)];
        assert_eq!(cleanup_rules(&thrice, &records, &end), []);
        // A cleanup that failed before its removal leaves the next success certain.
        let mut counter_failed = cleanup("a", 10, 20, false);
        if let LeaderRecord::Reconcile { failed, .. } = &mut counter_failed {
            *failed = Some(("cleanup".to_owned(), "no answer".to_owned()));
        }
        let records = [counter_failed, cleanup("a", 30, 40, true)];
        assert_eq!(cleanup_rules(&thrice, &records, &end), [Rule::CleanupOnce]);
        // Again by a term whose fence (600) came after the deletion (500).
        let fenced = LeaderRecord::Term {
            identity: "b".into(),
            children_fence: 600,
            parents_fence: 600,
            at_ns: 25,
        };
        let later = [call("u", "a", 10), call("u", "b", 30)];
        assert_eq!(
            cleanup_rules(&later, &[cleanup("a", 10, 20, false), fenced], &end),
            [Rule::CleanupOnce]
        );
        // Of a parent that lives on.
        let mut alive = EndState::default();
        alive.parents.insert(
            "u".into(),
            ParentAtEnd {
                key: "ns/p".into(),
                holds_finalizer: true,
                deleting: false,
            },
        );
        assert_eq!(
            cleanup_rules(&[call("u", "a", 10)], &[cleanup("a", 10, 20, true)], &alive),
            [Rule::CleanupOnce]
        );
    }

    #[test]
    fn a_check_that_held_nothing_fails() {
        let observed = Observed::default();
        let inputs = Inputs {
            records: &[],
            observed: &observed,
            calls: &[],
            end: &EndState::default(),
            deleted_holding: &BTreeSet::new(),
        };
        assert_eq!(
            rules(&inputs),
            [Rule::Fenced, Rule::SingleChild, Rule::CleanupOnce]
        );
    }
}
