//! The basic work queue: fair, deduplicating, and never handing one item to two workers.
//!
//! [`Queue`] is client-go's `workqueue.Typed` for tokio. Producers (usually informer event
//! handlers) [`add`](Queue::add) keys; workers loop on [`get`](Queue::get), process the key
//! and call [`done`](Queue::done). Between those two calls the key is *processing*:
//!
//! * a key waiting in the queue is there once, however often it is added (it is *dirty*);
//! * a key added while it is processing is not handed to a second worker, it is queued
//!   again when the first worker calls `done`, so that the latest change is never missed;
//! * otherwise keys come out in the order they went in.
//!
//! Because a key stands for "the object with this name changed, look at it", collapsing
//! duplicates loses nothing and bounds the queue by the number of objects, not of events.

use std::fmt;
use std::hash::Hash;
use std::ops::Deref;
use std::pin::pin;
use std::sync::{Arc, Weak};

use parking_lot::{Mutex, MutexGuard};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::config::QueueConfig;
use super::lanes::Priority;
use super::metrics::{InFlightProbe, InFlightSnapshot, InFlightSource, QueueMetrics};
use super::slots::Phase;
use super::state::{Added, Hasher, IfEmpty, ItemHash, Next, State};

/// A work queue shared by producers and workers: client-go's `workqueue.Interface`.
///
/// Producers [`add`](Self::add) keys; workers loop on [`get`](Self::get), process the key
/// and call [`done`](Self::done). Between those two calls the key is *processing*:
///
/// * a key waiting in the queue is there once, however often it is added;
/// * a key is never handed to two workers at once: one added while it is processing is
///   queued again when the first worker calls `done`, so its latest change is not missed;
/// * otherwise keys come out in the order they went in.
///
/// Cloning is cheap and every clone is the same queue.
///
/// # Example
///
/// A worker loop, and a shutdown that lets in-flight work finish:
///
/// ```
/// use kube_informer::workqueue::Queue;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let queue: Queue<String> = Queue::new();
///
/// let worker = tokio::spawn({
///     let queue = queue.clone();
///     async move {
///         let mut handled = Vec::new();
///         while let Some(key) = queue.get().await {
///             handled.push(key.clone()); // reconcile the object named `key` here
///             queue.done(&key);
///         }
///         handled
///     }
/// });
///
/// queue.add("default/web".to_string());
/// queue.add("default/db".to_string());
/// queue.add("default/web".to_string()); // still waiting: collapses into the first add
///
/// queue.shutdown_with_drain().await;
/// assert_eq!(worker.await.unwrap(), ["default/web", "default/db"]);
/// # }
/// ```
pub struct Queue<T> {
    inner: Arc<Inner<T>>,
}

struct Inner<T> {
    /// parking_lot's mutex rather than std's: when a producer and a worker contend for it,
    /// it soon backs off (a few spins, then yields) instead of spinning on the lock's cache
    /// line, which the holder then has to win back; each side then gets several operations
    /// in a row. That alone doubled throughput in the add/get/done benchmark.
    state: Mutex<State<T>>,
    /// Hashes items before the lock is taken, so the critical sections stay short.
    hasher: Hasher,
    /// Wakes workers blocked in `get`: one per newly queued item, all of them on shutdown.
    item_queued: Notify,
    /// Wakes `shutdown_with_drain` when the last in-flight item is done.
    drained: Notify,
    name: String,
    metrics: Option<Box<dyn QueueMetrics>>,
}

