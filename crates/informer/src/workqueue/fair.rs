//! [`FairShare`]: a number of concurrent turns that tenants (a fleet's clusters) take in
//! fairness, so that one tenant's backlog never delays another's single item by more than
//! one turn.

use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
};

use parking_lot::Mutex;
use tokio::sync::oneshot;

/// A budget of concurrent turns (a fleet's reconcile workers) shared by tenants. A tenant
/// takes a [`Turn`] before each piece of work and gives it back by dropping it. A free turn
/// goes to whoever asks while no one waits; once turns run out, each turn given back goes
/// to the waiting tenant served least recently. So a tenant with 10,000 items queued and
/// every turn in hand delays another tenant's single item by at most one turn's length:
/// the first turn given back is the newcomer's.
///
/// A tenant may also be held to [`max_per_tenant`](Self::max_per_tenant) turns at once,
/// so that one whose work hangs (a cluster stalled mid-reconcile) never holds every turn.
///
/// ```
/// use kube_informer::workqueue::FairShare;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let share = FairShare::new(1);
/// let (busy, quiet) = (share.tenant("busy"), share.tenant("quiet"));
/// let held = busy.turn().await;
/// let busy_next = tokio::spawn({ let busy = busy.clone(); async move { busy.turn().await; "busy" } });
/// let quiet_next = tokio::spawn(async move { quiet.turn().await; "quiet" });
/// # while share.stats().waiting < 2 { tokio::task::yield_now().await; }
/// drop(held);
/// // "quiet" was never served: the turn given back is its.
/// assert_eq!(quiet_next.await.unwrap(), "quiet");
/// # busy_next.await.unwrap();
/// # }
/// ```
#[derive(Clone)]
pub struct FairShare {
    state: Arc<Mutex<State>>,
}

struct State {
    turns: usize,
    free: usize,
    max_per_tenant: usize,
    /// Counts turns given, so that "served least recently" is a comparison.
    given: u64,
    tenants: HashMap<Arc<str>, Waiting>,
}

#[derive(Default)]
struct Waiting {
    /// The count of turns given when this tenant was last served.
    last_served: u64,
    /// Turns it holds now.
    held: usize,
    queue: VecDeque<oneshot::Sender<Turn>>,
}

/// How a [`FairShare`] stands now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FairShareStats {
    /// The turns it has in all.
    pub turns: usize,
    /// Turns held now.
    pub held: usize,
    /// Requests waiting for a turn, over every tenant.
    pub waiting: usize,
    /// Tenants with a request waiting.
    pub waiting_tenants: usize,
    /// The most turns one tenant holds at once.
    pub max_per_tenant: usize,
}

impl FairShare {
    /// A share of `turns` concurrent turns (at least one).
    pub fn new(turns: usize) -> Self {
        let turns = turns.max(1);
        Self {
            state: Arc::new(Mutex::new(State {
                turns,
                free: turns,
                max_per_tenant: turns,
                given: 0,
                tenants: HashMap::new(),
            })),
        }
    }

    /// Holds each tenant to `max` turns at once (at least one; by default, every turn).
    #[must_use]
    pub fn max_per_tenant(self, max: usize) -> Self {
        self.state.lock().max_per_tenant = max.max(1);
        self
    }

    /// A tenant of this share named `name`; handles with one name are one tenant.
    pub fn tenant(&self, name: impl Into<Arc<str>>) -> Tenant {
        Tenant {
            share: self.clone(),
            name: name.into(),
        }
    }

    /// How it stands now.
    pub fn stats(&self) -> FairShareStats {
        let state = self.state.lock();
        let waiting = |w: &Waiting| w.queue.iter().filter(|tx| !tx.is_closed()).count();
        FairShareStats {
            turns: state.turns,
            held: state.turns - state.free,
            waiting: state.tenants.values().map(waiting).sum(),
            waiting_tenants: state.tenants.values().filter(|w| waiting(w) > 0).count(),
            max_per_tenant: state.max_per_tenant,
        }
    }

    /// `tenant`'s turn given back: to the waiting tenant served least recently that may
    /// take one more, or kept free.
    fn give_back(&self, tenant: &Arc<str>) {
        let mut state = self.state.lock();
        if let Some(waiting) = state.tenants.get_mut(tenant) {
            waiting.held -= 1;
        }
        let max = state.max_per_tenant;
        loop {
            let next = state
                .tenants
                .iter()
                .filter(|(_, w)| !w.queue.is_empty() && w.held < max)
                .min_by(|(a_name, a), (b_name, b)| {
                    (a.last_served, a_name).cmp(&(b.last_served, b_name))
                })
                .map(|(name, _)| name.clone());
            let Some(name) = next else {
                state.free += 1;
                prune(&mut state);
                return;
            };
            state.given += 1;
            let given = state.given;
            let waiting = state.tenants.get_mut(&name).expect("chosen from the map");
            let tx = waiting.queue.pop_front().expect("chosen for its waiters");
            if tx.is_closed() {
                continue;
            }
            waiting.last_served = given;
            waiting.held += 1;
            if let Err(mut turn) = tx.send(Turn {
                share: Some((self.clone(), name)),
            }) {
                // The request was dropped meanwhile: this turn is not given; the next is.
                let (_, name) = turn.share.take().expect("just made");
                if let Some(waiting) = state.tenants.get_mut(&name) {
                    waiting.held -= 1;
                }
                continue;
            }
            return;
        }
    }
}

/// Forgets tenants nobody waits for that were served before every waiting tenant: one
/// that comes back would be served first, as it would have been anyway.
fn prune(state: &mut State) {
    let oldest_waiting = state
        .tenants
        .values()
        .filter(|w| !w.queue.is_empty())
        .map(|w| w.last_served)
        .min()
        .unwrap_or(u64::MAX);
    state
        .tenants
        .retain(|_, w| !w.queue.is_empty() || w.held > 0 || w.last_served >= oldest_waiting);
}

