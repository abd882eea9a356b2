//! Which occurrences are one Event: the recorder's cache of the Events it wrote, and what
//! each new occurrence asks of the API server (a new Event, or a higher series count).

use std::{collections::HashMap, time::Duration};

use k8s_openapi::{api::core::v1::ObjectReference, jiff::Timestamp};
use tokio::time::Instant;

use super::{Event, EventType};

/// The most series a recorder remembers; past it, those observed longest ago go first.
pub(super) const MAX_SERIES: usize = 4096;

/// An object, as the fields of its reference that say which object it is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct ObjectId {
    api_version: Option<String>,
    kind: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    uid: Option<String>,
}

impl From<&ObjectReference> for ObjectId {
    fn from(r: &ObjectReference) -> Self {
        Self {
            api_version: r.api_version.clone(),
            kind: r.kind.clone(),
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            uid: r.uid.clone(),
        }
    }
}

/// What makes two occurrences the same Event: the same objects, type, reason, action and
/// note.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct SeriesKey {
    pub(super) regarding: ObjectId,
    related: Option<ObjectId>,
    type_: EventType,
    reason: String,
    action: String,
    note: Option<String>,
}

impl SeriesKey {
    pub(super) fn new(event: &Event, regarding: &ObjectReference) -> Self {
        Self {
            regarding: regarding.into(),
            related: event.related.as_ref().map(ObjectId::from),
            type_: event.type_,
            reason: event.reason.clone(),
            action: event.action.clone(),
            note: event.note.clone(),
        }
    }
}

/// One Event the recorder writes or wrote, and the occurrences it stands for.
#[derive(Debug)]
pub(super) struct Series {
    /// The Event object's name and namespace.
    pub(super) name: String,
    pub(super) namespace: String,
    pub(super) event: Event,
    pub(super) regarding: ObjectReference,
    /// The first occurrence's time.
    pub(super) first: Timestamp,
    /// Occurrences seen, and how many of them the server's Event counts.
    pub(super) count: u32,
    pub(super) written: u32,
    /// Whether the Event object exists on the server.
    pub(super) created: bool,
    /// The last occurrence's time, on the wall and on the recorder's clock.
    pub(super) last: Timestamp,
    last_seen: Instant,
}

impl Series {
    /// Whether the server's Event is behind the occurrences seen.
    pub(super) fn is_behind(&self) -> bool {
        !self.created || self.written < self.count
    }
}

/// What one occurrence asks for.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Occurrence {
    /// A new Event; the spam filter decides whether it may be written.
    New,
    /// One more in an Event's series.
    Repeat,
}

/// The Events written within the series window, by what makes occurrences the same.
pub(super) struct SeriesCache {
    window: Duration,
    series: HashMap<SeriesKey, Series>,
    /// The keys whose Event the server fell behind on since they were last taken, so a
    /// batch visits those, not the whole cache.
    behind: Vec<SeriesKey>,
}

impl SeriesCache {
    pub(super) fn new(window: Duration) -> Self {
        Self {
            window,
            series: HashMap::new(),
            behind: Vec::new(),
        }
    }

    /// Whether an occurrence under `key` seen `now` continues a series.
    pub(super) fn classify(&self, key: &SeriesKey, now: Instant) -> Occurrence {
        match self.series.get(key) {
            Some(series) if now.saturating_duration_since(series.last_seen) < self.window => {
                Occurrence::Repeat
            }
            _ => Occurrence::New,
        }
    }

    /// Counts a repeat (see [`classify`](Self::classify)).
    pub(super) fn repeat(&mut self, key: &SeriesKey, now: Instant, wall: Timestamp) {
        if let Some(series) = self.series.get_mut(key) {
            if !series.is_behind() {
                self.behind.push(key.clone());
            }
            series.count += 1;
            series.last = wall;
            series.last_seen = now;
        }
    }

    /// Starts a series for a new Event named `name`, replacing an expired one.
    pub(super) fn start(
        &mut self,
        key: SeriesKey,
        event: Event,
        regarding: ObjectReference,
        name: String,
        now: Instant,
        wall: Timestamp,
    ) {
        if self.series.len() >= MAX_SERIES && !self.series.contains_key(&key) {
            self.forget_oldest(now);
        }
        let namespace = regarding
            .namespace
            .clone()
            .filter(|ns| !ns.is_empty())
            .unwrap_or_else(|| "default".to_owned());
        self.behind.push(key.clone());
        self.series.insert(
            key,
            Series {
                name,
                namespace,
                event,
                regarding,
                first: wall,
                count: 1,
                written: 0,
                created: false,
                last: wall,
                last_seen: now,
            },
        );
    }

    /// The series whose Event the server has not caught up with, taken: a key the
    /// writer does not bring up to date it gives back ([`still_behind`](Self::still_behind)).
    pub(super) fn take_behind(&mut self) -> Vec<SeriesKey> {
        std::mem::take(&mut self.behind)
    }

    /// Gives back a taken key whose Event is still to be written.
    pub(super) fn still_behind(&mut self, key: SeriesKey) {
        self.behind.push(key);
    }

    pub(super) fn get(&self, key: &SeriesKey) -> Option<&Series> {
        self.series.get(key)
    }

    pub(super) fn get_mut(&mut self, key: &SeriesKey) -> Option<&mut Series> {
        self.series.get_mut(key)
    }

    pub(super) fn remove(&mut self, key: &SeriesKey) -> Option<Series> {
        self.series.remove(key)
    }

    /// Forgets the series not seen within the window: their next occurrence is a new
    /// Event, as client-go's recorder does.
    pub(super) fn expire(&mut self, now: Instant) {
        let window = self.window;
        self.series
            .retain(|_, s| s.is_behind() || now.saturating_duration_since(s.last_seen) < window);
    }

    fn forget_oldest(&mut self, now: Instant) {
        self.expire(now);
        while self.series.len() >= MAX_SERIES {
            let Some(oldest) = self
                .series
                .iter()
                .min_by_key(|(_, s)| s.last_seen)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            self.series.remove(&oldest);
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.series.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some("ns".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn repeats_within_the_window_count_and_later_ones_start_anew() {
        let mut cache = SeriesCache::new(Duration::from_secs(360));
        let event = Event::warning("Failed", "Sync").note("boom");
        let key = SeriesKey::new(&event, &pod("a"));
        let now = Instant::now();
        assert_eq!(cache.classify(&key, now), Occurrence::New);
        cache.start(
            key.clone(),
            event.clone(),
            pod("a"),
            "a.1".into(),
            now,
            Timestamp::now(),
        );
        for _ in 0..9 {
            assert_eq!(cache.classify(&key, now), Occurrence::Repeat);
            cache.repeat(&key, now, Timestamp::now());
        }
        assert_eq!(cache.get(&key).unwrap().count, 10);

        let other_note = SeriesKey::new(&event.clone().note("other"), &pod("a"));
        assert_eq!(cache.classify(&other_note, now), Occurrence::New);
        let other_object = SeriesKey::new(&event, &pod("b"));
        assert_eq!(cache.classify(&other_object, now), Occurrence::New);

        let later = now + Duration::from_secs(361);
        assert_eq!(cache.classify(&key, later), Occurrence::New);
        // A series the server is behind on is kept until it is written.
        cache.expire(later);
        assert_eq!(cache.len(), 1);
        let series = cache.get_mut(&key).unwrap();
        series.created = true;
        series.written = series.count;
        cache.expire(later);
        assert_eq!(cache.len(), 0);
    }
}
