//! The reflector's state: what it does next, and how each outcome moves it on.
//!
//! The run loop only performs steps (a list, a watch, a backoff sleep); every decision about
//! what comes next is made here, by pure transitions that tests can drive one by one.

use std::time::Duration;

use super::config::ListMode;
use crate::error::{Error, StreamingRefusal};

/// Which resourceVersion the next full list asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ListFrom {
    /// `"0"`: any state the server has cached (the first list).
    Any,
    /// The last seen resourceVersion, `NotOlderThan`: the cache never goes back in time.
    LastSeen,
    /// `""`: a consistent read (after a 410).
    Latest,
}

/// What the reflector does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    /// Fetch the full state (paged or streaming list, as the [mode](State::mode) says).
    Sync(ListFrom),
    /// Follow changes with a watch from the last synced resourceVersion.
    Watch,
}

/// How a streaming list's initial events ended, as the watch step reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum InitialEvents {
    /// The watch was an ordinary watch.
    NotRequested,
    /// The watch ended before the initial events did: the state is still unknown.
    Incomplete,
    /// The end bookmark arrived; the watch went on following changes.
    Complete,
}

/// How a watch ended.
#[derive(Debug)]
pub(super) enum WatchEnd {
    /// The reflector was cancelled.
    Cancelled,
    /// The server ended the watch normally (its timeout).
    Closed {
        /// Events received.
        events: usize,
        /// How long the watch lasted.
        elapsed: Duration,
    },
    /// Nothing arrived for the idle timeout; presumed dead.
    Idle,
    /// A relist from a consistent read was asked for.
    RelistRequested,
    /// The watch call itself failed: no stream was opened.
    Refused {
        /// Why.
        error: Error,
    },
    /// The watch failed.
    Failed {
        /// Why.
        error: Error,
        /// Events received before.
        events: usize,
    },
}

/// What a watch step did.
#[derive(Debug)]
pub(super) struct WatchReport {
    /// How the watch ended.
    pub(super) end: WatchEnd,
    /// The last resourceVersion seen (from an event or bookmark), or the one it started at.
    pub(super) last_rv: String,
    /// Whether a streaming list's initial events completed.
    pub(super) initial_events: InitialEvents,
    /// Whether a watch resumed from a snapshot reached its first bookmark.
    pub(super) caught_up: bool,
}

/// What to do after a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Next {
    /// The next step at once.
    Go,
    /// The next step after a backoff delay.
    Backoff,
    /// The server could not be reached: the next step after a short delay (at most 1 s).
    /// A request that never reached the server costs it nothing, and the first one after
    /// it is back should not wait out a long backoff.
    Reconnect,
    /// Cancelled: stop.
    Stop,
}

/// 503 answers in a row retried as soon as an unreachable server is (at most 1 s apart)
/// before the ordinary backoff takes over: about 10 s of them.
const UNAVAILABLE_QUICK_RETRIES: u32 = 12;

/// A watch that ends this quickly without an event is not a healthy watch that timed out.
const QUICK_CLOSE: Duration = Duration::from_secs(1);

/// The reflector's whole state between steps.
#[derive(Debug)]
pub(super) struct State {
    phase: Phase,
    mode: ListMode,
    /// The next full sync is paged whatever the mode (the server rejected a streaming one).
    page_next_sync: bool,
    /// The resourceVersion the store is synced to; empty before the first full sync.
    last_rv: String,
    /// 410s in a row with no event in between: a second one backs off.
    gone_in_a_row: u32,
    /// 503 Service Unavailable answers in a row with no progress in between.
    unavailable_in_a_row: u32,
    /// The store holds a snapshot not caught up with the server yet.
    resuming: bool,
}

impl State {
    /// Before the first list.
    pub(super) fn new(mode: ListMode) -> Self {
        Self {
            phase: Phase::Sync(ListFrom::Any),
            mode,
            page_next_sync: false,
            last_rv: String::new(),
            gone_in_a_row: 0,
            unavailable_in_a_row: 0,
            resuming: false,
        }
    }

