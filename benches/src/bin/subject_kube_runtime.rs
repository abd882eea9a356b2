//! The kube-runtime subject of the informer benchmark: kube-rs's `watcher` feeding a
//! `reflector` store on the Pods of one namespace, counting events. See
//! `benches::SubjectArgs` for the protocol. Its store has no indexes, so it times gets and
//! lists only.
//!
//! In the reconcile case (`--reconciles`) the event loop sends the key of each Pod the
//! driver changes over a tokio channel (kube-runtime's own queue lives inside its
//! `Controller`, which hands a reconcile the object instead of the key), and one worker
//! reads the Pod back by key and filters the store's `state()` by a kube-rs label
//! `Selector`, as a kube-runtime user lists by labels.

use std::{
    sync::{Arc, OnceLock},
    time::Instant,
};

use anyhow::Context;
use benches::{
    GROUP_LABEL, RECONCILE_LABEL, RELIST_LABEL, ReconcileLine, Recorder, RelistLine, SubjectArgs,
};
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube_client::{
    Api, ResourceExt,
    core::{Expression, Selector, SelectorExt},
};
use kube_runtime::{WatchStreamExt, reflector, reflector::ObjectRef, reflector::Store, watcher};

/// Where the event loop sends the reconcile case's keys, each with when it saw the change;
/// set once the reads are done, after which the only changes are the case's.
type ReconcileSender = Arc<OnceLock<tokio::sync::mpsc::UnboundedSender<(ObjectRef<Pod>, Instant)>>>;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let started = Instant::now();
    let args = SubjectArgs::parse();
    let client = benches::client(&args.kubeconfig).await?;
    let api = Api::<Pod>::namespaced(client, &args.namespace);
    let (reader, writer) = reflector::store::<Pod>();
    let recorder = std::sync::Arc::new(Recorder::new("kube-runtime", args.updates));
    let (synced_tx, synced_rx) = tokio::sync::oneshot::channel::<usize>();
    // `true` for every list after the first (its `InitDone`, once the store holds it);
    // `false` when the relist marker arrives by a watch event instead.
    let (relisted_tx, mut relisted_rx) = tokio::sync::mpsc::unbounded_channel::<bool>();
    let reconcile_tx = ReconcileSender::default();
    let events = tokio::spawn({
        let recorder = recorder.clone();
        let marker = args.relist.clone();
        let reconcile_tx = reconcile_tx.clone();
        async move {
            // Its documented backoff, so a cut-off subject does not retry in a busy loop.
            let stream =
                reflector(writer, watcher(api, watcher::Config::default())).default_backoff();
            futures::pin_mut!(stream);
            let mut synced_tx = Some(synced_tx);
            let (mut adds, mut applies, mut deletes) = (0usize, 0usize, 0usize);
            let mut errors = 0usize;
            while let Some(event) = stream.next().await {
                match event {
                    Ok(watcher::Event::InitApply(_)) => adds += 1,
                    Ok(watcher::Event::InitDone) => match synced_tx.take() {
                        Some(tx) => {
                            let _ = tx.send(adds);
                        }
                        None => {
                            let _ = relisted_tx.send(true);
                        }
                    },
                    Ok(watcher::Event::Apply(pod)) => {
                        // Its events carry no old object: every change of the label
                        // after the reads is one of the case's.
                        if let Some(tx) = reconcile_tx.get()
                            && pod.labels().contains_key(RECONCILE_LABEL)
                        {
                            let _ = tx.send((ObjectRef::from_obj(&pod), Instant::now()));
                        }
                        recorder.saw(pod.metadata.labels.as_ref());
                        let labels = pod.metadata.labels.as_ref();
                        if marker.is_some()
                            && labels.and_then(|l| l.get(RELIST_LABEL)) == marker.as_ref()
                        {
                            let _ = relisted_tx.send(false);
                        }
                        applies += 1;
                    }
                    Ok(watcher::Event::Delete(_)) => deletes += 1,
                    Ok(watcher::Event::Init) => {}
                    Err(error) => {
                        errors += 1;
                        // The first few only: a cut-off subject fails at every retry.
                        if errors <= 3 {
                            eprintln!("kube-runtime: watch error: {error}");
                        }
                    }
                }
            }
            (adds, applies, deletes)
        }
    });
    let adds = synced_rx.await?;
    reader.wait_until_ready().await?;
    while reader.len() < args.expect {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    recorder.print_synced(started, reader.len(), adds);
    recorder.wait_for_updates().await;
    if args.reads > 0 {
        benches::wait_for_go_ahead().await?;
        let namespace = args.namespace.as_str();
        benches::time_reads(
            "kube-runtime",
            args.expect,
            args.reads,
            |name| ObjectRef::<Pod>::new(name).within(namespace),
            |key| reader.get(key).is_some(),
            None,
            || reader.state().len(),
            None,
        )?
        .print();
    }
    if args.reconciles > 0 {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let _ = reconcile_tx.set(tx);
        benches::wait_for_go_ahead().await?;
        // The peak from here on is the reconciles'.
        benches::reset_peak(std::process::id())?;
        reconcile(&reader, rx, args.reconciles, args.expect)
            .await?
            .print();
    }
    if let Some(marker) = &args.relist {
        // Relists until the marker's change is in the store (a relist from before the
        // driver set it would not carry it).
        let name = benches::last_pod_name(args.expect);
        let key = ObjectRef::<Pod>::new(&name).within(&args.namespace);
        let relisted = loop {
            let Some(by_list) = relisted_rx.recv().await else {
                anyhow::bail!("kube-runtime: the watcher ended before relisting");
            };
            let carries = reader.get(&key).is_some_and(|pod| {
                pod.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(RELIST_LABEL))
                    == Some(marker)
            });
            if carries || !by_list {
                break by_list;
            }
        };
        RelistLine::print("kube-runtime", relisted, reader.len());
    }
    benches::wait_for_stdin().await;
    events.abort();
    Ok(())
}

