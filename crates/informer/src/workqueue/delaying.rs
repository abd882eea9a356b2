//! A work queue that can also add items after a delay.
//!
//! [`DelayingQueue`] is client-go's `workqueue.TypedDelayingInterface`: a [`Queue`] plus
//! [`add_after`](DelayingQueue::add_after). Delayed items wait in a timer heap; one tokio task
//! sleeps until the earliest is due and moves every due item into the queue, where the usual
//! rules apply (a due item already waiting collapses into it). Time is tokio's, so the queue
//! follows paused time in tests.

use std::cmp::Ordering;
use std::collections::hash_map::Entry;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::hash::Hash;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{
    config::QueueConfig,
    lanes::Priority,
    queue::{DoneGuard, Queue},
};

/// A [`Queue`] with [`add_after`](Self::add_after): client-go's delaying queue.
///
/// Cloning is cheap and every clone is the same queue. The timer task stops on
/// [`shutdown`](Self::shutdown) or when the last clone is dropped.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use kube_informer::workqueue::DelayingQueue;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let queue = DelayingQueue::new();
/// queue.add_after("later", Duration::from_secs(2));
/// queue.add_after("sooner", Duration::from_secs(1));
/// queue.add("now");
///
/// assert_eq!(queue.get().await, Some("now"));
/// assert_eq!(queue.get().await, Some("sooner"));
/// assert_eq!(queue.get().await, Some("later"));
/// # }
/// ```
pub struct DelayingQueue<T> {
    queue: Queue<T>,
    delays: Arc<Delays<T>>,
}

struct Delays<T> {
    state: Mutex<Schedule<T>>,
    /// Wakes the timer task when its deadline may have moved earlier, or on shutdown. Not
    /// inside `Delays` itself: the task must wait on it without keeping `Delays` alive.
    timer_wake: Arc<Notify>,
    timer: OnceLock<JoinHandle<()>>,
}

/// The items waiting for their time, as a heap with lazy deletion: moving an item earlier
/// pushes a new entry, and the older entry is skipped when it surfaces because its sequence
/// number no longer matches the one recorded in `ready_at`.
struct Schedule<T> {
    heap: BinaryHeap<Timer<T>>,
    ready_at: HashMap<T, (Instant, u64), foldhash::fast::RandomState>,
    next_seq: u64,
}

struct Timer<T> {
    ready_at: Instant,
    seq: u64,
    item: T,
}

impl<T> DelayingQueue<T>
where
    T: Clone + Eq + Hash + Send + Sync + 'static,
{
    /// An unnamed delaying queue without metrics.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, which must run the timer task.
    pub fn new() -> Self {
        Self::with_config(QueueConfig::default())
    }

    /// A delaying queue named and instrumented as `config` says.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, which must run the timer task.
    pub fn with_config(config: QueueConfig) -> Self {
        let queue = Queue::with_config(config);
        let timer_wake = Arc::new(Notify::new());
        let delays = Arc::new(Delays {
            state: Mutex::new(Schedule {
                heap: BinaryHeap::new(),
                ready_at: HashMap::default(),
                next_seq: 0,
            }),
            timer_wake: Arc::clone(&timer_wake),
            timer: OnceLock::new(),
        });
        let timer = tokio::spawn(run_timer(
            queue.clone(),
            Arc::downgrade(&delays),
            timer_wake,
        ));
        // Set exactly once, right here, before any clone of `delays` exists.
        let _ = delays.timer.set(timer);
        Self { queue, delays }
    }

    /// Adds `item` once `delay` has passed; a zero delay adds it now.
    ///
    /// If `item` is already waiting for its time, it keeps the earlier of the two ready
    /// times: a later `add_after` never postpones an item. Ignored once the queue is
    /// shutting down.
    pub fn add_after(&self, item: T, delay: Duration) {
        if self.queue.is_shutting_down() {
            return;
        }
        self.queue.record_retry();
        if delay.is_zero() {
            self.queue.add(item);
            return;
        }
        let now = Instant::now();
        // A delay too large to represent means "never", which a far deadline serves as well.
        let ready_at = now.checked_add(delay).unwrap_or_else(|| far_future(now));
        let earliest = self.delays.lock().schedule(item, ready_at);
        if earliest {
            self.delays.timer_wake.notify_one();
        }
    }

    /// See [`Queue::name`].
    pub fn name(&self) -> &str {
        self.queue.name()
    }

    /// See [`Queue::add`].
    pub fn add(&self, item: T) {
        self.queue.add(item);
    }

    /// See [`Queue::add_with_priority`].
    pub fn add_with_priority(&self, item: T, priority: Priority) {
        self.queue.add_with_priority(item, priority);
    }

    /// See [`Queue::get`].
    pub async fn get(&self) -> Option<T> {
        self.queue.get().await
    }

    /// See [`Queue::get_guarded`].
    pub async fn get_guarded(&self) -> Option<DoneGuard<T>> {
        self.queue.get_guarded().await
    }

    /// See [`Queue::done`].
    pub fn done(&self, item: &T) {
        self.queue.done(item);
    }

    /// The items ready or being processed, copied; items whose delay has not passed are
    /// not among them.
    pub(crate) fn items(&self) -> Vec<T> {
        self.queue.items()
    }

    /// The number of items ready and waiting for a worker; items whose delay has not passed
    /// are not counted.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether no item is ready and waiting for a worker.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Like [`Queue::shutdown`]; items still waiting for their time are dropped and the
    /// timer task stops.
    pub fn shutdown(&self) {
        self.queue.shutdown();
        {
            let mut state = self.delays.lock();
            state.heap.clear();
            state.ready_at.clear();
        }
        self.delays.timer_wake.notify_one();
    }

    /// Like [`Queue::shutdown_with_drain`]; items still waiting for their time are dropped
    /// and the timer task stops.
    pub async fn shutdown_with_drain(&self) {
        self.shutdown();
        self.queue.shutdown_with_drain().await;
    }

    /// See [`Queue::is_shutting_down`].
    pub fn is_shutting_down(&self) -> bool {
        self.queue.is_shutting_down()
    }
}