    /// After a warm restart's snapshot at `resource_version` was restored: resume the watch
    /// from it.
    pub(super) fn resumed(mode: ListMode, resource_version: String) -> Self {
        Self {
            phase: Phase::Watch,
            last_rv: resource_version,
            resuming: true,
            ..Self::new(mode)
        }
    }

    /// Whether the next watch resumes from a snapshot, not caught up yet.
    pub(super) fn resuming(&self) -> bool {
        self.resuming
    }

    pub(super) fn phase(&self) -> Phase {
        self.phase
    }

    /// How full syncs are done now (a streaming list falls back to paged for good).
    #[cfg(test)]
    pub(super) fn mode(&self) -> ListMode {
        self.mode
    }

    /// How the next full sync is done: the mode, unless the server rejected a streaming
    /// list, which then gets a paged one.
    pub(super) fn sync_mode(&self) -> ListMode {
        if self.page_next_sync {
            ListMode::Paged
        } else {
            self.mode
        }
    }

    pub(super) fn last_rv(&self) -> &str {
        &self.last_rv
    }

    /// Where a streaming list starts: the last synced version (not older than), or `""`
    /// for a consistent read.
    pub(super) fn streaming_start(&self, from: ListFrom) -> &str {
        match from {
            ListFrom::Latest => "",
            ListFrom::Any | ListFrom::LastSeen => &self.last_rv,
        }
    }

    /// A paged list completed at `resource_version`.
    pub(super) fn listed(&mut self, resource_version: String) -> Next {
        self.unavailable_in_a_row = 0;
        self.last_rv = resource_version;
        self.phase = Phase::Watch;
        self.page_next_sync = false;
        Next::Go
    }

    /// A paged list failed with `error`.
    pub(super) fn list_failed(&mut self, error: &Error) -> Next {
        match self.phase {
            // An expired snapshot or continue token, or a version the server has not reached
            // yet: start over from a consistent read.
            Phase::Sync(from)
                if (error.is_gone() || error.is_resource_version_too_large())
                    && from != ListFrom::Latest =>
            {
                self.phase = Phase::Sync(ListFrom::Latest);
                Next::Go
            }
            _ if matches!(error, Error::Transport { .. }) => Next::Reconnect,
            _ if error.is_retry_soon() => self.unavailable(),
            _ => Next::Backoff,
        }
    }

    /// The server answered 503 Service Unavailable or 429 Too Many Requests: it is
    /// starting, its storage is (re)initializing, or it sheds load, and it will serve the
    /// same request once it can. Retried as soon as an
    /// unreachable server is, for a while: a server restart answers 503 for seconds, and
    /// the first request after it should not wait out a backoff grown by the failures
    /// before it (which left a cache 30 s behind a healthy server). A server that stays
    /// unavailable (an aggregated API whose backend is down) gets the ordinary backoff.
    fn unavailable(&mut self) -> Next {
        self.unavailable_in_a_row += 1;
        if self.unavailable_in_a_row <= UNAVAILABLE_QUICK_RETRIES {
            Next::Reconnect
        } else {
            Next::Backoff
        }
    }

