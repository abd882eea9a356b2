//! What the subjects of `recovery-bench` print, one JSON object a line on stdout: a
//! [`RecoveryLine::Synced`] line once the informer has synced, then a
//! [`RecoveryLine::Event`] line for every event a handler sees after the initial list (the
//! initial adds are not printed), and a [`RecoveryLine::WatchError`] line for every error
//! the informer's list-watch reports. The Rust subject is `src/bin/subject_recovery.rs`,
//! the client-go one `go-subject/recovery`; both cache the ConfigMaps of one namespace with
//! their library's default configuration.

use std::path::PathBuf;

use clap::Parser;
use serde::{Deserialize, Serialize};

/// The command line both recovery subjects take.
#[derive(Debug, Parser)]
pub struct RecoveryArgs {
    /// The kubeconfig file (it points at the subject's own fault proxy).
    #[arg(long)]
    pub kubeconfig: PathBuf,
    /// The namespace whose ConfigMaps to cache.
    #[arg(long)]
    pub namespace: String,
}

/// One line of a recovery subject's output.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RecoveryLine {
    /// The informer has synced.
    Synced {
        /// Which subject.
        subject: String,
        /// Milliseconds from the start of `main` to synced.
        synced_ms: f64,
        /// Objects in the cache then.
        cached: usize,
        /// When, Unix nanoseconds.
        at_ns: i64,
    },
    /// A handler saw an event.
    Event(EventLine),
    /// The list-watch reported an error (the informer retries on its own).
    WatchError {
        /// True for 410 Gone / "too old resource version".
        gone: bool,
        /// The error as the library prints it.
        message: String,
        /// When, Unix nanoseconds.
        at_ns: i64,
    },
}

/// One event a subject's handler saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventLine {
    /// `add`, `update` or `delete`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The object's name.
    pub name: String,
    /// The object's resourceVersion (for a delete, its final or last known state's).
    pub resource_version: String,
    /// For an update, the old object's resourceVersion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_resource_version: Option<String>,
    /// For a delete, whether the handler got a tombstone (the deletion was noticed by a
    /// relist, client-go's `DeletedFinalStateUnknown`).
    #[serde(default)]
    pub tombstone: bool,
    /// When the handler saw it, Unix nanoseconds.
    pub at_ns: i64,
}

/// Prints `line` to stdout as one JSON line.
pub fn print(line: &RecoveryLine) {
    println!("{}", serde_json::to_string(line).expect("serialises"));
}
