//! Status conditions (`metav1.Condition`) set the way apimachinery's
//! `meta.SetStatusCondition` sets them: `lastTransitionTime` moves only when the status
//! changes, and `observedGeneration` says which spec the condition is about.
//!
//! ```
//! use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
//! use kube_informer::conditions::{ConditionStatus, NewCondition, find_condition, set_condition};
//!
//! let mut conditions: Vec<Condition> = Vec::new();
//! let ready = NewCondition::new("Ready", ConditionStatus::True, "Registered", "route in etcd")
//!     .observed_generation(Some(3));
//! assert!(set_condition(&mut conditions, ready.clone()), "a new condition is a change");
//! let first = find_condition(&conditions, "Ready").unwrap().last_transition_time.clone();
//! assert!(!set_condition(&mut conditions, ready), "the same again is not");
//! assert_eq!(find_condition(&conditions, "Ready").unwrap().last_transition_time, first);
//! ```

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::{Timestamp, Unit},
};
use kube_core::Resource;

/// A condition's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConditionStatus {
    /// `True`.
    True,
    /// `False`.
    False,
    /// `Unknown`: the controller cannot tell yet.
    Unknown,
}

impl ConditionStatus {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }
}

/// A condition to set: everything but its transition time, which [`set_condition`]
/// decides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewCondition {
    type_: String,
    status: ConditionStatus,
    reason: String,
    message: String,
    observed_generation: Option<i64>,
}

impl NewCondition {
    /// The condition `type_` (e.g. `Ready`) with `status`, a machine-readable `reason`
    /// (UpperCamelCase) and a human-readable `message`.
    pub fn new(
        type_: impl Into<String>,
        status: ConditionStatus,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            type_: type_.into(),
            status,
            reason: reason.into(),
            message: message.into(),
            observed_generation: None,
        }
    }

    /// The generation of the spec this condition is about.
    #[must_use]
    pub fn observed_generation(mut self, generation: Option<i64>) -> Self {
        self.observed_generation = generation;
        self
    }

    /// The generation of `object`, as reconciled now.
    #[must_use]
    pub fn observed_from<K: Resource>(self, object: &K) -> Self {
        let generation = object.meta().generation;
        self.observed_generation(generation)
    }
}

/// Sets `new` in `conditions`: adds it, or updates the condition of its type. The
/// transition time is now when the condition is new or its status changes, and is kept
/// otherwise. Returns whether anything changed, so a caller writes the status only then.
pub fn set_condition(conditions: &mut Vec<Condition>, new: NewCondition) -> bool {
    set_condition_at(conditions, new, Timestamp::now())
}

fn set_condition_at(conditions: &mut Vec<Condition>, new: NewCondition, now: Timestamp) -> bool {
    // The API keeps whole seconds: a finer time would differ from what is read back.
    let now = now.round(Unit::Second).unwrap_or(now);
    let status = new.status.as_str();
    let Some(existing) = conditions.iter_mut().find(|c| c.type_ == new.type_) else {
        conditions.push(Condition {
            type_: new.type_,
            status: status.to_owned(),
            reason: new.reason,
            message: new.message,
            observed_generation: new.observed_generation,
            last_transition_time: Time(now),
        });
        return true;
    };
    let mut changed = false;
    if existing.status != status {
        existing.status = status.to_owned();
        existing.last_transition_time = Time(now);
        changed = true;
    }
    if existing.reason != new.reason {
        existing.reason = new.reason;
        changed = true;
    }
    if existing.message != new.message {
        existing.message = new.message;
        changed = true;
    }
    if existing.observed_generation != new.observed_generation {
        existing.observed_generation = new.observed_generation;
        changed = true;
    }
    changed
}

/// The condition of `type_`, if there is one.
pub fn find_condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Removes the condition of `type_`; whether there was one.
pub fn remove_condition(conditions: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_);
    conditions.len() != before
}

/// Whether the condition of `type_` is there with `status`.
pub fn is_condition(conditions: &[Condition], type_: &str, status: ConditionStatus) -> bool {
    find_condition(conditions, type_).is_some_and(|c| c.status == status.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_780_000_000 + seconds).unwrap()
    }

    fn ready(status: ConditionStatus, reason: &str) -> NewCondition {
        NewCondition::new("Ready", status, reason, "msg").observed_generation(Some(1))
    }

    #[test]
    fn the_transition_time_moves_only_when_the_status_changes() {
        let mut conditions = Vec::new();
        assert!(set_condition_at(
            &mut conditions,
            ready(ConditionStatus::False, "Waiting"),
            at(0)
        ));
        assert!(!set_condition_at(
            &mut conditions,
            ready(ConditionStatus::False, "Waiting"),
            at(10)
        ));
        assert_eq!(conditions[0].last_transition_time, Time(at(0)));

        // A new reason or generation is a change, not a transition.
        let next = ready(ConditionStatus::False, "Retrying").observed_generation(Some(2));
        assert!(set_condition_at(&mut conditions, next, at(20)));
        assert_eq!(conditions[0].last_transition_time, Time(at(0)));
        assert_eq!(conditions[0].reason, "Retrying");
        assert_eq!(conditions[0].observed_generation, Some(2));

        assert!(set_condition_at(
            &mut conditions,
            ready(ConditionStatus::True, "Done"),
            at(30)
        ));
        assert_eq!(conditions[0].last_transition_time, Time(at(30)));
        assert_eq!(conditions.len(), 1);
        assert!(is_condition(&conditions, "Ready", ConditionStatus::True));
    }

    #[test]
    fn conditions_of_other_types_are_left_alone_and_removal_says_whether_one_was_there() {
        let mut conditions = Vec::new();
        set_condition_at(&mut conditions, ready(ConditionStatus::True, "Done"), at(0));
        let synced = NewCondition::new("Synced", ConditionStatus::Unknown, "Starting", "");
        set_condition_at(&mut conditions, synced, at(5));
        assert_eq!(conditions.len(), 2);
        assert_eq!(
            find_condition(&conditions, "Ready")
                .unwrap()
                .last_transition_time,
            Time(at(0))
        );
        assert!(remove_condition(&mut conditions, "Synced"));
        assert!(!remove_condition(&mut conditions, "Synced"));
        assert!(find_condition(&conditions, "Synced").is_none());
        assert!(!is_condition(
            &conditions,
            "Synced",
            ConditionStatus::Unknown
        ));
    }

    #[test]
    fn the_transition_time_is_whole_seconds() {
        let mut conditions = Vec::new();
        let now = at(0) + k8s_openapi::jiff::SignedDuration::from_millis(400);
        set_condition_at(&mut conditions, ready(ConditionStatus::True, "Done"), now);
        assert_eq!(conditions[0].last_transition_time, Time(at(0)));
    }
}
