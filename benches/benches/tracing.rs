//! What the library's spans cost a controller's work per update, in one process and on one
//! thread, where the informer benchmark's figure moves by more between runs (the API
//! server shares the CPUs) than the 5 % it is held to.
//!
//! A [`Controller`] over a [`FakeListWatch`] of the informer benchmark's Pods: each
//! iteration updates each of 100 Pods once (a label), and ends once every update has been
//! reconciled, the reconcile reading the Pod back from the cache by key (the client-go
//! tutorials' `sync(key)`). What an update costs here is everything but the wire: the watch
//! event applied to the store, the handler queueing its key, the queue, the worker and the
//! reconcile, with the spans the `opentelemetry` feature adds to each.
//!
//! - `tracing/off`: no subscriber. Built without the feature, the spans do not exist; built
//!   with it, they are disabled.
//! - `tracing/otlp-unreachable` (with the feature): [`OtlpTracing`] exporting to a local
//!   port where nothing listens, its layer at `INFO`, after its first export has failed:
//!   tracing turned on while the collector is down.
//!
//! Run it without and with the feature and compare `tracing/off` of the two builds:
//! `cargo bench -p benches --bench tracing -- --save-baseline plain`, then
//! `cargo bench -p benches --bench tracing --features opentelemetry -- --baseline plain`.
//!
//! [`OtlpTracing`]: kube_informer::telemetry::OtlpTracing

use std::{
    convert::Infallible,
    sync::Arc,
    time::{Duration, Instant},
};

use criterion::{Criterion, criterion_main};
use k8s_openapi::api::core::v1::Pod;
use kube_informer::{
    CancellationToken, Controller, ObjectKey, RunningInformer, SharedInformer, retry_with_backoff,
    sync_by_key, testing::FakeListWatch,
};
use tokio::sync::watch;

/// Pods updated once each per iteration.
const PODS: usize = 100;

/// The informer benchmark's Pod `i` in namespace `bench`, its label `round` at `round`.
fn pod(i: usize, round: u64) -> Pod {
    let mut pod: Pod =
        serde_json::from_value(benches::nginx_pod(i)).expect("the benchmark's Pod decodes");
    pod.metadata.namespace = Some("bench".to_owned());
    pod.metadata.uid = Some(format!("uid-{i}"));
    pod.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("round".to_owned(), round.to_string());
    pod
}

/// A running controller over the fake, and the count of its reconciles.
struct Pipeline {
    fake: FakeListWatch<Pod>,
    reconciled: watch::Receiver<u64>,
    round: u64,
    cancel: CancellationToken,
    _informer: RunningInformer<Pod>,
}

impl Pipeline {
    /// Starts the informer and its controller on the current runtime, and waits until the
    /// initial Pods are reconciled.
    async fn start() -> Self {
        let fake = FakeListWatch::<Pod>::new("pods");
        for i in 0..PODS {
            fake.add(pod(i, 0));
        }
        let cancel = CancellationToken::new();
        let informer = SharedInformer::builder(fake.clone()).build();
        let store = informer.store();
        let (count, reconciled) = watch::channel(0_u64);
        let sync = move |key: ObjectKey, count: Arc<watch::Sender<u64>>| {
            let found = store.get_by_key(&key).is_some();
            async move {
                if found {
                    count.send_modify(|n| *n += 1);
                }
                Ok::<(), Infallible>(())
            }
        };
        let controller = Controller::new("tracing-bench", informer.handle());
        let running = informer.spawn(cancel.clone());
        tokio::spawn(controller.run(
            (sync_by_key(sync), retry_with_backoff(), Arc::new(count)),
            cancel.clone(),
        ));
        let mut pipeline = Self {
            fake,
            reconciled,
            round: 0,
            cancel,
            _informer: running,
        };
        pipeline.wait_for(PODS as u64).await;
        pipeline
    }

    async fn wait_for(&mut self, reconciles: u64) {
        self.reconciled
            .wait_for(|n| *n >= reconciles)
            .await
            .expect("the controller runs");
    }

    /// Updates every Pod once and waits until each update is reconciled.
    async fn round(&mut self) {
        self.round += 1;
        let before = *self.reconciled.borrow();
        for i in 0..PODS {
            self.fake.update(pod(i, self.round));
        }
        self.wait_for(before + PODS as u64).await;
        // The fake keeps every event for watches that resume; this one never does.
        self.fake.compact();
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Times rounds of `name`'s pipeline, on a current-thread runtime of its own.
fn measure(c: &mut Criterion, name: &str) {
    // A controller's process has threads besides this one (its runtime's workers; with
    // tracing on, the exporter's), and glibc's malloc takes its locks only once a process
    // has a second thread: without one here, the exporter's thread alone would make every
    // allocation of the pipeline dearer, which no real controller would see.
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let other_thread = std::thread::spawn(move || stopped.recv());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut pipeline = runtime.block_on(Pipeline::start());
    let mut group = c.benchmark_group("tracing");
    group
        .sample_size(40)
        .measurement_time(Duration::from_secs(10))
        .throughput(criterion::Throughput::Elements(PODS as u64));
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let started = Instant::now();
            runtime.block_on(async {
                for _ in 0..iters {
                    pipeline.round().await;
                }
            });
            started.elapsed()
        });
    });
    group.finish();
    drop(pipeline);
    drop(stop);
    let _ = other_thread.join();
}

fn off(c: &mut Criterion) {
    measure(c, "off");
}

/// The spans exported to a collector that is down, measured once its first export failed.
#[cfg(feature = "opentelemetry")]
fn otlp_unreachable(c: &mut Criterion) {
    use tracing_subscriber::layer::SubscriberExt;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free local port")
        .port();
    let endpoint = format!("http://127.0.0.1:{port}/v1/traces");
    let tracing = kube_informer::telemetry::OtlpTracing::new("tracing-bench", &endpoint)
        .expect("the OTLP exporter");
    let subscriber = tracing_subscriber::registry().with(tracing.layer());
    // Scoped to this thread, which the current-thread runtime runs every task on.
    let _default = tracing::subscriber::set_default(subscriber);
    {
        let _span = tracing::info_span!("before the first export").entered();
    }
    assert!(
        tracing.flush().is_err(),
        "nothing listens on port {port}, so the export fails"
    );
    measure(c, "otlp-unreachable");
}

/// The group `criterion_main!` runs; the macro cannot document the function it generates.
#[allow(missing_docs)]
mod group {
    #[cfg(feature = "opentelemetry")]
    criterion::criterion_group!(benches, super::off, super::otlp_unreachable);
    #[cfg(not(feature = "opentelemetry"))]
    criterion::criterion_group!(benches, super::off);
}
criterion_main!(group::benches);