    /// A watch (or streaming list) ended as `report` says.
    pub(super) fn watched(&mut self, report: &WatchReport) -> Next {
        self.last_rv.clone_from(&report.last_rv);
        // A resumed watch that ended before its first bookmark cannot say the snapshot
        // caught up (410: the server's history no longer reaches it; a server without a
        // watch cache sends no bookmark): list from scratch, replacing it atomically.
        if std::mem::take(&mut self.resuming)
            && !report.caught_up
            && !matches!(report.end, WatchEnd::Cancelled)
        {
            self.phase = Phase::Sync(ListFrom::Any);
            return Next::Go;
        }
        if report.initial_events == InitialEvents::Complete {
            self.phase = Phase::Watch;
        }
        // A streaming list that failed, for whatever reason, is followed by a paged one, as
        // client-go does: progress by the older way beats retrying the newer one.
        if report.initial_events == InitialEvents::Incomplete
            && matches!(
                report.end,
                WatchEnd::Refused { .. } | WatchEnd::Failed { .. }
            )
        {
            self.page_next_sync = true;
        }
        match &report.end {
            WatchEnd::Cancelled => Next::Stop,
            WatchEnd::Failed {
                error: Error::StreamingListUnsupported { refusal, .. },
                ..
            } => {
                match refusal {
                    StreamingRefusal::Rejected => self.page_next_sync = true,
                    StreamingRefusal::Ignored => self.mode = ListMode::Paged,
                }
                let from = match self.phase {
                    Phase::Sync(from) => from,
                    Phase::Watch => ListFrom::LastSeen,
                };
                self.phase = Phase::Sync(from);
                Next::Go
            }
            WatchEnd::Closed { events, elapsed } => {
                if *events > 0 {
                    self.gone_in_a_row = 0;
                    self.unavailable_in_a_row = 0;
                }
                if *events == 0 && *elapsed < QUICK_CLOSE {
                    Next::Backoff
                } else {
                    Next::Go
                }
            }
            WatchEnd::Idle => Next::Go,
            WatchEnd::RelistRequested => {
                self.phase = Phase::Sync(ListFrom::Latest);
                Next::Go
            }
            WatchEnd::Refused { error } if error.is_gone() => self.gone(),
            // A server that does not answer, or asks to try again soon, will most likely
            // serve the same watch later: retry it, as client-go does, without a relist.
            WatchEnd::Refused {
                error: Error::Transport { .. },
            } => Next::Reconnect,
            WatchEnd::Refused { error } if error.is_retry_soon() => self.unavailable(),
            // Any other refusal (403, 5xx, too large a version) may last: relist after the
            // backoff, as client-go's `ListAndWatch` loop does, so a cache whose watch never
            // works still follows the server at the pace of its lists.
            WatchEnd::Refused { error } => {
                self.relist_after(error);
                Next::Backoff
            }
            WatchEnd::Failed { error, events } => {
                if *events > 0 {
                    self.gone_in_a_row = 0;
                    self.unavailable_in_a_row = 0;
                }
                if error.is_gone() {
                    self.gone()
                } else if matches!(error, Error::Transport { .. }) {
                    // The connection broke (reset, closed by a ping timeout): resume.
                    Next::Reconnect
                } else {
                    if error.needs_relist() {
                        self.relist_after(error);
                    }
                    Next::Backoff
                }
            }
        }
    }

    /// Code run by a step panicked: whatever it left half-applied, a relist repairs.
    pub(super) fn panicked(&mut self) -> Next {
        self.phase = Phase::Sync(ListFrom::LastSeen);
        Next::Backoff
    }

    /// The watch's start version expired (410). Relist from the last synced version, which
    /// the server's watch cache answers cheaply, as client-go does; should that list expire
    /// too, [`list_failed`](Self::list_failed) falls back to a consistent read. A second
    /// 410 in a row, with no event in between, backs off first.
    fn gone(&mut self) -> Next {
        self.phase = Phase::Sync(ListFrom::LastSeen);
        self.gone_in_a_row += 1;
        if self.gone_in_a_row > 1 {
            Next::Backoff
        } else {
            Next::Go
        }
    }

    /// The next full sync after `error`: from a consistent read when the server has not
    /// caught up with the last synced version, else from that version.
    fn relist_after(&mut self, error: &Error) {
        let from = if error.is_resource_version_too_large() {
            ListFrom::Latest
        } else {
            ListFrom::LastSeen
        };
        self.phase = Phase::Sync(from);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        error::Verb,
        testing::{gone, status, transport_error},
    };

    fn report(end: WatchEnd, initial_events: InitialEvents) -> WatchReport {
        WatchReport {
            end,
            last_rv: "7".to_owned(),
            initial_events,
            caught_up: false,
        }
    }