impl<T> Delays<T> {
    fn lock(&self) -> MutexGuard<'_, Schedule<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T> Drop for Delays<T> {
    fn drop(&mut self) {
        // The last handle is gone: nobody can add or shut down any more.
        if let Some(timer) = self.timer.get() {
            timer.abort();
        }
    }
}

impl<T: Clone + Eq + Hash> Schedule<T> {
    /// Records that `item` is due at `ready_at` unless it is already due earlier; returns
    /// whether it is now the earliest item, so the timer must re-arm.
    fn schedule(&mut self, item: T, ready_at: Instant) -> bool {
        let seq = self.next_seq;
        let item = match self.ready_at.entry(item) {
            Entry::Occupied(mut occupied) => {
                if occupied.get().0 <= ready_at {
                    return false;
                }
                occupied.insert((ready_at, seq));
                occupied.key().clone()
            }
            Entry::Vacant(vacant) => {
                let item = vacant.key().clone();
                vacant.insert((ready_at, seq));
                item
            }
        };
        self.next_seq += 1;
        self.heap.push(Timer {
            ready_at,
            seq,
            item,
        });
        self.heap.peek().is_some_and(|first| first.seq == seq)
    }

    /// Moves every item due at `now` into `due`; returns when the next one is due.
    fn take_due(&mut self, now: Instant, due: &mut Vec<T>) -> Option<Instant> {
        while let Some(first) = self.heap.peek() {
            if first.ready_at > now {
                return Some(first.ready_at);
            }
            let Some(Timer { seq, item, .. }) = self.heap.pop() else {
                break;
            };
            if let Entry::Occupied(current) = self.ready_at.entry(item)
                && current.get().1 == seq
            {
                due.push(current.remove_entry().0);
            }
        }
        None
    }
}

/// Sleeps until the earliest item is due and moves due items into the queue, until the
/// queue shuts down or every handle is dropped.
async fn run_timer<T>(queue: Queue<T>, delays: Weak<Delays<T>>, timer_wake: Arc<Notify>)
where
    T: Clone + Eq + Hash + Send + Sync + 'static,
{
    let mut due = Vec::new();
    loop {
        // Register before reading the schedule, so an earlier item scheduled meanwhile
        // interrupts the sleep below.
        let mut woken = pin!(timer_wake.notified());
        woken.as_mut().enable();
        if queue.is_shutting_down() {
            return;
        }
        let next = {
            let Some(delays) = delays.upgrade() else {
                return;
            };
            delays.lock().take_due(Instant::now(), &mut due)
        };
        // Added outside the schedule's lock, which `add_after` callers contend for.
        for item in due.drain(..) {
            queue.add(item);
        }
        match next {
            Some(deadline) => {
                tokio::select! {
                    () = tokio::time::sleep_until(deadline) => {}
                    () = woken => {}
                }
            }
            None => woken.await,
        }
    }
}

/// About 30 years from `now`, as tokio does for "no deadline".
fn far_future(now: Instant) -> Instant {
    now + Duration::from_secs(86_400 * 365 * 30)
}