impl<T> Queue<T>
where
    T: Clone + Eq + Hash + Send + Sync + 'static,
{
    /// An unnamed queue without metrics.
    pub fn new() -> Self {
        Self::with_config(QueueConfig::default())
    }

    /// A queue named and instrumented as `config` says.
    pub fn with_config(config: QueueConfig) -> Self {
        let QueueConfig { name, metrics } = config;
        let inner = Arc::new_cyclic(|weak: &Weak<Inner<T>>| {
            let metrics = match metrics {
                Some(provider) if !name.is_empty() => {
                    let weak: Weak<dyn InFlightSource> = weak.clone();
                    Some(provider.queue_metrics(&name, InFlightProbe::new(weak)))
                }
                _ => None,
            };
            Inner {
                state: Mutex::new(State::new()),
                hasher: Hasher::default(),
                item_queued: Notify::new(),
                drained: Notify::new(),
                name,
                metrics,
            }
        });
        Self { inner }
    }

    /// The name given in the [`QueueConfig`], empty if none.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Marks `item` as needing processing.
    ///
    /// It is queued unless it is already waiting (then this is a no-op) or processing (then
    /// it is queued again when that processing is [`done`](Self::done)). Ignored once the
    /// queue is shutting down.
    pub fn add(&self, item: T) {
        self.add_with_priority(item, Priority::Normal);
    }

    /// [`add`](Self::add) at `priority`: a [`Priority::Low`] item waits behind normal ones
    /// (for at most [`LOW_PRIORITY_MAX_WAIT`](super::lanes::LOW_PRIORITY_MAX_WAIT)); an
    /// item already waiting at low priority that is added at normal priority moves up.
    ///
    /// ```
    /// use kube_informer::workqueue::{Priority, Queue};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let queue = Queue::new();
    /// for key in ["replayed-1", "replayed-2"] {
    ///     queue.add_with_priority(key, Priority::Low);
    /// }
    /// queue.add("edited");
    /// assert_eq!(queue.get().await, Some("edited"));
    /// assert_eq!(queue.get().await, Some("replayed-1"));
    /// # }
    /// ```
    pub fn add_with_priority(&self, item: T, priority: Priority) {
        let hash = ItemHash::of(&item, &self.inner.hasher);
        let now = self.now();
        let (added, unused, wake) = {
            let mut state = self.inner.lock();
            let (added, unused) = state.add(item, hash, now, priority);
            let wake = added == Added::Queued && state.wake_sleeper();
            (added, unused, wake)
        };
        drop(unused);
        if wake {
            self.inner.item_queued.notify_one();
        }
        if matches!(added, Added::Queued | Added::Dirty)
            && let Some(metrics) = &self.inner.metrics
        {
            metrics.added();
        }
    }

    /// Waits for the next item and marks it as processing.
    ///
    /// The caller owns the item until it calls [`done`](Self::done) with it; until then no
    /// other worker receives it. Returns `None` once the queue is shut down and no item is
    /// left waiting, which is a worker's cue to exit.
    ///
    /// Cancel safe: an item is only taken in the poll that returns it.
    pub async fn get(&self) -> Option<T> {
        loop {
            // Registering with `Notify` costs a lock, so try without it first.
            match self.try_next(IfEmpty::Return) {
                Next::Item(item) => return Some(item),
                Next::ShutDown => return None,
                Next::Empty => {}
            }
            // Register before looking again, so an item queued between the look and the
            // wait still wakes this worker; the look counts it among the sleepers, which
            // `add` and `done` notify.
            let mut queued = pin!(self.inner.item_queued.notified());
            queued.as_mut().enable();
            match self.try_next(IfEmpty::Sleep) {
                Next::Item(item) => return Some(item),
                Next::ShutDown => return None,
                Next::Empty => queued.await,
            }
        }
    }

    /// Like [`get`](Self::get), but the item comes in a guard that calls
    /// [`done`](Self::done) when dropped, so an early return or a panic cannot leave the
    /// item processing forever.
    ///
    /// ```
    /// # use kube_informer::workqueue::Queue;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let queue = Queue::new();
    /// queue.add(7_u32);
    /// let item = queue.get_guarded().await.unwrap();
    /// assert_eq!(*item, 7);
    /// queue.add(7); // added while processing...
    /// drop(item); // ...so it is queued again when the guard marks it done
    /// assert_eq!(queue.len(), 1);
    /// # }
    /// ```
    pub async fn get_guarded(&self) -> Option<DoneGuard<T>> {
        let item = self.get().await?;
        Some(DoneGuard {
            queue: self.clone(),
            item,
        })
    }

    /// Marks `item`, obtained from [`get`](Self::get), as processed.
    ///
    /// If it was added again meanwhile it is queued again now. Calling it for an item that
    /// is not processing does nothing.
    pub fn done(&self, item: &T) {
        let hash = ItemHash::of(item, &self.inner.hasher);
        let now = self.now();
        let (finished, wake, drained) = {
            let mut state = self.inner.lock();
            let Some(finished) = state.done(item, hash) else {
                return;
            };
            let wake = finished.requeued && state.wake_sleeper();
            (finished, wake, state.draining && state.processing == 0)
        };
        drop(finished.released);
        if wake {
            self.inner.item_queued.notify_one();
        }
        if drained {
            self.inner.drained.notify_waiters();
        }
        if let (Some(metrics), Some(started), Some(now)) =
            (&self.inner.metrics, finished.started, now)
        {
            metrics.finished(now.saturating_duration_since(started));
        }
    }

    /// The items waiting for a worker or being processed, copied.
    pub(crate) fn items(&self) -> Vec<T> {
        let state = self.inner.lock();
        state.items.iter().map(|entry| entry.item.clone()).collect()
    }

    /// The number of items waiting for a worker (not counting those processing).
    pub fn len(&self) -> usize {
        let state = self.inner.lock();
        state.lanes.len()
    }

    /// Whether no item is waiting for a worker.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stops accepting items. Workers still receive the items already waiting; once none is
    /// left, every [`get`](Self::get), including those blocked now, returns `None`.
    pub fn shutdown(&self) {
        {
            let mut state = self.inner.lock();
            state.shutting_down = true;
            // All of them are woken below, and none waits again.
            state.sleepers = 0;
        }
        self.inner.item_queued.notify_waiters();
    }

    /// Like [`shutdown`](Self::shutdown), then waits until every item being processed is
    /// [`done`](Self::done).
    ///
    /// As in client-go, this waits for items in flight, not for items still waiting: those
    /// are handed out by later `get` calls (and so become in flight) or dropped with the
    /// queue. It never returns if a worker never calls `done`.
    pub async fn shutdown_with_drain(&self) {
        self.shutdown();
        loop {
            let mut drained = pin!(self.inner.drained.notified());
            drained.as_mut().enable();
            {
                let mut state = self.inner.lock();
                if state.processing == 0 {
                    return;
                }
                state.draining = true;
            }
            drained.await;
        }
    }

    /// Whether [`shutdown`](Self::shutdown) has been called.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.lock().shutting_down
    }

    /// Counts a delayed add; the delaying queue reports it here so that all of a queue's
    /// metrics go through one handle.
    pub(super) fn record_retry(&self) {
        if let Some(metrics) = &self.inner.metrics {
            metrics.retried();
        }
    }

    /// How many handles share this queue, to check that background tasks let go of it.
    #[cfg(test)]
    pub(super) fn handle_count(&self) -> usize {
        Arc::strong_count(&self.inner)
    }

    /// Takes the next item if one is waiting; `if_empty` as in [`State::next`].
    fn try_next(&self, if_empty: IfEmpty) -> Next<T> {
        let now = self.now();
        let next = self.inner.lock().next(now, if_empty);
        match next {
            Next::Item((item, added)) => {
                if let (Some(metrics), Some(added), Some(now)) = (&self.inner.metrics, added, now) {
                    metrics.started(now.saturating_duration_since(added));
                }
                Next::Item(item)
            }
            Next::Empty => Next::Empty,
            Next::ShutDown => Next::ShutDown,
        }
    }

    /// The time, only when someone will read it: reading the clock is the only cost
    /// metrics would add to an uninstrumented queue.
    fn now(&self) -> Option<Instant> {
        self.inner.metrics.as_ref().map(|_| Instant::now())
    }
}