    #[test]
    fn a_first_list_then_watches_resume_without_relisting() {
        let mut state = State::new(ListMode::Paged);
        assert_eq!(state.phase(), Phase::Sync(ListFrom::Any));
        assert_eq!(state.listed("5".to_owned()), Next::Go);
        assert_eq!((state.phase(), state.last_rv()), (Phase::Watch, "5"));
        let closed = WatchEnd::Closed {
            events: 3,
            elapsed: Duration::from_secs(300),
        };
        assert_eq!(
            state.watched(&report(closed, InitialEvents::NotRequested)),
            Next::Go
        );
        assert_eq!((state.phase(), state.last_rv()), (Phase::Watch, "7"));
    }

    #[test]
    fn gone_relists_from_the_last_version_and_backs_off_the_second_time_in_a_row() {
        let mut state = State::new(ListMode::Paged);
        state.listed("5".to_owned());
        let failed = || WatchEnd::Failed {
            error: gone("configmaps", Verb::Watch),
            events: 0,
        };
        assert_eq!(
            state.watched(&report(failed(), InitialEvents::NotRequested)),
            Next::Go
        );
        // From the watch cache, as client-go does; only an expired list reads from etcd.
        assert_eq!(state.phase(), Phase::Sync(ListFrom::LastSeen));
        let error = gone("configmaps", Verb::List);
        assert_eq!(state.list_failed(&error), Next::Go);
        assert_eq!(state.phase(), Phase::Sync(ListFrom::Latest));
        state.listed("9".to_owned());
        assert_eq!(
            state.watched(&report(failed(), InitialEvents::NotRequested)),
            Next::Backoff
        );
        // A 410 mid-list restarts from a consistent read once, then backs off.
        let mut state = State::new(ListMode::Paged);
        let error = gone("configmaps", Verb::List);
        assert_eq!(state.list_failed(&error), Next::Go);
        assert_eq!(state.phase(), Phase::Sync(ListFrom::Latest));
        assert_eq!(state.list_failed(&error), Next::Backoff);
    }

    #[test]
    fn a_refused_watch_relists_unless_the_server_is_unreachable_or_busy() {
        let refused = |error| WatchReport {
            end: WatchEnd::Refused { error },
            last_rv: "5".to_owned(),
            initial_events: InitialEvents::NotRequested,
            caught_up: false,
        };
        let forbidden = Error::from_status(
            status(403, "Forbidden", "no watch for you"),
            Verb::Watch,
            "configmaps",
            None,
        );
        let busy = Error::from_status(
            status(429, "TooManyRequests", "slow down"),
            Verb::Watch,
            "configmaps",
            None,
        );
        let too_large = Error::from_status(
            status(504, "Timeout", "Too large resource version: 9, current: 5"),
            Verb::Watch,
            "configmaps",
            None,
        );
        let cases = [
            (forbidden, Phase::Sync(ListFrom::LastSeen)),
            (transport_error("configmaps", Verb::Watch), Phase::Watch),
            (busy, Phase::Watch),
            (too_large, Phase::Sync(ListFrom::Latest)),
        ];
        for (error, phase) in cases {
            let mut state = State::new(ListMode::Paged);
            state.listed("5".to_owned());
            let what = error.to_string();
            // A 429 is the first of the quick retries a 503 gets.
            let expected = if matches!(error, Error::Transport { .. }) || error.is_retry_soon() {
                Next::Reconnect
            } else {
                Next::Backoff
            };
            assert_eq!(state.watched(&refused(error)), expected, "{what}");
            assert_eq!(state.phase(), phase, "{what}");
        }
    }

