//! Built-in kinds read in protobuf must be exactly what the same objects read in JSON are.
//!
//! Objects of many kinds, with the fields whose JSON differs most from their protobuf (times,
//! micro-times, quantities, int-or-strings, bytes, raw JSON, inline structs, maps, nil
//! slices), are created on a real API server, then listed and watched through
//! [`ApiListWatch`] once per [`WireFormat`]. `DynamicObject` keeps every key the server
//! sent, including `null`s, so the comparison catches a key too many or too few, not just a
//! wrong value.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube_client::{
    Api,
    api::PostParams,
    core::{ApiResource, DynamicObject, GroupVersionKind},
};
use kube_informer::{
    Error, ObjectKey, SharedInformer,
    list_watch::{
        ApiListWatch, Change, ListOptions, ListWatch, WatchEvent, WatchOptions, WireFormat,
    },
};
use kube_testenv::TestEnv;
use serde_json::{Value, json};
use tests::test_namespace;
use tokio_util::sync::CancellationToken;

/// A kind to create objects of: its API resource and whether it is namespaced.
struct Kind {
    resource: ApiResource,
    namespaced: bool,
}

fn kind(group: &str, version: &str, kind: &str, plural: &str, namespaced: bool) -> Kind {
    let gvk = GroupVersionKind::gvk(group, version, kind);
    Kind {
        resource: ApiResource::from_gvk_with_plural(&gvk, plural),
        namespaced,
    }
}

