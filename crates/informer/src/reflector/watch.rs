//! The watch step: one watch call, its events applied to the store, and how it ended. A
//! streaming list is a watch too: its first events are the current state.

use std::time::Duration;

use futures::StreamExt;
use kube_core::Resource;
use rand::Rng;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use super::{
    CatchUp, Reflector, ReflectorStore,
    state::{InitialEvents, WatchEnd, WatchReport},
};
use crate::{
    error::{Error, StreamingRefusal, Verb},
    list_watch::{Change, ListWatch, WatchEvent, WatchOptions},
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
        let mut last_rv = resource_version.to_owned();
        let mut initial = match streaming {
            StreamingList::Yes => {
                self.store.start_list();
                Some(InitialPhase {
                    listed: 0,
                    started: Instant::now(),
                })
            }
            StreamingList::No | StreamingList::Resuming => None,
        };
        let mut resuming = streaming == StreamingList::Resuming;
        let end = self
            .follow(cancel, &mut last_rv, &mut initial, &mut resuming)
            .await;
        let initial_events = match (streaming, initial) {
            (StreamingList::No | StreamingList::Resuming, _) => InitialEvents::NotRequested,
            (StreamingList::Yes, Some(_)) => InitialEvents::Incomplete,
            (StreamingList::Yes, None) => InitialEvents::Complete,
        };
        WatchReport {
            end,
            last_rv,
            initial_events,
            caught_up: streaming == StreamingList::Resuming && !resuming,
        }
    }

    /// The watch itself; `initial` is taken once a streaming list's end bookmark arrived,
    /// `resuming` turns false at a resumed watch's first bookmark.
    async fn follow(
        &self,
        cancel: &CancellationToken,
        last_rv: &mut String,
        initial: &mut Option<InitialPhase>,
        resuming: &mut bool,
    ) -> WatchEnd {
        let min = self.config.min_watch_timeout;
        let timeout = if *resuming {
            RESUMING_WATCH_TIMEOUT
        } else {
            min.mul_f64(1.0 + rand::rng().random::<f64>())
        };
        let options = WatchOptions {
            resource_version: last_rv.clone(),
            timeout: Some(Duration::from_secs(timeout.as_secs().max(1))),
            allow_bookmarks: true,
            send_initial_events: initial.is_some(),
            shard: self.current_shard(),
        };
        debug!(rv = %last_rv, timeout_s = options.timeout.map(|t| t.as_secs()), "watching");
        let started = Instant::now();
        let mut stream = tokio::select! {
            biased;
            () = cancel.cancelled() => return WatchEnd::Cancelled,
            r = self.lw.watch(&options) => match r {
                Ok(stream) => stream,
                Err(Error::Api { status, .. })
                    if initial.is_some() && matches!(status.code, 400 | 422) =>
                {
                    let error = self.unsupported(
                        StreamingRefusal::Rejected,
                        format!("{} ({})", status.message, status.code),
                    );
                    return WatchEnd::Failed { error, events: 0 };
                }
                Err(error) => return WatchEnd::Refused { error },
            },
        };
        let mut events = 0usize;
        // A resumed watch has caught up once it has seen the version the server's cache is
        // at now (the freshness a cold start's first list has), or at its first bookmark.
        let mut consistent_read = resuming.then(|| Box::pin(self.cached_version()));
        let mut current: Option<u64> = None;
        loop {
            if *resuming && current.is_some_and(|current| version_number(last_rv) >= Some(current))
            {
                self.caught_up(resuming, last_rv, CatchUp::Version);
            }
            // A body the connection has buffered is read without ever waiting, so without
            // this the reflector would apply a whole streaming list before the handlers'
            // tasks (woken on this thread) run once, and a compact cache would hold every
            // object decoded in their buffers meanwhile.
            tokio::task::coop::consume_budget().await;
            let silence = match initial {
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
                () = relist, if initial.is_none() => return WatchEnd::RelistRequested,
                version = read => {
                    consistent_read = None;
                    current = version;
                    continue;
                }
                n = tokio::time::timeout(silence, stream.next()) => n,
            };
            let event = match next {
                // The initial events of a streaming list arrive back to back, then the end
                // bookmark: a pause before it means they are not coming.
                Err(_) if initial.is_some() => {
                    let error = self.unsupported(
                        StreamingRefusal::Ignored,
                        format!(
                            "no initial-events-end bookmark after {events} events and {silence:?} of silence"
                        ),
                    );
                    return WatchEnd::Failed { error, events };
                }
                Err(_) => {
                    self.report(&Error::IdleTimeout {
                        resource: self.resource.clone(),
                        idle: self.config.idle_timeout,
                    });
                    return WatchEnd::Idle;
                }
                Ok(None) => {
                    let elapsed = started.elapsed();
                    debug!(rv = %last_rv, events, elapsed_ms = elapsed.as_millis() as u64, "watch closed");
                    return WatchEnd::Closed { events, elapsed };
                }
                Ok(Some(Err(error))) => return WatchEnd::Failed { error, events },
                Ok(Some(Ok(event))) => event,
            };
            events += 1;
            if initial.is_some()
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
                return WatchEnd::Failed { error, events };
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
                    if initial_events_end && let Some(phase) = initial.take() {
                        self.store.finish_list(&resource_version);
                        info!(
                            rv = %resource_version,
                            objects = phase.listed,
                            elapsed_ms = phase.started.elapsed().as_millis() as u64,
                            "streamed list"
                        );
                    }
                    if !resource_version.is_empty() && initial.is_none() {
                        *last_rv = resource_version;
                        if *resuming {
                            self.caught_up(resuming, last_rv, CatchUp::Bookmark);
                        } else {
                            self.store.bookmark(last_rv);
                        }
                        self.synced.set(last_rv);
                    }
                    continue;
                }
                WatchEvent::Error(status) => {
                    let error = Error::from_status(
                        status,
                        Verb::Watch,
                        &self.resource,
                        self.namespace.as_deref(),
                    );
                    return WatchEnd::Failed { error, events };
                }
                // Its final state is unknown: a relist delivers the deletion as a tombstone
                // of the last good state.
                WatchEvent::Undecodable {
                    change: Change::Deleted,
                    object,
                } => {
                    let error = self.undecodable(Verb::Watch, &object);
                    return WatchEnd::Failed { error, events };
                }
                // The last good state stays; every other object goes on being followed.
                WatchEvent::Undecodable { object, .. } => {
                    self.report(&self.undecodable(Verb::Watch, &object));
                    match initial.as_mut() {
                        Some(phase) => {
                            phase.listed += 1;
                            self.store.list_undecodable(object.key);
                        }
                        None => {
                            if let Some(rv) = object.resource_version.filter(|rv| !rv.is_empty()) {
                                *last_rv = rv;
                                self.synced.set(last_rv);
                            }
                        }
                    }
                    continue;
                }
            };
            let rv = obj.meta().resource_version.clone();
            // One from outside the shard (a server that does not apply it) is not ours: on a
            // field that cannot change it never was, so there is nothing to store or delete,
            // but its version still counts. On one that can (a controller owner), an
            // update may have moved it out: it leaves the cache, as a delete.
            let inside = self.in_shard(&obj);
            let moved_out = !inside
                && initial.is_none()
                && self.current_shard().is_some_and(|s| s.field().mutable());
            if moved_out {
                if let Ok((key, obj, _)) = self.prepare(obj, None) {
                    self.store.delete(key, obj);
                }
            } else if inside {
                let (key, obj, raw) = match self.prepare(obj, raw) {
                    Ok(prepared) => prepared,
                    Err(_) => {
                        let error = Error::MalformedEvent {
                            resource: self.resource.clone(),
                            detail: "object without metadata.name".to_owned(),
                        };
                        return WatchEnd::Failed { error, events };
                    }
                };
                match (initial.as_mut(), deleted) {
                    // Only `ADDED`s come before the end bookmark (checked above).
                    (Some(phase), _) => {
                        phase.listed += 1;
                        self.store.list_object(key, obj, raw);
                    }
                    (None, true) => self.store.delete(key, obj),
                    (None, false) => self.store.upsert(key, obj, raw),
                }
            }
            // During a streaming list the objects' versions are not in order; only the
            // end bookmark says which version the whole state has.
            if let Some(rv) = rv.filter(|rv| !rv.is_empty())
                && initial.is_none()
            {
                *last_rv = rv;
                self.synced.set(last_rv);
            }
        }
    }

    /// A resumed watch has seen every change up to `resource_version`: the snapshot and
    /// what it missed are the server's state.
    fn caught_up(&self, resuming: &mut bool, resource_version: &str, by: CatchUp) {
        *resuming = false;
        // Said before the store is synced, so that whoever waits for it reads how.
        self.stats.caught_up(by);
        self.store.caught_up(resource_version);
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
