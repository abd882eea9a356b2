//! The watch step: one watch call, its events applied to the store, and how it ended. A
//! streaming list is a watch too: its first events are the current state.

use std::{ops::ControlFlow, time::Duration};

use futures::StreamExt;
use kube_core::Resource;
use rand::Rng;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use super::{
    Reflector,
    state::{InitialEvents, WatchEnd, WatchReport},
    stats::CatchUp,
    store::{ReflectorEvent, ReflectorStore},
};
use crate::{
    error::{Error, StreamingRefusal, Verb, quoted_short},
    key::ObjectKey,
    list_watch::{Change, ListWatch, RawObject, WatchEvent, WatchOptions, WatchStream},
};

/// Whether a watch is a streaming list (`sendInitialEvents`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum StreamingList {
    /// Send the current state first, then changes.
    Yes,
    /// Changes after the start resourceVersion only.
    No,
    /// Changes after a warm restart's snapshot: the store is synced at the first bookmark,
    /// which a short timeout makes the server send soon (two seconds before it).
    Resuming,
}

/// The timeout a resumed watch asks for: the API server's watch cache sends a bookmark two
/// seconds before a watch's timeout, and this is the shortest for which that lies ahead.
const RESUMING_WATCH_TIMEOUT: Duration = Duration::from_secs(3);

/// The initial phase of a streaming list: how many objects it sent so far.
struct InitialPhase {
    listed: usize,
    started: Instant,
}

/// How far one watch got, which each of its steps advances and its report is made of.
struct Progress {
    /// The resourceVersion the store is synced to.
    last_rv: String,
    /// A streaming list's initial phase, taken once its end bookmark arrived.
    initial: Option<InitialPhase>,
    /// A resumed watch that has not caught up yet: false at its first bookmark, or once it
    /// has seen the version the server's cache was at.
    resuming: bool,
    /// The events received.
    events: usize,
}

impl Progress {
    /// The end of a watch that failed with `error`.
    fn failed(&self, error: Error) -> WatchEnd {
        WatchEnd::Failed {
            error,
            events: self.events,
        }
    }
}