/// The objects for `namespace`, with names made unique by `suffix` for cluster-scoped ones.
fn objects(namespace: &str, suffix: &str) -> Vec<(Kind, Value)> {
    let pod_spec = json!({
        "initContainers": [{ "name": "init", "image": "busybox", "command": ["true"] }],
        "containers": [{
            "name": "web",
            "image": "nginx:1.27",
            "args": ["-g", "daemon off;"],
            "ports": [
                { "name": "http", "containerPort": 80, "protocol": "TCP" },
                { "containerPort": 9090, "hostPort": 0 }
            ],
            "env": [
                { "name": "PLAIN", "value": "x" },
                { "name": "EMPTY", "value": "" },
                { "name": "NODE", "valueFrom": { "fieldRef": { "fieldPath": "spec.nodeName" } } },
                { "name": "LIMIT", "valueFrom": { "resourceFieldRef": { "resource": "limits.memory", "divisor": "1Mi" } } }
            ],
            "resources": {
                "limits": { "cpu": "500m", "memory": "128Mi" },
                "requests": { "cpu": "0.1", "memory": "64M", "ephemeral-storage": "1Gi" }
            },
            "readinessProbe": { "httpGet": { "path": "/healthz", "port": "http" }, "periodSeconds": 5 },
            "livenessProbe": { "tcpSocket": { "port": 80 }, "failureThreshold": 0 },
            "lifecycle": { "preStop": { "exec": { "command": ["sleep", "1"] } } },
            "securityContext": {
                "runAsUser": 1000,
                "runAsNonRoot": true,
                "allowPrivilegeEscalation": false,
                "capabilities": { "drop": ["ALL"] }
            },
            "volumeMounts": [{ "name": "cfg", "mountPath": "/etc/cfg", "readOnly": true }]
        }],
        "volumes": [
            { "name": "cfg", "configMap": { "name": "cfg", "defaultMode": 420, "items": [{ "key": "a", "path": "a" }] } },
            { "name": "scratch", "emptyDir": { "sizeLimit": "500Mi", "medium": "Memory" } },
            { "name": "token", "projected": { "sources": [{ "serviceAccountToken": { "path": "t", "expirationSeconds": 3600 } }] } },
            { "name": "secret", "secret": { "secretName": "s", "optional": true } }
        ],
        "affinity": { "nodeAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{ "matchExpressions": [{ "key": "zone", "operator": "In", "values": ["a", "b"] }] }]
        } } },
        "tolerations": [
            { "key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30 },
            { "operator": "Exists" }
        ],
        "topologySpreadConstraints": [{
            "maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": { "matchLabels": { "app": "web" } }
        }],
        "hostAliases": [{ "ip": "10.0.0.1", "hostnames": ["a.local"] }],
        "dnsConfig": { "options": [{ "name": "ndots", "value": "2" }, { "name": "edns0" }] },
        "terminationGracePeriodSeconds": 0,
        "nodeSelector": { "disk": "ssd" },
        "serviceAccountName": "robot",
        "priority": 0
    });
    let labels = json!({ "app": "web", "tier": "front" });
    vec![
        (
            kind("", "v1", "Pod", "pods", true),
            json!({ "metadata": { "name": "rich", "labels": labels,
                "annotations": { "note": "", "multi": "line\nbreak" } }, "spec": pod_spec }),
        ),
        (
            kind("", "v1", "Service", "services", true),
            json!({ "metadata": { "name": "web" }, "spec": {
                "selector": { "app": "web" },
                "ports": [
                    { "name": "http", "port": 80, "targetPort": "http" },
                    { "name": "metrics", "port": 9090, "targetPort": 9091, "protocol": "UDP" }
                ],
                "sessionAffinity": "ClientIP",
                "sessionAffinityConfig": { "clientIP": { "timeoutSeconds": 600 } }
            } }),
        ),
        (
            kind("", "v1", "ConfigMap", "configmaps", true),
            json!({ "metadata": { "name": "cfg" }, "data": { "a": "1", "empty": "" },
                "binaryData": { "bin": "AAEC/w==", "none": "" }, "immutable": false }),
        ),
        (
            kind("", "v1", "Secret", "secrets", true),
            json!({ "metadata": { "name": "s" }, "type": "Opaque",
                "data": { "k": "c2VjcmV0", "zero": "AA==" }, "stringData": { "plain": "text" } }),
        ),
        (
            kind("", "v1", "ServiceAccount", "serviceaccounts", true),
            json!({ "metadata": { "name": "robot" }, "automountServiceAccountToken": false,
                "imagePullSecrets": [{ "name": "pull" }] }),
        ),
        (
            kind(
                "",
                "v1",
                "PersistentVolumeClaim",
                "persistentvolumeclaims",
                true,
            ),
            json!({ "metadata": { "name": "data" }, "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": { "requests": { "storage": "1Gi" } },
                "storageClassName": ""
            } }),
        ),
        (
            kind("", "v1", "LimitRange", "limitranges", true),
            json!({ "metadata": { "name": "limits" }, "spec": { "limits": [{
                "type": "Container", "default": { "cpu": "1" }, "defaultRequest": { "cpu": "250m" },
                "maxLimitRequestRatio": { "cpu": "4" }
            }] } }),
        ),
        (
            kind("", "v1", "ResourceQuota", "resourcequotas", true),
            json!({ "metadata": { "name": "quota" }, "spec": {
                "hard": { "pods": "10" },
                "scopeSelector": { "matchExpressions": [{ "operator": "Exists", "scopeName": "BestEffort" }] }
            } }),
        ),
        (
            kind("", "v1", "Event", "events", true),
            json!({ "metadata": { "name": "ev" },
                "involvedObject": { "kind": "Pod", "name": "rich", "apiVersion": "v1", "namespace": namespace },
                "reason": "Started", "message": "started", "type": "Normal", "count": 3,
                "firstTimestamp": "2026-01-02T03:04:05Z", "lastTimestamp": "2026-01-02T03:04:06Z",
                "eventTime": "2026-01-02T03:04:05.123456Z", "action": "Start",
                "reportingComponent": "tests", "reportingInstance": "t-1",
                "source": { "component": "tests" } }),
        ),
        (
            kind("apps", "v1", "Deployment", "deployments", true),
            json!({ "metadata": { "name": "web", "labels": labels }, "spec": {
                "replicas": 3,
                "selector": { "matchLabels": { "app": "web" } },
                "strategy": { "type": "RollingUpdate", "rollingUpdate": { "maxSurge": "25%", "maxUnavailable": 1 } },
                "revisionHistoryLimit": 0,
                "template": { "metadata": { "labels": labels }, "spec": pod_spec }
            } }),
        ),
        (
            kind("apps", "v1", "StatefulSet", "statefulsets", true),
            json!({ "metadata": { "name": "db" }, "spec": {
                "serviceName": "db",
                "selector": { "matchLabels": { "app": "db" } },
                "template": { "metadata": { "labels": { "app": "db" } },
                    "spec": { "containers": [{ "name": "db", "image": "postgres" }] } },
                "volumeClaimTemplates": [{ "metadata": { "name": "data" },
                    "spec": { "accessModes": ["ReadWriteOnce"], "resources": { "requests": { "storage": "10Gi" } } } }],
                "persistentVolumeClaimRetentionPolicy": { "whenDeleted": "Delete", "whenScaled": "Retain" }
            } }),
        ),
        (
            kind(
                "apps",
                "v1",
                "ControllerRevision",
                "controllerrevisions",
                true,
            ),
            json!({ "metadata": { "name": "rev" }, "revision": 7,
                "data": { "spec": { "template": { "n": 1.5, "list": [true, null, "x"], "nested": {} } } } }),
        ),
        (
            kind("batch", "v1", "CronJob", "cronjobs", true),
            json!({ "metadata": { "name": "nightly" }, "spec": {
                "schedule": "0 3 * * *", "timeZone": "Etc/UTC", "concurrencyPolicy": "Forbid",
                "jobTemplate": { "spec": { "backoffLimit": 2, "ttlSecondsAfterFinished": 60,
                    "template": { "spec": { "restartPolicy": "Never",
                        "containers": [{ "name": "job", "image": "busybox", "command": ["date"] }] } } } }
            } }),
        ),
        (
            kind("coordination.k8s.io", "v1", "Lease", "leases", true),
            json!({ "metadata": { "name": "leader" }, "spec": {
                "holderIdentity": "a", "leaseDurationSeconds": 15, "leaseTransitions": 0,
                "acquireTime": "2026-01-02T03:04:05.000001Z", "renewTime": "2026-01-02T03:04:06.999999Z"
            } }),
        ),
        (
            kind("events.k8s.io", "v1", "Event", "events", true),
            json!({ "metadata": { "name": "new-ev" }, "eventTime": "2026-01-02T03:04:05.500000Z",
                "reportingController": "tests/x", "reportingInstance": "t-1", "action": "Act",
                "reason": "Because", "type": "Warning", "note": "a note",
                "regarding": { "kind": "Pod", "name": "rich", "namespace": namespace },
                "series": { "count": 2, "lastObservedTime": "2026-01-02T03:04:07.250000Z" } }),
        ),
        (
            kind("rbac.authorization.k8s.io", "v1", "Role", "roles", true),
            json!({ "metadata": { "name": "reader" }, "rules": [
                { "apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"] },
                { "apiGroups": ["apps"], "resources": ["deployments"], "resourceNames": ["web"], "verbs": ["*"] }
            ] }),
        ),
        (
            kind("rbac.authorization.k8s.io", "v1", "Role", "roles", true),
            json!({ "metadata": { "name": "empty" } }),
        ),
        (
            kind(
                "networking.k8s.io",
                "v1",
                "NetworkPolicy",
                "networkpolicies",
                true,
            ),
            json!({ "metadata": { "name": "deny" }, "spec": {
                "podSelector": {},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [{ "from": [{ "ipBlock": { "cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"] } }],
                    "ports": [{ "port": "http" }, { "port": 8000, "endPort": 8080, "protocol": "TCP" }] }],
                "egress": [{}]
            } }),
        ),
        (
            kind("networking.k8s.io", "v1", "Ingress", "ingresses", true),
            json!({ "metadata": { "name": "web" }, "spec": { "rules": [{ "host": "a.example", "http": { "paths": [
                { "path": "/", "pathType": "Prefix", "backend": { "service": { "name": "web", "port": { "number": 80 } } } },
                { "path": "/m", "pathType": "Exact", "backend": { "service": { "name": "web", "port": { "name": "metrics" } } } }
            ] } }] } }),
        ),
        (
            kind(
                "policy",
                "v1",
                "PodDisruptionBudget",
                "poddisruptionbudgets",
                true,
            ),
            json!({ "metadata": { "name": "web" }, "spec": { "minAvailable": "50%",
                "selector": { "matchExpressions": [{ "key": "app", "operator": "NotIn", "values": ["db"] }] } } }),
        ),
        (
            kind(
                "autoscaling",
                "v2",
                "HorizontalPodAutoscaler",
                "horizontalpodautoscalers",
                true,
            ),
            json!({ "metadata": { "name": "web" }, "spec": {
                "scaleTargetRef": { "apiVersion": "apps/v1", "kind": "Deployment", "name": "web" },
                "minReplicas": 1, "maxReplicas": 10,
                "metrics": [{ "type": "Resource", "resource": { "name": "cpu",
                    "target": { "type": "Utilization", "averageUtilization": 80 } } }],
                "behavior": { "scaleDown": { "stabilizationWindowSeconds": 300,
                    "policies": [{ "type": "Percent", "value": 10, "periodSeconds": 60 }] } }
            } }),
        ),
        (
            kind(
                "discovery.k8s.io",
                "v1",
                "EndpointSlice",
                "endpointslices",
                true,
            ),
            json!({ "metadata": { "name": "web-1" }, "addressType": "IPv4",
                "endpoints": [{ "addresses": ["10.0.0.1"], "conditions": { "ready": true, "serving": false },
                    "targetRef": { "kind": "Pod", "name": "rich" }, "zone": "a" }],
                "ports": [{ "name": "http", "port": 80, "protocol": "TCP" }] }),
        ),
        (
            kind("", "v1", "Namespace", "namespaces", false),
            json!({ "metadata": { "name": format!("extra-{suffix}"), "labels": { "team": "x" } } }),
        ),
        (
            kind("", "v1", "Node", "nodes", false),
            json!({ "metadata": { "name": format!("node-{suffix}") }, "spec": {
                "podCIDR": "10.0.1.0/24", "podCIDRs": ["10.0.1.0/24"], "unschedulable": true,
                "taints": [{ "key": "k", "value": "v", "effect": "NoSchedule" }]
            } }),
        ),
        (
            kind(
                "scheduling.k8s.io",
                "v1",
                "PriorityClass",
                "priorityclasses",
                false,
            ),
            json!({ "metadata": { "name": format!("high-{suffix}") }, "value": -5,
                "preemptionPolicy": "Never", "description": "low" }),
        ),
        (
            kind(
                "storage.k8s.io",
                "v1",
                "StorageClass",
                "storageclasses",
                false,
            ),
            json!({ "metadata": { "name": format!("fast-{suffix}") }, "provisioner": "example.com/x",
                "parameters": { "type": "ssd" }, "reclaimPolicy": "Retain",
                "allowVolumeExpansion": true, "mountOptions": ["ro"] }),
        ),
        (
            kind(
                "admissionregistration.k8s.io",
                "v1",
                "ValidatingWebhookConfiguration",
                "validatingwebhookconfigurations",
                false,
            ),
            json!({ "metadata": { "name": format!("hook-{suffix}") }, "webhooks": [{
                "name": "check.example.com",
                "clientConfig": { "url": "https://example.com/check", "caBundle": "AAECAwQ=" },
                "rules": [{ "operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"] }],
                "sideEffects": "None", "admissionReviewVersions": ["v1"], "timeoutSeconds": 5,
                "failurePolicy": "Ignore"
            }] }),
        ),
        (
            kind(
                "rbac.authorization.k8s.io",
                "v1",
                "ClusterRole",
                "clusterroles",
                false,
            ),
            json!({ "metadata": { "name": format!("agg-{suffix}") },
                "aggregationRule": { "clusterRoleSelectors": [{ "matchLabels": { "agg": suffix } }] } }),
        ),
    ]
}

