//! The recorder's writer: a task that takes published Events from the buffer, folds
//! repeats into series, filters spam, and writes to the API server one batch at a time.

use std::{num::NonZeroU32, sync::Arc, sync::atomic::Ordering, time::Duration};

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use k8s_openapi::{
    api::{
        core::v1::{Event as CoreEvent, EventSource, ObjectReference},
        events::v1::{Event as EventsV1, EventSeries},
    },
    apimachinery::pkg::apis::meta::v1::{MicroTime, Time},
    jiff::Timestamp,
};
use kube_client::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use kube_core::ObjectMeta;
use rand::Rng;
use serde_json::json;
use tokio::{sync::mpsc, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{
    Counters, Event, RecorderConfig, Reporter,
    series::{ObjectId, Occurrence, Series, SeriesCache, SeriesKey},
};

/// How often the writer forgets expired series and idle objects' spam-filter state.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// One write that brings the server's Event up to date, in either API's form.
enum Write {
    Create {
        namespace: String,
        events_v1: Box<EventsV1>,
        core_v1: Box<CoreEvent>,
    },
    Count {
        namespace: String,
        name: String,
        events_v1: serde_json::Value,
        core_v1: serde_json::Value,
    },
}

/// Which Event API the server serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EventsApi {
    EventsV1,
    /// `events.k8s.io/v1` answered that it is not served.
    CoreV1,
}

pub(super) struct Writer {
    client: Client,
    reporter: Reporter,
    counters: Arc<Counters>,
    series: SeriesCache,
    spam: DefaultKeyedRateLimiter<ObjectId>,
    api: EventsApi,
    /// Whether the current run of failed writes was logged.
    failing: bool,
}

