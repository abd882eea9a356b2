//! What the fleet benchmark's subjects print, one JSON object per line on stdout, and the
//! names and labels the driver and the subjects agree on. Included by `fleet-bench` and
//! `subject-fleet` (`#[path]`); the client-go subject (`go-subject/fleet`) prints the same
//! lines and uses the same names.
//!
//! The driver writes three kinds of ConfigMap, told apart by their name's prefix:
//! [`INITIAL_PREFIX`] (the P objects each cluster holds before the subject starts),
//! [`FLOOD_PREFIX`] (the flood of the fairness phase) and [`SAMPLE_PREFIX`] (the single
//! changes it times). A reconcile reads its object from the cache and sleeps the
//! milliseconds of its [`COST_ANNOTATION`], if any (a stand-in for a call the reconcile
//! makes), then records itself.

use serde::{Deserialize, Serialize};

/// The prefix of the ConfigMaps each cluster holds from the start.
pub const INITIAL_PREFIX: &str = "cm-";
/// The prefix of the ConfigMaps of the flood.
pub const FLOOD_PREFIX: &str = "flood-";
/// The prefix of the single changes whose latency is measured.
pub const SAMPLE_PREFIX: &str = "sample-";
/// The annotation that says how long a reconcile of the object works, ms.
pub const COST_ANNOTATION: &str = "fleet-bench/cost-ms";

/// One line a subject prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Line {
    /// The subject runs, with no cluster engaged yet.
    Ready {
        /// `kube-informer` or `client-go`.
        subject: String,
        /// How the subject's workers are arranged, for the report.
        workers: String,
        /// Unix ns.
        at_ns: i64,
    },
    /// A cluster was announced to the subject and its informer started.
    Engaged {
        /// The cluster's name.
        cluster: String,
        /// Unix ns.
        at_ns: i64,
    },
    /// The first reconcile of one of the cluster's objects ended.
    First {
        /// The cluster's name.
        cluster: String,
        /// The object's name.
        name: String,
        /// Unix ns.
        at_ns: i64,
    },
    /// Every one of the cluster's initial objects has been reconciled.
    Synced {
        /// The cluster's name.
        cluster: String,
        /// Initial objects reconciled.
        objects: usize,
        /// Unix ns.
        at_ns: i64,
    },
    /// A sample object's first reconcile ended.
    Sample {
        /// The cluster's name.
        cluster: String,
        /// The object's name.
        name: String,
        /// Unix ns.
        at_ns: i64,
    },
    /// The flood's objects of one cluster have all been reconciled.
    FloodDone {
        /// The cluster's name.
        cluster: String,
        /// Which flood: the part of the objects' names between [`FLOOD_PREFIX`] and the
        /// last `-` (`flood-p0-00017` is of flood `p0`).
        phase: String,
        /// Distinct flood objects reconciled.
        reconciled: usize,
        /// Unix ns.
        at_ns: i64,
    },
}