async fn create(api: &Api<DynamicObject>, kind: &Kind, object: &Value) {
    let mut object = object.clone();
    object["apiVersion"] = json!(kind.resource.api_version);
    object["kind"] = json!(kind.resource.kind);
    let object: DynamicObject = serde_json::from_value(object).expect("a valid object");
    api.create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "create {} {:?}: {e}",
                kind.resource.kind, object.metadata.name
            )
        });
}

/// Everything one list and one watch (from `resourceVersion` 0) of `api` return, as JSON.
async fn read(
    api: &Api<DynamicObject>,
    wire: WireFormat,
    names: &[String],
) -> (Vec<Value>, Vec<Value>) {
    let lw = ApiListWatch::new(api.clone()).wire_format(wire);
    let page = lw.list(&ListOptions::default()).await.expect("a list");
    let mut listed: Vec<Value> = page
        .items
        .iter()
        .filter(|o| names.contains(o.metadata.name.as_ref().unwrap()))
        .map(|o| serde_json::to_value(o).unwrap())
        .collect();
    listed.sort_by_key(|v| v["metadata"]["name"].as_str().map(str::to_owned));

    // A watch from "0" starts with an ADDED event per existing object.
    let mut stream = lw
        .watch(&WatchOptions {
            resource_version: "0".into(),
            timeout: Some(Duration::from_secs(10)),
            allow_bookmarks: false,
            send_initial_events: false,
            shard: None,
        })
        .await
        .expect("a watch");
    let mut watched = Vec::new();
    while watched.len() < listed.len() {
        let event = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("watch events within 30s")
            .expect("the watch to stay open")
            .expect("a decodable event");
        let added = match event {
            WatchEvent::Added(o)
            | WatchEvent::Decoded {
                change: Change::Added,
                object: o,
                ..
            } => o,
            _ => continue,
        };
        if names.contains(added.metadata.name.as_ref().unwrap()) {
            watched.push(serde_json::to_value(&added).unwrap());
        }
    }
    watched.sort_by_key(|v| v["metadata"]["name"].as_str().map(str::to_owned));
    (listed, watched)
}

