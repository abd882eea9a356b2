//! The kube-runtime subject of the informer benchmark: kube-rs's `watcher` feeding a
//! `reflector` store on the Pods of one namespace, counting events. See
//! `benches::SubjectArgs` for the protocol. Its store has no indexes, so it times gets and
//! lists only.

use std::time::Instant;

use benches::{RELIST_LABEL, Recorder, RelistLine, SubjectArgs};
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube_client::Api;
use kube_runtime::{WatchStreamExt, reflector, reflector::ObjectRef, watcher};

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
    let events = tokio::spawn({
        let recorder = recorder.clone();
        let marker = args.relist.clone();
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