/// The reconcile case's worker: reconciles each of the `m` keys the event loop sends, one
/// at a time (the channel does not collapse duplicates, so that is `m` reconciles), then
/// returns the line to print.
///
/// # Errors
///
/// When the events end first, or a key's Pod is not in the store, has no group, or its
/// group's list is not whole.
async fn reconcile(
    reader: &Store<Pod>,
    mut keys: tokio::sync::mpsc::UnboundedReceiver<(ObjectRef<Pod>, Instant)>,
    m: usize,
    pods: usize,
) -> anyhow::Result<ReconcileLine> {
    let mut read_ns = Vec::with_capacity(m);
    let mut first = None;
    let mut last_end = Instant::now();
    for _ in 0..m {
        let (key, seen) = keys
            .recv()
            .await
            .context("kube-runtime: the watcher ended before the last change")?;
        first.get_or_insert(seen);
        let started = Instant::now();
        let read = reconcile_reads(reader, &key);
        last_end = Instant::now();
        read_ns.push((last_end - started).as_nanos() as f64);
        let (group, len) = read?;
        benches::check_group("kube-runtime", pods, &group, len)?;
    }
    let first = first.unwrap_or(last_end);
    Ok(ReconcileLine::now(
        "kube-runtime",
        m,
        read_ns,
        last_end - first,
    ))
}

/// A ReplicaSet-style reconcile's reads of the store: the Pod under `key`, then every Pod
/// of its group, the store's `state()` filtered by a label selector. Returns the group
/// and how many Pods matched.
fn reconcile_reads(reader: &Store<Pod>, key: &ObjectRef<Pod>) -> anyhow::Result<(String, usize)> {
    let pod = reader
        .get(key)
        .with_context(|| format!("kube-runtime: {key} is not in the store"))?;
    let group = pod
        .labels()
        .get(GROUP_LABEL)
        .with_context(|| format!("kube-runtime: {key} has no {GROUP_LABEL} label"))?;
    let selector = Selector::from(Expression::Equal(GROUP_LABEL.to_owned(), group.clone()));
    let members: Vec<Arc<Pod>> = reader
        .state()
        .into_iter()
        .filter(|pod| selector.matches(pod.labels()))
        .collect();
    Ok((group.clone(), members.len()))
}