/// The default cache keeps each object as the protobuf bytes the server sent and decodes
/// them on every read: through a paged list (list items, untyped) and a streaming list
/// (watch events, typed) alike, a read, whole or as a projection, must return what the
/// server's JSON says.
async fn compact_cache_matches(
    api: &Api<DynamicObject>,
    kind: &Kind,
    name: &str,
    json_listed: &Value,
    json_watched: &Value,
) {
    let key = ObjectKey::new(api.namespace(), name);
    for (paged, expected) in [(true, json_listed), (false, json_watched)] {
        let builder = SharedInformer::builder(
            ApiListWatch::new(api.clone()).wire_format(WireFormat::Protobuf),
        );
        let builder = if paged {
            builder.paged_list()
        } else {
            builder.streaming_list()
        };
        let informer = builder.build().spawn(CancellationToken::new());
        informer.wait_synced_or_fatal().await.expect("a sync");
        let store = informer.store();
        assert!(store.is_compact(), "compact by default");
        let cached = store.get_by_key(&key).expect("the object cached");
        let what = format!("{} {key}, paged list: {paged}", kind.resource.kind);
        assert_eq!(&serde_json::to_value(&*cached).unwrap(), expected, "{what}");
        // A projection reads the same bytes without the whole object; as JSON, all of it.
        let projected: Value = store
            .get_as(&key)
            .expect("the object reads as JSON")
            .expect("the object cached");
        assert_eq!(&projected, expected, "{what}, read as a projection");
        informer.stop().await;
    }
}

