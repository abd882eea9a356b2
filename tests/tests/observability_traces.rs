//! A reconcile's whole trace in a real Jaeger (built from its Go module, as the control
//! plane is): the watch event, the wait in the queue, the reconcile, and the API calls it
//! made, as one trace, with the reconcile's log lines carrying its trace id. A binary of
//! its own, as it installs the process's tracing subscriber.

use std::{
    collections::HashMap,
    io::Write,
    sync::{Arc, Mutex},
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::{
    Api,
    api::{Patch, PostParams},
};
use kube_informer::{
    Action, CancellationToken, ClientError, ClusterSource, Controller, ControllerClient,
    InformerFactory, ObjectKey, ReconcileRequest, Scope, retry_with_backoff,
    telemetry::OtlpTracing,
};
use kube_testenv::{Jaeger, TestEnv};
use tests::{config_map, test_namespace, within};
use tracing_subscriber::prelude::*;

/// The log lines written, for the test to read back.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("not poisoned").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// One span of a trace as Jaeger answers it: its name, and its parent's id.
#[derive(Debug)]
struct Span {
    name: String,
    parent: Option<String>,
}

/// The spans of `trace` (one of Jaeger's `data[]`), by span id.
fn spans_of(trace: &serde_json::Value) -> HashMap<String, Span> {
    trace["spans"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|span| {
            let parent = span["references"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|r| r["refType"] == "CHILD_OF")
                .and_then(|r| r["spanID"].as_str().map(str::to_owned));
            (
                span["spanID"].as_str().unwrap_or_default().to_owned(),
                Span {
                    name: span["operationName"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    parent,
                },
            )
        })
        .collect()
}

/// The id of the span named `name` whose parent is named `parent`.
fn child_named<'a>(spans: &'a HashMap<String, Span>, name: &str, parent: &str) -> Option<&'a str> {
    spans.iter().find_map(|(id, span)| {
        let parent_name = spans.get(span.parent.as_deref()?)?.name.as_str();
        (span.name.starts_with(name) && parent_name.starts_with(parent)).then_some(id.as_str())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observability_a_reconciles_whole_trace_reaches_jaeger() {
    const SERVICE: &str = "observability-traces";
    let jaeger = Jaeger::start().await.expect("Jaeger starts");
    let tracing =
        OtlpTracing::new(SERVICE, &jaeger.otlp_http_traces_url()).expect("an OTLP exporter");
    let logs = Logs::default();
    tracing_subscriber::registry()
        .with(tracing.layer())
        .with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(logs.clone())
                .with_filter(tracing_subscriber::filter::LevelFilter::INFO),
        )
        .init();

    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "traces").await;
    // The library's own client, whose requests are spans.
    let own = ClusterSource::default()
        .kubeconfig(env.kubeconfig_path())
        .client()
        .await
        .expect("a client");
    let factory = InformerFactory::new(own.clone());
    let controller = Controller::new(
        "traced",
        factory.informer::<ConfigMap>(Scope::namespace(&namespace)),
    );
    let writes = Arc::new(controller.client(own));
    let reconcile = |request: ReconcileRequest<ConfigMap>, client: Arc<ControllerClient>| async move {
        let ReconcileRequest::Present(cm) = request else {
            return Ok(Action::done());
        };
        let key = ObjectKey::from_object(&*cm).expect("a cached object has a name");
        if cm
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key("traced"))
        {
            return Ok(Action::done());
        }
        tracing::info!("annotating the ConfigMap");
        let patch = serde_json::json!({ "metadata": { "annotations": { "traced": "yes" } } });
        client
            .patch::<ConfigMap, _>(&key, &Patch::Merge(&patch))
            .await?;
        Ok::<_, ClientError>(Action::done())
    };
    let cancel = CancellationToken::new();
    factory.start(&cancel);
    let running =
        tokio::spawn(controller.run((reconcile, retry_with_backoff(), writes), cancel.clone()));

    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    api.create(&PostParams::default(), &config_map("traced", &[]))
        .await
        .expect("the ConfigMap");
    tests::eventually_some("the ConfigMap annotated", || async {
        let cm = api.get("traced").await.ok()?;
        cm.metadata
            .annotations?
            .contains_key("traced")
            .then_some(())
    })
    .await;
    tracing.flush().expect("spans exported");

    // One trace holds the watch event, its queue wait, the reconcile and the PATCH.
    let trace_id = tests::eventually_some("the reconcile's whole trace in Jaeger", || async {
        let _ = tracing.flush();
        let traces = jaeger.traces(SERVICE).await.ok()?;
        traces["data"].as_array()?.iter().find_map(|trace| {
            let spans = spans_of(trace);
            child_named(&spans, "queue wait", "watch event")?;
            child_named(&spans, "reconcile", "queue wait")?;
            child_named(&spans, "PATCH", "reconcile")?;
            trace["traceID"].as_str().map(str::to_owned)
        })
    })
    .await;

    // The reconcile's log line carries that trace's id.
    let written =
        String::from_utf8(logs.0.lock().expect("not poisoned").clone()).expect("UTF-8 logs");
    let line = written
        .lines()
        .find(|l| l.contains("annotating the ConfigMap"))
        .unwrap_or_else(|| panic!("the reconcile's log line in:\n{written}"));
    let logged = line
        .split("trace_id=")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_hexdigit()).next())
        .unwrap_or_else(|| panic!("a trace id in {line}"));
    assert_eq!(
        logged.trim_start_matches('0'),
        trace_id.trim_start_matches('0'),
        "{line}"
    );

    cancel.cancel();
    within("the controller to stop", running)
        .await
        .expect("its task")
        .expect("it stops cleanly");
    factory.shutdown().await;
    drop(tracing);
}