impl<T> PartialEq for Timer<T> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl<T> Eq for Timer<T> {}

impl<T> PartialOrd for Timer<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<T> Ord for Timer<T> {
    /// Reversed, so that the max-heap yields the earliest deadline, first-scheduled first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.ready_at, other.seq).cmp(&(self.ready_at, self.seq))
    }
}

impl<T> Clone for DelayingQueue<T> {
    fn clone(&self) -> Self {
        Self {
            queue: self.queue.clone(),
            delays: Arc::clone(&self.delays),
        }
    }
}

impl<T> Default for DelayingQueue<T>
where
    T: Clone + Eq + Hash + Send + Sync + 'static,
{
    /// See [`DelayingQueue::new`].
    fn default() -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for DelayingQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DelayingQueue")
            .field("queue", &self.queue)
            .field("delayed", &self.delays.lock().ready_at.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[tokio::test(start_paused = true)]
    async fn items_become_ready_in_ready_time_order() {
        let queue = DelayingQueue::new();
        let start = Instant::now();
        queue.add_after("c", 30 * MS);
        queue.add_after("a", 10 * MS);
        queue.add_after("b", 20 * MS);
        assert_eq!(queue.len(), 0);
        for (item, at) in [("a", 10 * MS), ("b", 20 * MS), ("c", 30 * MS)] {
            assert_eq!(queue.get().await, Some(item));
            let elapsed = start.elapsed();
            // Tokio's timer rounds deadlines up to its 1 ms tick.
            assert!(
                elapsed >= at && elapsed <= at + MS,
                "{item} ready at {elapsed:?}"
            );
            queue.done(&item);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_ready_before_its_time() {
        let queue = DelayingQueue::new();
        queue.add_after(1, 50 * MS);
        tokio::time::sleep(49 * MS).await;
        assert_eq!(queue.len(), 0);
        tokio::time::sleep(2 * MS).await;
        assert_eq!(queue.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn earlier_readd_moves_the_item_earlier() {
        let queue = DelayingQueue::new();
        let start = Instant::now();
        queue.add_after("x", 100 * MS);
        queue.add_after("y", 50 * MS);
        queue.add_after("x", 10 * MS);
        assert_eq!(queue.get().await, Some("x"));
        assert!(start.elapsed() <= 11 * MS);
        assert_eq!(queue.get().await, Some("y"));
        queue.done(&"x");
        // The stale 100 ms entry of "x" must not add it a second time.
        tokio::time::sleep(200 * MS).await;
        assert_eq!(queue.len(), 0);
        assert!(queue.delays.lock().heap.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn later_readd_does_not_move_the_item_later() {
        let queue = DelayingQueue::new();
        let start = Instant::now();
        queue.add_after("x", 10 * MS);
        queue.add_after("x", 100 * MS);
        assert_eq!(queue.get().await, Some("x"));
        assert!(start.elapsed() <= 11 * MS);
        queue.done(&"x");
        tokio::time::sleep(200 * MS).await;
        assert_eq!(queue.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn zero_delay_adds_immediately() {
        let queue = DelayingQueue::new();
        queue.add_after(1, Duration::ZERO);
        assert_eq!(queue.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn huge_delay_does_not_overflow() {
        let queue = DelayingQueue::new();
        queue.add_after(1, Duration::MAX);
        queue.add_after(2, MS);
        assert_eq!(queue.get().await, Some(2));
        assert_eq!(queue.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn due_item_already_waiting_collapses() {
        let queue = DelayingQueue::new();
        queue.add(1);
        queue.add_after(1, MS);
        tokio::time::sleep(5 * MS).await;
        assert_eq!(queue.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_drops_delayed_items_and_stops_the_timer() {
        let queue = DelayingQueue::new();
        queue.add_after(1, 10 * MS);
        queue.add_after(2, 20 * MS);
        queue.shutdown();
        assert_eq!(queue.get().await, None);
        let timer = queue.delays.timer.get().unwrap();
        for _ in 0..100 {
            if timer.is_finished() {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(timer.is_finished());
        queue.add_after(3, MS);
        tokio::time::sleep(50 * MS).await;
        assert_eq!(queue.len(), 0);
        assert!(queue.delays.lock().ready_at.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_every_handle_stops_the_timer() {
        let queue = DelayingQueue::<u8>::new();
        let inner = queue.queue.clone();
        queue.add_after(1, 10 * MS);
        drop(queue);
        // The timer task holds a handle of the inner queue until it ends.
        for _ in 0..100 {
            if inner.handle_count() == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(inner.handle_count(), 1);
    }
}