/// The one difference protobuf cannot avoid: objects embedded in an object (a StatefulSet's
/// claim templates) have no `TypeMeta` in protobuf, while the server's JSON writes the
/// `apiVersion` and `kind` its defaulting set. client-go's protobuf clients lose them too.
fn without_embedded_type_meta(object: &mut Value) {
    if let Some(templates) = object
        .pointer_mut("/spec/volumeClaimTemplates")
        .and_then(Value::as_array_mut)
    {
        for template in templates {
            let template = template.as_object_mut().unwrap();
            template.remove("apiVersion");
            template.remove("kind");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn built_in_kinds_read_the_same_in_protobuf_and_json() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "protobuf").await;
    let suffix = namespace.rsplit('-').next().unwrap().to_owned();
    let objects = objects(&namespace, &suffix);
    for (kind, object) in &objects {
        let api = if kind.namespaced {
            Api::namespaced_with(client.clone(), &namespace, &kind.resource)
        } else {
            Api::all_with(client.clone(), &kind.resource)
        };
        create(&api, kind, object).await;
    }

    let mut checked = 0;
    for (kind, object) in &objects {
        let api: Api<DynamicObject> = if kind.namespaced {
            Api::namespaced_with(client.clone(), &namespace, &kind.resource)
        } else {
            Api::all_with(client.clone(), &kind.resource)
        };
        let name = object["metadata"]["name"].as_str().unwrap().to_owned();
        let names = [name];
        let (mut json_list, mut json_watch) = read(&api, WireFormat::Json, &names).await;
        for object in json_list.iter_mut().chain(&mut json_watch) {
            without_embedded_type_meta(object);
        }
        compact_cache_matches(&api, kind, &names[0], &json_list[0], &json_watch[0]).await;
        let (pb_list, pb_watch) = read(&api, WireFormat::Protobuf, &names).await;
        let what = format!("{} {}", kind.resource.kind, names[0]);
        assert_eq!(json_list.len(), 1, "{what}: listed once");
        assert_eq!(pb_list, json_list, "{what}: list");
        assert_eq!(pb_watch, json_watch, "{what}: watch");
        // Watch events carry the type, as JSON watch events do.
        assert_eq!(pb_watch[0]["kind"], json!(kind.resource.kind), "{what}");
        checked += 1;
    }
    assert_eq!(checked, objects.len());

    // Typed: the same Pod through k8s-openapi's types, and a Secret's bytes.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let by = |wire| {
        let lw = ApiListWatch::new(pods.clone()).wire_format(wire);
        async move { lw.list(&ListOptions::default()).await.expect("pods").items }
    };
    let (json_pods, pb_pods) = (by(WireFormat::Json).await, by(WireFormat::Protobuf).await);
    assert_eq!(pb_pods, json_pods);
    let spec = pb_pods[0].spec.as_ref().unwrap();
    assert_eq!(
        spec.containers[0]
            .resources
            .as_ref()
            .unwrap()
            .limits
            .as_ref()
            .unwrap()["cpu"]
            .0,
        "500m"
    );
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let secret = ApiListWatch::new(secrets)
        .list(&ListOptions::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|s| s.metadata.name.as_deref() == Some("s"))
        .expect("the secret");
    let data = secret.data.unwrap();
    assert_eq!(data["k"].0, b"secret");
    assert_eq!(data["plain"].0, b"text");
    assert_eq!(data["zero"].0, [0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_statuses_read_in_protobuf_keep_their_reason() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "protobuf-errors").await;
    // A user with no permissions: the 403 comes back as a protobuf Status.
    let stranger = env.client_as("nobody").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(stranger, &namespace);
    let lw = ApiListWatch::new(pods).wire_format(WireFormat::Protobuf);
    let err = lw.list(&ListOptions::default()).await.unwrap_err();
    assert!(err.is_forbidden(), "{err}");
    assert!(
        err.to_string().contains("nobody"),
        "the server's message is kept: {err}"
    );
    let err = match lw
        .watch(&WatchOptions {
            resource_version: "0".into(),
            timeout: None,
            allow_bookmarks: true,
            send_initial_events: false,
            shard: None,
        })
        .await
    {
        Ok(_) => panic!("a forbidden watch"),
        Err(e) => e,
    };
    assert!(err.is_forbidden(), "{err}");

    // A continue token the server cannot read is a 400 with its message.
    let pods: Api<Pod> = Api::namespaced(client, &namespace);
    let err = ApiListWatch::new(pods)
        .list(&ListOptions {
            limit: Some(1),
            continue_token: Some("not-a-token".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    match &err {
        Error::Api { status, .. } => {
            assert_eq!(status.code, 400, "{err}");
            assert!(status.message.contains("continue"), "{err}");
        }
        other => panic!("expected a 400, got {other}"),
    }
}

/// The checked-in table is exactly what the generator writes from the Go types.
#[test]
fn the_protobuf_table_is_what_the_generator_writes() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let output = std::process::Command::new("go")
        .args(["run", "."])
        .current_dir(root.join("tools/protobuf-schema"))
        .output()
        .expect("Go on PATH (scripts/test.sh checks for it)");
    assert!(
        output.status.success(),
        "the generator failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let checked_in =
        std::fs::read(root.join("crates/informer/src/list_watch/protobuf/schema_table.rs"))
            .unwrap();
    assert!(
        output.stdout == checked_in,
        "crates/informer/src/list_watch/protobuf/schema_table.rs is stale; regenerate it (see docs/testing.md)"
    );
}