impl<T> Inner<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // parking_lot's lock does not poison: the state is consistent between statements,
        // and a panic elsewhere (in a user's `Eq`, say) must not take every worker down.
        self.state.lock()
    }
}

impl<T: Send + Sync> InFlightSource for Inner<T> {
    fn in_flight(&self) -> InFlightSnapshot {
        let now = Instant::now();
        let state = self.lock();
        let mut snapshot = InFlightSnapshot::default();
        for entry in &state.items {
            let started = state.slots.started(entry.slot);
            let (Phase::Processing | Phase::ProcessingDirty, Some(started)) =
                (state.slots.phase(entry.slot), started)
            else {
                continue;
            };
            let running = now.saturating_duration_since(started);
            snapshot.unfinished_work += running;
            snapshot.longest_running = snapshot.longest_running.max(running);
        }
        snapshot
    }
}

impl<T> Clone for Queue<T> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<T> Default for Queue<T>
where
    T: Clone + Eq + Hash + Send + Sync + 'static,
{
    fn default() -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for Queue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.inner.lock();
        f.debug_struct("Queue")
            .field("name", &self.inner.name)
            .field("waiting", &state.lanes.len())
            .field("processing", &state.processing)
            .field("shutting_down", &state.shutting_down)
            .finish()
    }
}