    #[test]
    fn a_server_answering_503_or_429_is_retried_quickly_for_a_while_then_backed_off() {
        let unavailable = || {
            Error::from_status(
                status(
                    503,
                    "ServiceUnavailable",
                    "the request has been made before all known HTTP paths have been installed",
                ),
                Verb::Watch,
                "widgets",
                None,
            )
        };
        let refused = || WatchReport {
            end: WatchEnd::Refused {
                error: unavailable(),
            },
            last_rv: "5".to_owned(),
            initial_events: InitialEvents::NotRequested,
            caught_up: false,
        };
        let mut state = State::new(ListMode::Paged);
        state.listed("5".to_owned());
        for _ in 0..UNAVAILABLE_QUICK_RETRIES {
            assert_eq!(state.watched(&refused()), Next::Reconnect);
            // The watch is retried from where it was, not replaced by a relist.
            assert_eq!(state.phase(), Phase::Watch);
        }
        assert_eq!(state.watched(&refused()), Next::Backoff);
        // Progress starts the count again.
        let healthy = WatchReport {
            end: WatchEnd::Closed {
                events: 3,
                elapsed: Duration::from_secs(60),
            },
            last_rv: "9".to_owned(),
            initial_events: InitialEvents::NotRequested,
            caught_up: false,
        };
        assert_eq!(state.watched(&healthy), Next::Go);
        assert_eq!(state.watched(&refused()), Next::Reconnect);
        // A list answered 503 too.
        let mut state = State::new(ListMode::Paged);
        assert_eq!(state.list_failed(&unavailable()), Next::Reconnect);
        // A restarted server answers 429 while its storage initializes: the same quick
        // retries, not a backoff grown by the failures before (a cache 28 s behind).
        let initializing = || {
            Error::from_status(
                status(429, "TooManyRequests", "storage is (re)initializing"),
                Verb::Watch,
                "widgets",
                None,
            )
        };
        let mut state = State::new(ListMode::Paged);
        state.listed("5".to_owned());
        let refused_429 = WatchReport {
            end: WatchEnd::Refused {
                error: initializing(),
            },
            ..refused()
        };
        assert_eq!(state.watched(&refused_429), Next::Reconnect);
        assert_eq!(state.phase(), Phase::Watch);
        assert_eq!(state.list_failed(&initializing()), Next::Reconnect);
    }

    #[test]
    fn a_list_refused_as_too_large_restarts_from_a_consistent_read() {
        let mut state = State::new(ListMode::Paged);
        let too_large = Error::from_status(
            status(504, "Timeout", "Too large resource version: 9, current: 5"),
            Verb::List,
            "configmaps",
            None,
        );
        assert_eq!(state.list_failed(&too_large), Next::Go);
        assert_eq!(state.phase(), Phase::Sync(ListFrom::Latest));
        assert_eq!(state.panicked(), Next::Backoff);
        assert_eq!(state.phase(), Phase::Sync(ListFrom::LastSeen));
    }

    #[test]
    fn a_streaming_list_falls_back_to_pages_for_good() {
        let mut state = State::new(ListMode::Streaming);
        let unsupported = WatchEnd::Failed {
            error: Error::StreamingListUnsupported {
                resource: "configmaps".to_owned(),
                refusal: StreamingRefusal::Ignored,
                detail: "an ordinary watch".to_owned(),
            },
            events: 0,
        };
        let next = state.watched(&report(unsupported, InitialEvents::Incomplete));
        assert_eq!(next, Next::Go);
        assert_eq!(state.mode(), ListMode::Paged);
        assert_eq!(state.phase(), Phase::Sync(ListFrom::Any));
    }

    #[test]
    fn a_completed_streaming_list_goes_on_as_a_watch() {
        let mut state = State::new(ListMode::Streaming);
        let idle = report(WatchEnd::Idle, InitialEvents::Complete);
        assert_eq!(state.watched(&idle), Next::Go);
        assert_eq!((state.phase(), state.last_rv()), (Phase::Watch, "7"));
        let mut state = State::new(ListMode::Streaming);
        let torn = report(WatchEnd::Idle, InitialEvents::Incomplete);
        state.watched(&torn);
        assert_eq!(state.phase(), Phase::Sync(ListFrom::Any));
        assert_eq!(state.streaming_start(ListFrom::Latest), "");
    }
}