impl<K, L, S> Reflector<K, L, S>
where
    K: Resource + Send + Sync + 'static,
    L: ListWatch<K>,
    S: ReflectorStore<K>,
{
    /// Watches from `resource_version` until the watch ends, applying its events. As a
    /// streaming list (`streaming`), its first events are the current state, up to the
    /// bookmark that ends them.
    pub(super) async fn watch(
        &self,
        cancel: &CancellationToken,
        resource_version: &str,
        streaming: StreamingList,
    ) -> WatchReport {
        let initial = match streaming {
            StreamingList::Yes => {
                self.store.apply(ReflectorEvent::ListStart);
                Some(InitialPhase {
                    listed: 0,
                    started: Instant::now(),
                })
            }
            StreamingList::No | StreamingList::Resuming => None,
        };
        let mut progress = Progress {
            last_rv: resource_version.to_owned(),
            initial,
            resuming: streaming == StreamingList::Resuming,
            events: 0,
        };
        let end = self.follow(cancel, &mut progress).await;
        let initial_events = match (streaming, progress.initial) {
            (StreamingList::No | StreamingList::Resuming, _) => InitialEvents::NotRequested,
            (StreamingList::Yes, Some(_)) => InitialEvents::Incomplete,
            (StreamingList::Yes, None) => InitialEvents::Complete,
        };
        WatchReport {
            end,
            last_rv: progress.last_rv,
            initial_events,
            caught_up: streaming == StreamingList::Resuming && !progress.resuming,
        }
    }

    /// The watch itself: opens it, then applies its events until it ends.
    async fn follow(&self, cancel: &CancellationToken, progress: &mut Progress) -> WatchEnd {
        let options = self.watch_options(progress);
        debug!(rv = %progress.last_rv, timeout_s = options.timeout.map(|t| t.as_secs()), "watching");
        let started = Instant::now();
        let mut stream = match self.open(cancel, &options).await {
            Ok(stream) => stream,
            Err(end) => return end,
        };
        // A resumed watch has caught up once it has seen the version the server's cache is
        // at now (the freshness a cold start's first list has), or at its first bookmark.
        let mut consistent_read = progress.resuming.then(|| Box::pin(self.cached_version()));
        let mut current: Option<u64> = None;
        loop {
            if progress.resuming
                && current.is_some_and(|current| version_number(&progress.last_rv) >= Some(current))
            {
                self.caught_up(&mut progress.resuming, &progress.last_rv, CatchUp::Version);
            }
            // A body the connection has buffered is read without ever waiting, so without
            // this the reflector would apply a whole streaming list before the handlers'
            // tasks (woken on this thread) run once, and a compact cache would hold every
            // object decoded in their buffers meanwhile.
            tokio::task::coop::consume_budget().await;
            let silence = match progress.initial {
                Some(_) => self
                    .config
                    .initial_events_timeout
                    .min(self.config.idle_timeout),
                None => self.config.idle_timeout,
            };
            let relist = async {
                match &self.relist {
                    Some(trigger) => trigger.notified().await,
                    None => std::future::pending().await,
                }
            };
            let read = async {
                match consistent_read.as_mut() {
                    Some(read) => read.await,
                    None => std::future::pending().await,
                }
            };
            let next = tokio::select! {
                biased;
                () = cancel.cancelled() => return WatchEnd::Cancelled,
                () = relist, if progress.initial.is_none() => return WatchEnd::RelistRequested,
                version = read => {
                    consistent_read = None;
                    current = version;
                    continue;
                }
                n = tokio::time::timeout(silence, stream.next()) => n,
            };
            let event = match next {
                Err(_) => return self.silent(progress, silence),
                Ok(None) => {
                    let elapsed = started.elapsed();
                    let events = progress.events;
                    debug!(rv = %progress.last_rv, events, elapsed_ms = elapsed.as_millis() as u64, "watch closed");
                    return WatchEnd::Closed { events, elapsed };
                }
                Ok(Some(Err(error))) => return progress.failed(error),
                Ok(Some(Ok(event))) => event,
            };
            progress.events += 1;
            if let ControlFlow::Break(end) = self.apply(progress, event) {
                return end;
            }
        }
    }

    /// What the watch from `progress` asks for.
    fn watch_options(&self, progress: &Progress) -> WatchOptions {
        let min = self.config.min_watch_timeout;
        let timeout = if progress.resuming {
            RESUMING_WATCH_TIMEOUT
        } else {
            min.mul_f64(1.0 + rand::rng().random::<f64>())
        };
        WatchOptions {
            resource_version: progress.last_rv.clone(),
            timeout: Some(Duration::from_secs(timeout.as_secs().max(1))),
            allow_bookmarks: true,
            send_initial_events: progress.initial.is_some(),
            shard: self.current_shard(),
        }
    }

    /// Opens the watch; how it ended when it did not open.
    async fn open(
        &self,
        cancel: &CancellationToken,
        options: &WatchOptions,
    ) -> Result<WatchStream<K>, WatchEnd> {
        tokio::select! {
            biased;
            () = cancel.cancelled() => Err(WatchEnd::Cancelled),
            r = self.lw.watch(options) => match r {
                Ok(stream) => Ok(stream),
                Err(Error::Api { status, .. })
                    if options.send_initial_events && matches!(status.code, 400 | 422) =>
                {
                    let error = self.unsupported(
                        StreamingRefusal::Rejected,
                        format!("{} ({})", status.message, status.code),
                    );
                    Err(WatchEnd::Failed { error, events: 0 })
                }
                Err(error) => Err(WatchEnd::Refused { error }),
            },
        }
    }

    /// How a watch silent for `silence` ends.
    fn silent(&self, progress: &Progress, silence: Duration) -> WatchEnd {
        if progress.initial.is_some() {
            // The initial events of a streaming list arrive back to back, then the end
            // bookmark: a pause before it means they are not coming.
            let events = progress.events;
            let error = self.unsupported(
                StreamingRefusal::Ignored,
                format!(
                    "no initial-events-end bookmark after {events} events and {silence:?} of silence"
                ),
            );
            return progress.failed(error);
        }
        self.report(&Error::IdleTimeout {
            resource: self.resource.clone(),
            idle: self.config.idle_timeout,
        });
        WatchEnd::Idle
    }

    /// Applies one event to the store; breaks with how the watch ends when the event ends
    /// it.
    fn apply(&self, progress: &mut Progress, event: WatchEvent<K>) -> ControlFlow<WatchEnd> {
        if progress.initial.is_some()
            && !matches!(
                event,
                WatchEvent::Added(_)
                    | WatchEvent::Decoded {
                        change: Change::Added,
                        ..
                    }
                    | WatchEvent::Error(_)
                    | WatchEvent::Bookmark { .. }
            )
        {
            // A streaming list's initial events are all `ADDED`s, up to the end
            // bookmark; a change before it means the server ignored
            // `sendInitialEvents` and this is an ordinary watch (whose first event may
            // well be an `ADDED` of a new object).
            let error = self.unsupported(
                StreamingRefusal::Ignored,
                "a change arrived before the initial-events-end bookmark (sendInitialEvents ignored)"
                    .to_owned(),
            );
            return ControlFlow::Break(progress.failed(error));
        }
        let (obj, raw, deleted) = match event {
            WatchEvent::Added(o) | WatchEvent::Modified(o) => (o, None, false),
            WatchEvent::Deleted(o) => (o, None, true),
            WatchEvent::Decoded {
                change,
                object,
                raw,
            } => (object, Some(raw), change == Change::Deleted),
            WatchEvent::Bookmark {
                resource_version,
                initial_events_end,
            } => {
                self.bookmarked(progress, resource_version, initial_events_end);
                return ControlFlow::Continue(());
            }
            WatchEvent::Error(status) => {
                let error = Error::from_status(
                    status,
                    Verb::Watch,
                    &self.resource,
                    self.namespace.as_deref(),
                );
                return ControlFlow::Break(progress.failed(error));
            }
            // Its final state is unknown: a relist delivers the deletion as a tombstone
            // of the last good state.
            WatchEvent::Undecodable {
                change: Change::Deleted,
                object,
            } => {
                let error = self.undecodable(Verb::Watch, &object);
                return ControlFlow::Break(progress.failed(error));
            }
            // The last good state stays; every other object goes on being followed.
            WatchEvent::Undecodable { object, .. } => {
                self.report(&self.undecodable(Verb::Watch, &object));
                match progress.initial.as_mut() {
                    Some(phase) => {
                        phase.listed += 1;
                        self.store
                            .apply(ReflectorEvent::ListedUndecodable(object.key));
                    }
                    None => {
                        if let Some(rv) = object.resource_version.filter(|rv| !rv.is_empty()) {
                            progress.last_rv = rv;
                            self.synced.set(&progress.last_rv);
                        }
                    }
                }
                return ControlFlow::Continue(());
            }
        };
        self.apply_object(progress, obj, raw, deleted)
    }

    /// A bookmark: the end of a streaming list's initial events when it says so, and the
    /// version the store has reached.
    fn bookmarked(
        &self,
        progress: &mut Progress,
        resource_version: String,
        initial_events_end: bool,
    ) {
        // A bookmark's version is where the next watch starts: one the watch cannot be at
        // would have every later watch fail, or skip changes. The bookmark changes nothing
        // else, so it is reported and dropped, and the watch goes on.
        if progress.initial.is_none()
            && !resource_version.is_empty()
            && let Err(reason) = next_version(&progress.last_rv, &resource_version)
        {
            self.report(&Error::MalformedEvent {
                resource: self.resource.clone(),
                detail: format!("bookmark: {reason}; ignored"),
            });
            return;
        }
        if initial_events_end && let Some(phase) = progress.initial.take() {
            self.store
                .apply(ReflectorEvent::ListEnd(resource_version.clone()));
            info!(
                rv = %resource_version,
                objects = phase.listed,
                elapsed_ms = phase.started.elapsed().as_millis() as u64,
                "streamed list"
            );
        }
        if !resource_version.is_empty() && progress.initial.is_none() {
            progress.last_rv = resource_version;
            if progress.resuming {
                self.caught_up(&mut progress.resuming, &progress.last_rv, CatchUp::Bookmark);
            } else {
                self.store
                    .apply(ReflectorEvent::Bookmark(progress.last_rv.clone()));
            }
            self.synced.set(&progress.last_rv);
        }
    }

    /// An added, changed or deleted object: stored, deleted or dropped by the shard, and
    /// its version taken. Breaks when it has no name.
    fn apply_object(
        &self,
        progress: &mut Progress,
        obj: K,
        raw: Option<RawObject>,
        deleted: bool,
    ) -> ControlFlow<WatchEnd> {
        let rv = obj.meta().resource_version.clone();
        // A change older than one already applied is no state the server is in now: the
        // cache would go back in time and claim to be synced. Only a list can tell what the
        // state is, so the watch ends before the change is applied.
        if progress.initial.is_none()
            && let Some(rv) = rv.as_deref().filter(|rv| !rv.is_empty())
            && let Err(reason) = next_version(&progress.last_rv, rv)
        {
            let what = if deleted { "deletion" } else { "change" };
            let key =
                ObjectKey::from_object(&obj).map_or_else(|_| "?".to_owned(), |k| k.to_string());
            let error = Error::MalformedEvent {
                resource: self.resource.clone(),
                detail: format!("{what} of {key}: {reason}"),
            };
            return ControlFlow::Break(progress.failed(error));
        }
        // One from outside the shard (a server that does not apply it) is not ours: on a
        // field that cannot change it never was, so there is nothing to store or delete,
        // but its version still counts. On one that can (a controller owner), an
        // update may have moved it out: it leaves the cache, as a delete.
        let inside = self.in_shard(&obj);
        let moved_out = !inside
            && progress.initial.is_none()
            && self.current_shard().is_some_and(|s| s.field().mutable());
        if moved_out {
            if let Ok((key, obj, _)) = self.prepare(obj, None) {
                self.store
                    .apply(ReflectorEvent::Delete { key, object: obj });
            }
        } else if inside {
            let (key, obj, raw) = match self.prepare(obj, raw) {
                Ok(prepared) => prepared,
                Err(_) => {
                    let error = Error::MalformedEvent {
                        resource: self.resource.clone(),
                        detail: "object without metadata.name".to_owned(),
                    };
                    return ControlFlow::Break(progress.failed(error));
                }
            };
            match (progress.initial.as_mut(), deleted) {
                // Only `ADDED`s come before the end bookmark (checked in `apply`).
                (Some(phase), _) => {
                    phase.listed += 1;
                    self.store.apply(ReflectorEvent::Listed {
                        key,
                        object: obj,
                        raw,
                    });
                }
                (None, true) => self
                    .store
                    .apply(ReflectorEvent::Delete { key, object: obj }),
                (None, false) => self.store.apply(ReflectorEvent::Upsert {
                    key,
                    object: obj,
                    raw,
                }),
            }
        }
        // During a streaming list the objects' versions are not in order; only the
        // end bookmark says which version the whole state has.
        if let Some(rv) = rv.filter(|rv| !rv.is_empty())
            && progress.initial.is_none()
        {
            progress.last_rv = rv;
            self.synced.set(&progress.last_rv);
        }
        ControlFlow::Continue(())
    }

    /// A resumed watch has seen every change up to `resource_version`: the snapshot and
    /// what it missed are the server's state.
    fn caught_up(&self, resuming: &mut bool, resource_version: &str, by: CatchUp) {
        *resuming = false;
        // Said before the store is synced, so that whoever waits for it reads how.
        self.stats.caught_up(by);
        self.store
            .apply(ReflectorEvent::CaughtUp(resource_version.to_owned()));
        info!(rv = %resource_version, ?by, "the resumed watch caught up");
    }

    /// The version the server's cache is at now ([`ListWatch::cached_version`]); `None`
    /// when the read fails or the version is no number (the bookmark still says it).
    async fn cached_version(&self) -> Option<u64> {
        match self.lw.cached_version().await {
            Ok(version) => version_number(&version),
            Err(error) => {
                debug!(%error, "reading the version the server's cache is at failed");
                None
            }
        }
    }
}

/// A resourceVersion as the number etcd's revisions are; `None` for one that is not.
fn version_number(resource_version: &str) -> Option<u64> {
    resource_version.parse().ok()
}

/// Whether a watch at `last` may move to `next`, and why not. The API server's versions
/// are etcd's revisions, which only grow along a watch (a repeat is harmless: the store
/// ignores an object at the version it holds); a server whose versions are not numbers
/// (an aggregated API's own) is taken at its word.
fn next_version(last: &str, next: &str) -> Result<(), String> {
    let Some(at) = version_number(last) else {
        return Ok(());
    };
    match version_number(next) {
        Some(next) if next >= at => Ok(()),
        Some(next) => Err(format!(
            "resourceVersion {next} is older than {at}, which the watch had reached"
        )),
        None => Err(format!(
            "resourceVersion {} is not a version (the watch's are numbers, at {at} now)",
            quoted_short(next)
        )),
    }
}
