//! Work queues for controllers: client-go's `util/workqueue` on tokio.
//!
//! A controller does not act on watch events directly. Its event handlers put the *key* of
//! each changed object into a queue, and a few workers take keys out and reconcile the
//! object as it is in the cache now. The queue makes that safe and cheap:
//!
//! * [`Queue`] collapses repeated keys while they wait and never hands one key to two
//!   workers; a key that changes while it is processed is processed again afterwards;
//! * [`DelayingQueue`] adds [`add_after`](DelayingQueue::add_after), for work due later;
//! * [`RateLimitingQueue`] retries failed keys after a delay chosen by a [`RateLimiter`]:
//!   [`ItemExponentialFailure`], [`Bucket`], [`MaxOf`], [`ItemFastSlow`], or usually
//!   [`default_controller_rate_limiter`].
//!
//! [`FairShare`] is a budget of concurrent turns that several queues' workers (a fleet's
//! clusters) take in fairness.
//!
//! Each queue can report client-go's `workqueue_*` metrics through a [`MetricsProvider`]
//! given in its [`QueueConfig`]; with the `prometheus` feature (on by default),
//! `PrometheusMetrics` registers them in a `prometheus-client` registry.
//!
//! ```
//! use kube_informer::workqueue::{RateLimitingQueue, default_controller_rate_limiter};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let queue = RateLimitingQueue::new(default_controller_rate_limiter());
//! let workers: Vec<_> = (0..2)
//!     .map(|_| {
//!         let queue = queue.clone();
//!         tokio::spawn(async move {
//!             while let Some(key) = queue.get().await {
//!                 println!("reconciling {key}");
//!                 queue.forget(&key);
//!                 queue.done(&key);
//!             }
//!         })
//!     })
//!     .collect();
//!
//! queue.add("default/web".to_string());
//! queue.shutdown_with_drain().await;
//! for worker in workers {
//!     worker.await.unwrap();
//! }
//! # }
//! ```

mod config;
mod delaying;
mod fair;
mod lanes;
mod metrics;
#[cfg(feature = "prometheus")]
mod prometheus;
mod queue;
mod rate_limited;
mod rate_limiter;
mod slots;
mod state;

pub use config::QueueConfig;
pub use delaying::DelayingQueue;
pub use fair::{FairShare, FairShareStats, Tenant, Turn};
pub use lanes::{LOW_PRIORITY_MAX_WAIT, Priority};
pub use metrics::{InFlightProbe, InFlightSnapshot, MetricsProvider, QueueMetrics};
#[cfg(feature = "prometheus")]
#[cfg_attr(docsrs, doc(cfg(feature = "prometheus")))]
pub use prometheus::PrometheusMetrics;
pub use queue::{DoneGuard, Queue};
pub use rate_limited::RateLimitingQueue;
pub use rate_limiter::{
    RateLimiter, bucket::Bucket, default_controller_rate_limiter,
    item_exponential_failure::ItemExponentialFailure, item_fast_slow::ItemFastSlow, max_of::MaxOf,
};
