//! A reflector's configuration: values the user sets once, before it runs, with client-go's
//! defaults, kept apart from the loop that reads them.

use std::time::Duration;

use super::backoff::BackoffConfig;
use crate::list_watch::Shard;

/// How a [`Reflector`](super::Reflector) fetches the full state of its resource.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ListMode {
    /// A streaming list (the default, as in client-go since 1.35): a watch with
    /// `sendInitialEvents=true` whose events are applied as they arrive (see
    /// [`Reflector`](super::Reflector)). Needs Kubernetes 1.27+ with the `WatchList`
    /// feature (on by default since 1.32); a server that rejects it gets a paged list for
    /// that sync, one that ignores it gets paged lists from then on.
    #[default]
    Streaming,
    /// Paged `LIST` calls, each page streamed into the store.
    Paged,
}

/// Tuning of a [`Reflector`](super::Reflector): client-go's by default, each setting
/// changed by the method of its name. An informer takes the same settings from its
/// [`InformerBuilder`](crate::informer::InformerBuilder).
///
/// ```
/// use std::time::Duration;
/// use kube_informer::reflector::{BackoffConfig, ListMode, ReflectorConfig};
///
/// let config = ReflectorConfig::default()
///     .list_mode(ListMode::Paged)
///     .page_size(100)
///     .backoff(BackoffConfig::default().max(Duration::from_secs(5)));
/// # let _ = config;
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct ReflectorConfig {
    pub(crate) list_mode: ListMode,
    pub(crate) page_size: u32,
    pub(crate) min_watch_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) initial_events_timeout: Duration,
    pub(crate) backoff: BackoffConfig,
    pub(crate) shard: Option<Shard>,
}

impl ReflectorConfig {
    /// How the full state is fetched: [`ListMode::Streaming`] (the default) or
    /// [`ListMode::Paged`].
    #[must_use]
    pub fn list_mode(mut self, mode: ListMode) -> Self {
        self.list_mode = mode;
        self
    }

    /// Objects per list page (`limit`), 500; 0 asks for everything in one response.
    #[must_use]
    pub fn page_size(mut self, size: u32) -> Self {
        self.page_size = size;
        self
    }

    /// The lower bound of the random server-side watch timeout; the upper bound is twice
    /// this (5 min, so 5–10 min).
    #[must_use]
    pub fn min_watch_timeout(mut self, timeout: Duration) -> Self {
        self.min_watch_timeout = timeout;
        self
    }

    /// A watch that delivers nothing, not even a bookmark, for this long is reconnected
    /// (2 min). Servers send bookmarks about once a minute, so this is twice that: the
    /// backstop for a stalled connection on a client without pings (kube-client's
    /// default); [`client`](fn@crate::client) finds one by its HTTP/2 pings in seconds.
    #[must_use]
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// A streaming list whose initial events pause for this long before their end
    /// bookmark is taken for an ordinary watch from a server that ignored
    /// `sendInitialEvents` (30 s): a real one sends them back to back, then the bookmark.
    #[must_use]
    pub fn initial_events_timeout(mut self, timeout: Duration) -> Self {
        self.initial_events_timeout = timeout;
        self
    }

    /// Lists and watches only `shard`'s objects (no shard: all). A server with the
    /// `ShardedListAndWatch` gate selects them; from one without, the reflector keeps them
    /// itself (the same hash), so the cache holds the same objects either way;
    /// [`ReflectorStats::shard_mode`](super::stats::ReflectorStats::shard_mode) says which
    /// happened. A sharded reflector lists in pages whatever the
    /// [list mode](Self::list_mode): only a paged list's answer says whether the server
    /// applied the shard.
    #[must_use]
    pub fn shard(mut self, shard: Shard) -> Self {
        self.shard = Some(shard);
        self
    }

    /// The backoff between failed attempts.
    #[must_use]
    pub fn backoff(mut self, backoff: BackoffConfig) -> Self {
        self.backoff = backoff;
        self
    }
}

impl Default for ReflectorConfig {
    fn default() -> Self {
        Self {
            list_mode: ListMode::default(),
            page_size: 500,
            min_watch_timeout: Duration::from_secs(300),
            idle_timeout: Duration::from_secs(120),
            initial_events_timeout: Duration::from_secs(30),
            backoff: BackoffConfig::default(),
            shard: None,
        }
    }
}