impl Writer {
    pub(super) fn new(
        client: Client,
        reporter: Reporter,
        config: &RecorderConfig,
        counters: Arc<Counters>,
    ) -> Self {
        let burst = NonZeroU32::new(config.spam_burst).unwrap_or(NonZeroU32::MIN);
        let quota = Quota::with_period(config.spam_period)
            .unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN))
            .allow_burst(burst);
        Self {
            client,
            reporter,
            counters,
            series: SeriesCache::new(config.series_window),
            spam: RateLimiter::dashmap(quota),
            api: EventsApi::EventsV1,
            failing: false,
        }
    }

    /// Writes batches until `stop` fires, then writes what is buffered and returns.
    pub(super) async fn run(
        mut self,
        mut events: mpsc::Receiver<(Event, ObjectReference)>,
        stop: CancellationToken,
    ) {
        let mut next_sweep = Instant::now() + SWEEP_EVERY;
        loop {
            let first = tokio::select! {
                biased;
                () = stop.cancelled() => None,
                received = events.recv() => received,
            };
            let Some((event, regarding)) = first else {
                events.close();
                while let Ok((event, regarding)) = events.try_recv() {
                    self.take(event, regarding);
                }
                self.write_behind().await;
                debug!(controller = %self.reporter.controller, "event recorder stopped");
                return;
            };
            self.take(event, regarding);
            while let Ok((event, regarding)) = events.try_recv() {
                self.take(event, regarding);
            }
            self.write_behind().await;
            let now = Instant::now();
            if now >= next_sweep {
                self.series.expire(now);
                self.spam.retain_recent();
                next_sweep = now + SWEEP_EVERY;
            }
        }
    }

    /// Folds one occurrence into the series cache.
    fn take(&mut self, event: Event, regarding: ObjectReference) {
        let key = SeriesKey::new(&event, &regarding);
        let now = Instant::now();
        let wall = Timestamp::now();
        match self.series.classify(&key, now) {
            Occurrence::Repeat => self.series.repeat(&key, now, wall),
            Occurrence::New => {
                if self.spam.check_key(&key.regarding).is_err() {
                    self.counters.dropped_spam.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                let name = event_name(&regarding);
                self.series.start(key, event, regarding, name, now, wall);
            }
        }
    }

    /// Brings every Event the server is behind on up to date: one write each.
    async fn write_behind(&mut self) {
        for key in self.series.take_behind() {
            let Some(series) = self.series.get(&key).filter(|s| s.is_behind()) else {
                continue;
            };
            let created = series.created;
            let write = if created {
                Write::Count {
                    namespace: series.namespace.clone(),
                    name: series.name.clone(),
                    events_v1: json!({ "series": event_series(series) }),
                    core_v1: json!({
                        "count": series.count,
                        "lastTimestamp": Time(series.last),
                    }),
                }
            } else {
                Write::Create {
                    namespace: series.namespace.clone(),
                    events_v1: Box::new(self.events_v1(series)),
                    core_v1: Box::new(self.core_v1(series)),
                }
            };
            match self.send(write).await {
                Ok(()) => {
                    let counter = if created {
                        &self.counters.series_updates
                    } else {
                        &self.counters.created
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    if let Some(series) = self.series.get_mut(&key) {
                        series.created = true;
                        series.written = series.count;
                    }
                    self.recovered();
                }
                Err(error) if created && is_not_found(&error) => {
                    // The Event expired on the server (its TTL) while the series went on:
                    // the next batch creates it anew, with the whole count.
                    if let Some(series) = self.series.get_mut(&key) {
                        series.created = false;
                        series.name = event_name(&series.regarding);
                        self.series.still_behind(key);
                    }
                }
                Err(error) => {
                    if let Some(series) = self.series.remove(&key) {
                        let lost = series.count - series.written;
                        self.counters
                            .dropped_failed
                            .fetch_add(u64::from(lost), Ordering::Relaxed);
                    }
                    self.failed(&error);
                }
            }
        }
    }

    async fn send(&mut self, write: Write) -> Result<(), kube_client::Error> {
        match write {
            Write::Create {
                namespace,
                events_v1,
                core_v1,
            } => {
                if self.api == EventsApi::EventsV1 {
                    let api: Api<EventsV1> = Api::namespaced(self.client.clone(), &namespace);
                    match api.create(&PostParams::default(), &events_v1).await {
                        Err(error) if is_not_served(&error) => {
                            info!(controller = %self.reporter.controller, "events.k8s.io/v1 is not served; writing core/v1 Events");
                            self.api = EventsApi::CoreV1;
                        }
                        other => return other.map(drop),
                    }
                }
                let api: Api<CoreEvent> = Api::namespaced(self.client.clone(), &namespace);
                api.create(&PostParams::default(), &core_v1).await.map(drop)
            }
            Write::Count {
                namespace,
                name,
                events_v1,
                core_v1,
            } => {
                let params = PatchParams::default();
                match self.api {
                    EventsApi::EventsV1 => {
                        let api: Api<EventsV1> = Api::namespaced(self.client.clone(), &namespace);
                        api.patch(&name, &params, &Patch::Merge(events_v1))
                            .await
                            .map(drop)
                    }
                    EventsApi::CoreV1 => {
                        let api: Api<CoreEvent> = Api::namespaced(self.client.clone(), &namespace);
                        api.patch(&name, &params, &Patch::Merge(core_v1))
                            .await
                            .map(drop)
                    }
                }
            }
        }
    }

    fn events_v1(&self, series: &Series) -> EventsV1 {
        let event = &series.event;
        EventsV1 {
            metadata: metadata(series),
            event_time: Some(MicroTime(series.first)),
            series: (series.count > 1).then(|| event_series(series)),
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(self.reporter.instance.clone()),
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            note: event.note.clone(),
            type_: Some(event.type_.as_str().to_owned()),
            regarding: Some(series.regarding.clone()),
            related: event.related.clone(),
            ..EventsV1::default()
        }
    }

    fn core_v1(&self, series: &Series) -> CoreEvent {
        let event = &series.event;
        CoreEvent {
            metadata: metadata(series),
            involved_object: series.regarding.clone(),
            reason: Some(event.reason.clone()),
            message: event.note.clone(),
            type_: Some(event.type_.as_str().to_owned()),
            action: Some(event.action.clone()),
            related: event.related.clone(),
            reporting_component: Some(self.reporter.controller.clone()),
            reporting_instance: Some(self.reporter.instance.clone()),
            source: Some(EventSource {
                component: Some(self.reporter.controller.clone()),
                host: None,
            }),
            first_timestamp: Some(Time(series.first)),
            last_timestamp: Some(Time(series.last)),
            count: Some(i32::try_from(series.count).unwrap_or(i32::MAX)),
            ..CoreEvent::default()
        }
    }

    fn failed(&mut self, error: &kube_client::Error) {
        if !self.failing {
            self.failing = true;
            warn!(
                controller = %self.reporter.controller,
                %error,
                "cannot write events; dropping them (counted in the recorder's stats) until a write succeeds"
            );
        } else {
            debug!(controller = %self.reporter.controller, %error, "event dropped");
        }
    }

    fn recovered(&mut self) {
        if self.failing {
            self.failing = false;
            info!(controller = %self.reporter.controller, "events are written again");
        }
    }
}

fn metadata(series: &Series) -> ObjectMeta {
    ObjectMeta {
        name: Some(series.name.clone()),
        namespace: Some(series.namespace.clone()),
        ..ObjectMeta::default()
    }
}

fn event_series(series: &Series) -> EventSeries {
    EventSeries {
        count: i32::try_from(series.count).unwrap_or(i32::MAX),
        last_observed_time: MicroTime(series.last),
    }
}

/// An Event's name: its object's, and a random suffix, as client-go names them.
fn event_name(regarding: &ObjectReference) -> String {
    let object = regarding
        .name
        .as_deref()
        .filter(|n| !n.is_empty())
        .unwrap_or("object");
    let suffix: u64 = rand::rng().random();
    format!("{object}.{suffix:016x}")
}

fn is_not_found(error: &kube_client::Error) -> bool {
    matches!(error, kube_client::Error::Api(s) if s.code == 404)
}

/// The 404 of a resource the server does not serve, not of a missing namespace or object.
fn is_not_served(error: &kube_client::Error) -> bool {
    matches!(error, kube_client::Error::Api(s)
        if s.code == 404 && s.details.as_ref().is_none_or(|d| d.kind.is_empty() && d.name.is_empty()))
}