/// An item being processed; marks it [`done`](Queue::done) when dropped.
///
/// Returned by [`Queue::get_guarded`]. Dereferences to the item.
pub struct DoneGuard<T>
where
    T: Clone + Eq + Hash + Send + Sync + 'static,
{
    queue: Queue<T>,
    item: T,
}

impl<T> DoneGuard<T>
where
    T: Clone + Eq + Hash + Send + Sync + 'static,
{
    /// The item being processed.
    pub fn item(&self) -> &T {
        &self.item
    }
}

impl<T> Deref for DoneGuard<T>
where
    T: Clone + Eq + Hash + Send + Sync + 'static,
{
    type Target = T;

    fn deref(&self) -> &T {
        &self.item
    }
}

impl<T> Drop for DoneGuard<T>
where
    T: Clone + Eq + Hash + Send + Sync + 'static,
{
    fn drop(&mut self) {
        self.queue.done(&self.item);
    }
}

impl<T> fmt::Debug for DoneGuard<T>
where
    T: Clone + Eq + Hash + Send + Sync + fmt::Debug + 'static,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("DoneGuard").field(&self.item).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use tokio::sync::oneshot;

    use super::*;
    use crate::workqueue::lanes::LOW_PRIORITY_MAX_WAIT;

    /// Takes an item that must already be waiting, without blocking.
    fn take<T: Clone + Eq + Hash + Send + Sync + 'static>(queue: &Queue<T>) -> Option<T> {
        match queue.try_next(IfEmpty::Return) {
            Next::Item(item) => Some(item),
            Next::Empty | Next::ShutDown => None,
        }
    }

    #[tokio::test]
    async fn hands_out_items_in_fifo_order() {
        let queue = Queue::new();
        for i in 0..5 {
            queue.add(i);
        }
        assert_eq!(queue.len(), 5);
        for i in 0..5 {
            assert_eq!(queue.get().await, Some(i));
        }
        assert!(queue.is_empty());
    }

    #[tokio::test]
    async fn collapses_duplicates_while_waiting() {
        let queue = Queue::new();
        queue.add("a");
        queue.add("b");
        queue.add("a");
        queue.add("a");
        assert_eq!(queue.len(), 2);
        assert_eq!(queue.get().await, Some("a"));
        assert_eq!(queue.get().await, Some("b"));
        assert_eq!(take(&queue), None);
    }

    #[tokio::test]
    async fn item_added_while_processing_comes_back_once_after_done() {
        let queue = Queue::new();
        queue.add("a");
        let item = queue.get().await.unwrap();
        queue.add("a");
        queue.add("a");
        // Not handed to a second worker while the first holds it.
        assert_eq!(queue.len(), 0);
        assert_eq!(take(&queue), None);
        queue.done(&item);
        assert_eq!(queue.len(), 1);
        assert_eq!(queue.get().await, Some("a"));
        queue.done(&"a");
        assert_eq!(take(&queue), None);
        assert!(queue.inner.lock().items.is_empty());
    }

    #[tokio::test]
    async fn done_without_readd_forgets_the_item() {
        let queue = Queue::new();
        queue.add(1);
        let item = queue.get().await.unwrap();
        queue.done(&item);
        assert_eq!(queue.len(), 0);
        // Adding again after done queues it afresh.
        queue.add(1);
        assert_eq!(queue.len(), 1);
    }

    #[tokio::test]
    async fn slots_of_done_items_are_reused() {
        let queue = Queue::new();
        for round in 0..100 {
            for i in 0..10 {
                queue.add(round * 10 + i);
            }
            for _ in 0..10 {
                let item = queue.get().await.unwrap();
                queue.done(&item);
            }
        }
        let state = queue.inner.lock();
        assert_eq!(state.slots.counts(), (10, 10));
        assert!(state.items.is_empty());
    }

    #[tokio::test]
    async fn table_room_stays_bounded_under_churn() {
        // 100 items live at any time, 100,000 over the queue's life: the table must grow
        // with the items it holds at once, not with those it ever held.
        let queue = Queue::new();
        for i in 0..100_u32 {
            queue.add(i);
        }
        for i in 100..100_000 {
            let item = take(&queue).unwrap();
            queue.done(&item);
            queue.add(i);
        }
        let state = queue.inner.lock();
        assert_eq!(state.items.len(), 100);
        assert!(state.items.capacity() < 500, "{}", state.items.capacity());
        assert_eq!(state.slots.counts().0, 100);
    }

    #[tokio::test]
    async fn a_drained_burst_gives_back_its_room() {
        let queue = Queue::new();
        for i in 0..1_000_u32 {
            queue.add(i);
        }
        assert!(queue.inner.lock().items.capacity() >= 1_000);
        for _ in 0..999 {
            let item = take(&queue).unwrap();
            queue.done(&item);
        }
        assert!(
            queue.inner.lock().items.capacity() >= 1_000,
            "a queue holding an item keeps its room"
        );
        let last = take(&queue).unwrap();
        queue.done(&last);
        let state = queue.inner.lock();
        assert!(state.items.capacity() <= 64, "{}", state.items.capacity());
        assert_eq!(state.slots.counts(), (0, 0));
        drop(state);
        queue.add(7);
        assert_eq!(take(&queue), Some(7), "the queue works on after shrinking");
    }

    #[tokio::test]
    async fn done_for_an_item_not_processing_is_ignored() {
        let queue = Queue::new();
        queue.done(&1);
        queue.add(1);
        queue.done(&1);
        assert_eq!(queue.len(), 1);
        assert_eq!(queue.get().await, Some(1));
        assert_eq!(queue.inner.lock().processing, 1);
    }

    #[tokio::test]
    async fn get_waits_for_an_add() {
        let queue = Queue::new();
        let worker = tokio::spawn({
            let queue = queue.clone();
            async move { queue.get().await }
        });
        tokio::task::yield_now().await;
        assert!(!worker.is_finished());
        queue.add(9);
        assert_eq!(worker.await.unwrap(), Some(9));
    }

    #[tokio::test]
    async fn shutdown_wakes_every_waiting_worker_with_none() {
        let queue: Queue<u32> = Queue::new();
        let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel(8);
        let workers: Vec<_> = (0..8)
            .map(|_| {
                let queue = queue.clone();
                let ready_tx = ready_tx.clone();
                tokio::spawn(async move {
                    let mut get = pin!(queue.get());
                    // Announce only once `get` is actually blocked.
                    assert!(futures::poll!(get.as_mut()).is_pending());
                    ready_tx.send(()).await.unwrap();
                    get.await
                })
            })
            .collect();
        for _ in 0..8 {
            ready_rx.recv().await.unwrap();
        }
        queue.shutdown();
        for worker in workers {
            assert_eq!(worker.await.unwrap(), None);
        }
        assert!(queue.is_shutting_down());
    }

    #[tokio::test]
    async fn shutdown_hands_out_waiting_items_then_none_and_ignores_adds() {
        let queue = Queue::new();
        queue.add(1);
        queue.add(2);
        queue.shutdown();
        queue.add(3);
        assert_eq!(queue.get().await, Some(1));
        assert_eq!(queue.get().await, Some(2));
        assert_eq!(queue.get().await, None);
    }

    #[tokio::test]
    async fn shutdown_with_drain_returns_only_after_in_flight_items_are_done() {
        let queue = Queue::new();
        queue.add("a");
        queue.add("b");
        let a = queue.get().await.unwrap();
        let b = queue.get().await.unwrap();
        let finished = Arc::new(AtomicBool::new(false));
        let (started_tx, started_rx) = oneshot::channel();
        let drain = tokio::spawn({
            let queue = queue.clone();
            let finished = finished.clone();
            async move {
                let mut drain = pin!(queue.shutdown_with_drain());
                assert!(futures::poll!(drain.as_mut()).is_pending());
                started_tx.send(()).unwrap();
                drain.await;
                // Both items must be done by the time the drain returns.
                assert!(finished.load(Ordering::SeqCst));
            }
        });
        started_rx.await.unwrap();
        assert!(queue.is_shutting_down());
        queue.done(&a);
        tokio::task::yield_now().await;
        assert!(!drain.is_finished());
        finished.store(true, Ordering::SeqCst);
        queue.done(&b);
        drain.await.unwrap();
    }

    #[tokio::test]
    async fn shutdown_with_drain_returns_at_once_when_idle() {
        let queue: Queue<u8> = Queue::new();
        queue.shutdown_with_drain().await;
        assert!(queue.is_shutting_down());
    }

    #[tokio::test]
    async fn guard_marks_the_item_done_on_drop() {
        let queue = Queue::new();
        queue.add(5);
        let guard = queue.get_guarded().await.unwrap();
        assert_eq!(*guard.item(), 5);
        assert_eq!(queue.inner.lock().processing, 1);
        drop(guard);
        assert_eq!(queue.inner.lock().processing, 0);
        assert!(queue.inner.lock().items.is_empty());
    }

    #[tokio::test]
    async fn cancelled_get_does_not_lose_a_wakeup() {
        let queue = Queue::new();
        let mut first = Box::pin(queue.get());
        assert!(futures::poll!(first.as_mut()).is_pending());
        let second = tokio::spawn({
            let queue = queue.clone();
            async move { queue.get().await }
        });
        tokio::task::yield_now().await;
        // The notification may go to `first`; dropping it must pass it on to `second`.
        queue.add(1);
        drop(first);
        assert_eq!(second.await.unwrap(), Some(1));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn sleeping_workers_are_woken_for_every_burst() {
        // Workers go to sleep between bursts, so every burst must wake them: a lost wakeup
        // leaves items waiting and the round never ends.
        use std::sync::atomic::AtomicUsize;
        let queue: Queue<u64> = Queue::new();
        let processed = Arc::new(AtomicUsize::new(0));
        let progress = Arc::new(Notify::new());
        let workers: Vec<_> = (0..8)
            .map(|_| {
                let (queue, processed, progress) =
                    (queue.clone(), processed.clone(), progress.clone());
                tokio::spawn(async move {
                    while let Some(item) = queue.get().await {
                        queue.done(&item);
                        processed.fetch_add(1, Ordering::SeqCst);
                        progress.notify_one();
                    }
                })
            })
            .collect();
        let mut expected = 0;
        for round in 0..2_000_u64 {
            let burst = 1 + round % 7;
            for i in 0..burst {
                queue.add(round * 10 + i);
            }
            expected += burst as usize;
            tokio::time::timeout(Duration::from_secs(10), async {
                while processed.load(Ordering::SeqCst) < expected {
                    progress.notified().await;
                }
            })
            .await
            .unwrap_or_else(|_| panic!("round {round}: items left unprocessed"));
        }
        queue.shutdown();
        for worker in workers {
            worker.await.unwrap();
        }
        assert_eq!(queue.inner.lock().sleepers, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn in_flight_snapshot_sums_and_maxes_processing_time() {
        struct Nothing;
        impl QueueMetrics for Nothing {
            fn added(&self) {}
            fn started(&self, _: Duration) {}
            fn finished(&self, _: Duration) {}
            fn retried(&self) {}
        }
        struct Keep(std::sync::Mutex<Option<InFlightProbe>>);
        impl super::super::MetricsProvider for Arc<Keep> {
            fn queue_metrics(&self, _: &str, probe: InFlightProbe) -> Box<dyn QueueMetrics> {
                *self.0.lock().unwrap() = Some(probe);
                Box::new(Nothing)
            }
        }
        let keep = Arc::new(Keep(std::sync::Mutex::new(None)));
        let queue = Queue::with_config(QueueConfig::named("q").metrics(keep.clone()));
        let probe = keep.0.lock().unwrap().take().unwrap();

        queue.add(1);
        queue.add(2);
        queue.get().await.unwrap();
        tokio::time::advance(Duration::from_secs(3)).await;
        queue.get().await.unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        let snapshot = probe.snapshot().unwrap();
        assert_eq!(snapshot.unfinished_work, Duration::from_secs(5));
        assert_eq!(snapshot.longest_running, Duration::from_secs(4));

        drop(queue);
        assert!(probe.is_closed());
        assert_eq!(probe.snapshot(), None);
    }

    async fn drain(queue: &Queue<&'static str>, n: usize) -> Vec<&'static str> {
        let mut taken = Vec::new();
        for _ in 0..n {
            let item = queue.get().await.unwrap();
            queue.done(&item);
            taken.push(item);
        }
        taken
    }

    #[tokio::test(start_paused = true)]
    async fn low_priority_items_wait_behind_normal_ones_in_order() {
        let queue = Queue::new();
        queue.add_with_priority("low-1", Priority::Low);
        queue.add("normal-1");
        queue.add_with_priority("low-2", Priority::Low);
        queue.add("normal-2");
        assert_eq!(queue.len(), 4);
        assert_eq!(
            drain(&queue, 4).await,
            ["normal-1", "normal-2", "low-1", "low-2"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_low_item_added_at_normal_priority_moves_up_once() {
        let queue = Queue::new();
        for item in ["a", "b", "c"] {
            queue.add_with_priority(item, Priority::Low);
        }
        queue.add("z");
        queue.add("c");
        queue.add_with_priority("c", Priority::Low);
        assert_eq!(queue.len(), 4, "c waits once");
        assert_eq!(drain(&queue, 4).await, ["z", "c", "a", "b"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_low_item_that_waited_long_enough_goes_first() {
        let queue = Queue::new();
        queue.add_with_priority("old-low", Priority::Low);
        tokio::time::advance(LOW_PRIORITY_MAX_WAIT).await;
        queue.add("fresh");
        assert_eq!(
            drain(&queue, 2).await,
            ["old-low", "fresh"],
            "never starved"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_item_added_while_processing_requeues_at_its_highest_priority() {
        let queue = Queue::new();
        queue.add("x");
        queue.add("y");
        let x = queue.get().await.unwrap();
        queue.add_with_priority("x", Priority::Low);
        queue.done(&x);
        queue.add("w");
        assert_eq!(
            drain(&queue, 3).await,
            ["y", "w", "x"],
            "x went back at low priority"
        );

        queue.add("x");
        let x = queue.get().await.unwrap();
        queue.add_with_priority("x", Priority::Low);
        queue.add("x");
        queue.done(&x);
        queue.add("v");
        assert_eq!(
            drain(&queue, 2).await,
            ["x", "v"],
            "raised while processing"
        );
    }
}
