//! The run loop: each step (a list, a watch) runs guarded against panics, its outcome goes
//! to the state machine, and the answer (go on, back off, stop) is acted on here, so the
//! decisions stay pure (`state.rs`) and this file only performs them.

use std::{future::Future, panic::AssertUnwindSafe, time::Duration};

use futures::FutureExt;
use kube_core::Resource;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error, info, info_span, warn};

use super::{
    Reflector,
    backoff::{Backoff, BackoffConfig},
    config::ListMode,
    state::{Next, Phase, State, WatchEnd},
    store::ReflectorStore,
    watch::StreamingList,
};
use crate::{
    error::{Error, panic_message},
    list_watch::ListWatch,
};

/// The backoff between attempts to reach a server that could not be reached: the
/// configured one, capped at 1 s.
fn reconnect_backoff(config: &BackoffConfig) -> BackoffConfig {
    let cap = Duration::from_secs(1);
    config
        .clone()
        .initial(config.initial.min(cap / 4))
        .max(config.max.min(cap))
}

impl<K, L, S> Reflector<K, L, S>
where
    K: Resource + Send + Sync + 'static,
    L: ListWatch<K>,
    S: ReflectorStore<K>,
{
    /// Runs until `cancel` fires; never returns earlier.
    pub async fn run(self, cancel: CancellationToken) {
        let span = info_span!("reflector", resource = %self.resource, namespace = self.namespace.as_deref().unwrap_or(""));
        self.run_loop(cancel).instrument(span).await;
    }

    async fn run_loop(mut self, cancel: CancellationToken) {
        let mut backoff = Backoff::new(self.config.backoff.clone());
        let mut reconnect = Backoff::new(reconnect_backoff(&self.config.backoff));
        let list_mode = match self.config.shard {
            Some(_) => ListMode::Paged,
            None => self.config.list_mode,
        };
        let mut state = State::new(list_mode);
        if let Some(restore) = self.restore.take()
            && let Some(resource_version) = self.restore_snapshot(restore).await
        {
            state = State::resumed(list_mode, resource_version);
        }
        loop {
            if cancel.is_cancelled() {
                break;
            }
            // Each step runs code that is not the reflector's (transforms, index functions,
            // codecs, decoders): a panic there is caught, reported, and repaired by a
            // relist, never left as a cache that stopped following the server.
            let next = match (state.phase(), state.sync_mode()) {
                (Phase::Sync(from), ListMode::Streaming) => {
                    let start = state.streaming_start(from).to_owned();
                    debug!(rv = %start, "streaming list");
                    self.stats.count_list();
                    self.stats.count_streaming_list();
                    match self
                        .guarded(self.watch(&cancel, &start, StreamingList::Yes))
                        .await
                    {
                        Ok(report) => {
                            self.report_watch_end(&report.end);
                            state.watched(&report)
                        }
                        Err(()) => state.panicked(),
                    }
                }
                (Phase::Sync(from), ListMode::Paged) => {
                    self.stats.count_list();
                    if state.last_rv().is_empty()
                        && let Some(trigger) = &self.relist
                    {
                        // A first list is a consistent read of the shard as it is now: a
                        // relist asked for before it (a reshard before the start) is done.
                        let _ = trigger.notified().now_or_never();
                    }
                    let listed = tokio::select! {
                        biased;
                        () = cancel.cancelled() => break,
                        r = self.guarded(self.list_all(from, state.last_rv())) => r,
                    };
                    match listed {
                        Ok(Ok(rv)) => {
                            self.served();
                            state.listed(rv)
                        }
                        Ok(Err(error)) => {
                            self.report(&error);
                            if error.is_gone() {
                                debug!("list expired; listing again from resourceVersion \"\"");
                            }
                            state.list_failed(&error)
                        }
                        Err(()) => state.panicked(),
                    }
                }
                (Phase::Watch, _) => {
                    let start = state.last_rv().to_owned();
                    self.stats.count_watch();
                    let streaming = if state.resuming() {
                        StreamingList::Resuming
                    } else {
                        StreamingList::No
                    };
                    match self.guarded(self.watch(&cancel, &start, streaming)).await {
                        Ok(report) => {
                            self.report_watch_end(&report.end);
                            state.watched(&report)
                        }
                        Err(()) => state.panicked(),
                    }
                }
            };
            match next {
                Next::Go => {}
                Next::Backoff => {
                    if !self.sleep(&cancel, &mut backoff).await {
                        break;
                    }
                }
                Next::Reconnect => {
                    if !self.sleep(&cancel, &mut reconnect).await {
                        break;
                    }
                }
                Next::Stop => break,
            }
        }
        debug!("reflector stopped");
    }

    /// Runs one step; a panic in it is reported as [`Error::Panicked`] and returned as
    /// `Err(())`.
    async fn guarded<T>(&self, step: impl Future<Output = T>) -> Result<T, ()> {
        match AssertUnwindSafe(step).catch_unwind().await {
            Ok(done) => Ok(done),
            Err(panic) => {
                let message = panic_message(&*panic).to_owned();
                error!(%message, "panic while listing or watching; relisting after a backoff");
                self.report(&Error::Panicked {
                    resource: self.resource.clone(),
                    message,
                });
                Err(())
            }
        }
    }

    /// Logs and reports how a watch ended, when that is news.
    fn report_watch_end(&self, end: &WatchEnd) {
        if !matches!(end, WatchEnd::Refused { .. } | WatchEnd::Cancelled) {
            // The watch was opened: the resource is served.
            self.served();
        }
        match end {
            WatchEnd::Failed {
                error: error @ Error::StreamingListUnsupported { .. },
                ..
            } => {
                self.report(error);
                warn!("falling back to paged lists");
            }
            WatchEnd::Failed { error, .. } | WatchEnd::Refused { error } => {
                self.report(error);
            }
            WatchEnd::Closed { events: 0, elapsed } if *elapsed < Duration::from_secs(1) => {
                warn!("watch closed at once without events");
            }
            WatchEnd::RelistRequested => info!("relisting from a consistent read, as asked"),
            WatchEnd::Cancelled | WatchEnd::Closed { .. } | WatchEnd::Idle => {}
        }
    }

    pub(super) fn report(&self, error: &Error) {
        if error.is_resource_missing() {
            // Said once: until the resource is back, every retry gets the same answer.
            if self.stats.mark_missing() {
                warn!(
                    %error,
                    retry_at_most_every = ?self.config.backoff.max,
                    "the API server does not serve this resource (its CRD deleted or not \
                     installed?); the cache keeps its last state, and the informer resumes \
                     once the resource is served again"
                );
            } else {
                debug!(%error, "resource still not served");
            }
        } else {
            warn!(%error, "list/watch error");
        }
        self.stats.count_error();
        if let Some(hook) = &self.error_hook {
            hook(error);
        }
    }

    /// A list or watch was served: the resource is there (again).
    fn served(&self) {
        if self.stats.mark_served() {
            info!("the API server serves this resource again");
        }
    }

    /// Sleeps the next backoff delay; false if cancelled meanwhile.
    async fn sleep(&self, cancel: &CancellationToken, backoff: &mut Backoff) -> bool {
        let delay = backoff.next_delay();
        debug!(delay_ms = delay.as_millis() as u64, "backing off");
        tokio::select! {
            biased;
            () = cancel.cancelled() => false,
            () = tokio::time::sleep(delay) => true,
        }
    }
}
