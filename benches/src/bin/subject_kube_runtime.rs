//! The kube-runtime subject of the informer benchmark: kube-rs's `watcher` feeding a
//! `reflector` store on the Pods of one namespace, counting events. See
//! `benches::SubjectArgs` for the protocol.

use std::time::Instant;

use benches::{Recorder, SubjectArgs};
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube_client::Api;
use kube_runtime::{reflector, watcher};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let started = Instant::now();
    let args = SubjectArgs::parse();
    let client = benches::client(&args.kubeconfig).await?;
    let api = Api::<Pod>::namespaced(client, &args.namespace);
    let (reader, writer) = reflector::store::<Pod>();
    let recorder = std::sync::Arc::new(Recorder::new("kube-runtime", args.updates));
    let (synced_tx, synced_rx) = tokio::sync::oneshot::channel::<usize>();
    let events = tokio::spawn({
        let recorder = recorder.clone();
        async move {
            let stream = reflector(writer, watcher(api, watcher::Config::default()));
            futures::pin_mut!(stream);
            let mut synced_tx = Some(synced_tx);
            let (mut adds, mut applies, mut deletes) = (0usize, 0usize, 0usize);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(watcher::Event::InitApply(_)) => adds += 1,
                    Ok(watcher::Event::InitDone) => {
                        if let Some(tx) = synced_tx.take() {
                            let _ = tx.send(adds);
                        }
                    }
                    Ok(watcher::Event::Apply(pod)) => {
                        recorder.saw(pod.metadata.labels.as_ref());
                        applies += 1;
                    }
                    Ok(watcher::Event::Delete(_)) => deletes += 1,
                    Ok(watcher::Event::Init) => {}
                    Err(error) => eprintln!("watch error: {error}"),
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
    recorder.finish().await;
    events.abort();
    Ok(())
}