impl std::fmt::Debug for FairShare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FairShare")
            .field("stats", &self.stats())
            .finish()
    }
}

/// One tenant's handle on a [`FairShare`].
#[derive(Clone, Debug)]
pub struct Tenant {
    share: FairShare,
    name: Arc<str>,
}

impl Tenant {
    /// The tenant's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits for a turn; it is given back when the [`Turn`] is dropped. Dropping this
    /// future before it completes gives up the place in line.
    pub async fn turn(&self) -> Turn {
        let rx = {
            let mut state = self.share.state.lock();
            let max = state.max_per_tenant;
            // A free turn means nobody who may take one waits: a turn given back goes to
            // such a waiter first.
            let held = state.tenants.get(&self.name).map_or(0, |w| w.held);
            if state.free > 0 && held < max {
                state.free -= 1;
                state.given += 1;
                let given = state.given;
                let waiting = state.tenants.entry(self.name.clone()).or_default();
                waiting.last_served = given;
                waiting.held += 1;
                return Turn {
                    share: Some((self.share.clone(), self.name.clone())),
                };
            }
            let (tx, rx) = oneshot::channel();
            state
                .tenants
                .entry(self.name.clone())
                .or_default()
                .queue
                .push_back(tx);
            rx
        };
        match rx.await {
            Ok(turn) => turn,
            // Never: a waiting sender is only dropped after its turn was sent, or with the
            // share, which this handle holds.
            Err(_) => Box::pin(self.turn()).await,
        }
    }
}

/// A turn of a [`FairShare`], given back when dropped.
#[must_use = "the turn is given back when dropped"]
pub struct Turn {
    /// The share and the tenant it is given back for; `None` once it was.
    share: Option<(FairShare, Arc<str>)>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some((share, tenant)) = self.share.take() {
            share.give_back(&tenant);
        }
    }
}

impl std::fmt::Debug for Turn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Turn").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits until `share` has `waiting` requests in line.
    async fn until_waiting(share: &FairShare, waiting: usize) {
        while share.stats().waiting < waiting {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_flooded_tenant_delays_another_by_one_turn() {
        let share = FairShare::new(2);
        let (flood, single) = (share.tenant("flood"), share.tenant("single"));
        let mut held = vec![flood.turn().await, flood.turn().await];
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut flooded = Vec::new();
        for i in 0..100 {
            let (flood, order) = (flood.clone(), order.clone());
            flooded.push(tokio::spawn(async move {
                let turn = flood.turn().await;
                order.lock().push(format!("flood-{i}"));
                turn
            }));
        }
        until_waiting(&share, 100).await;
        let single_turn = tokio::spawn({
            let order = order.clone();
            async move {
                let turn = single.turn().await;
                order.lock().push("single".to_owned());
                turn
            }
        });
        until_waiting(&share, 101).await;
        assert_eq!(share.stats().waiting_tenants, 2);
        // One of the flood's turns ends: the single item's tenant is served next.
        drop(held.pop());
        let turn = single_turn.await.unwrap();
        assert_eq!(order.lock().as_slice(), ["single"]);
        drop(turn);
        drop(held);
        for task in flooded {
            drop(task.await.unwrap());
        }
        assert_eq!(order.lock().len(), 101);
        assert_eq!(share.stats().held, 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn waiting_tenants_take_turns_in_rotation() {
        let share = FairShare::new(1);
        let held = share.tenant("x").turn().await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for tenant in ["a", "b", "c"] {
            for i in 0..3 {
                let (tenant, order) = (share.tenant(tenant), order.clone());
                tasks.push(tokio::spawn(async move {
                    let _turn = tenant.turn().await;
                    order.lock().push(format!("{}{i}", tenant.name()));
                    tokio::task::yield_now().await;
                }));
            }
        }
        until_waiting(&share, 9).await;
        drop(held);
        for task in tasks {
            task.await.unwrap();
        }
        let order = order.lock().clone();
        let tenants: String = order.iter().map(|o| &o[..1]).collect();
        assert_eq!(tenants, "abcabcabc", "{order:?}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_tenant_at_its_limit_waits_while_another_takes_the_free_turn() {
        let share = FairShare::new(3).max_per_tenant(2);
        let (hung, other) = (share.tenant("hung"), share.tenant("other"));
        let held = [hung.turn().await, hung.turn().await];
        let third = tokio::spawn({
            let hung = hung.clone();
            async move { hung.turn().await }
        });
        until_waiting(&share, 1).await;
        assert_eq!(share.stats().held, 2, "the hung tenant is held to two");
        // The free turn is the other tenant's at once.
        let turn = other.turn().await;
        assert_eq!(share.stats().held, 3);
        drop(turn);
        assert_eq!(share.stats().held, 2, "the hung tenant still waits");
        drop(held);
        drop(third.await.unwrap());
        assert_eq!(share.stats().held, 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_request_dropped_in_line_gives_its_turn_on() {
        let share = FairShare::new(1);
        let held = share.tenant("a").turn().await;
        let dropped = tokio::spawn({
            let b = share.tenant("b");
            async move {
                let _ = b.turn().await;
            }
        });
        let waiting = tokio::spawn({
            let c = share.tenant("c");
            async move { c.turn().await }
        });
        until_waiting(&share, 2).await;
        dropped.abort();
        let _ = dropped.await;
        drop(held);
        let turn = waiting.await.unwrap();
        assert_eq!(share.stats().held, 1);
        drop(turn);
        assert_eq!(share.stats().held, 0);
        assert_eq!(share.stats().waiting, 0);
    }
}
