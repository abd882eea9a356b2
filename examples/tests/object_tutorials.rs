//! object-tutorials end to end: the real binary against the real control
//! plane, read through its log as a user would.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use k8s_openapi::api::core::v1::{Pod, Service};
use kube_client::{
    Api,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use kube_testenv::TestEnv;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
    sync::mpsc,
};

const PATIENCE: Duration = Duration::from_secs(90);
const MANIFESTS: &str = include_str!("../object-tutorials/nginx-deployment-service.yaml");
const RBAC: &str = include_str!("../object-tutorials/rbac.yaml");

/// The example running as a child process, its log lines arriving on a channel.
struct Example {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
    seen: Vec<String>,
}

impl Example {
    fn start(kubeconfig: &Path, namespace: &str) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_object-tutorials"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--namespace", namespace, "--workers", "2"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("starting object-tutorials");
        let (tx, lines) = mpsc::unbounded_channel();
        for stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut reader = BufReader::new(stream).lines();
                while let Ok(Some(line)) = reader.next_line().await {
                    let _ = tx.send(line);
                }
            });
        }
        Self {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a log line containing every one of `parts`, returning it.
    async fn expect(&mut self, parts: &[&str]) -> String {
        let matches = |line: &str| parts.iter().all(|p| line.contains(p));
        if let Some(line) = self.seen.iter().find(|l| matches(l)) {
            return line.clone();
        }
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) => {
                    self.seen.push(line.clone());
                    if matches(&line) {
                        return line;
                    }
                }
                Ok(None) => panic!(
                    "the example exited before logging {parts:?}; log:\n{}",
                    self.seen.join("\n")
                ),
                Err(_) => panic!(
                    "no log line with {parts:?} within {PATIENCE:?}; log:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Waits for the process to exit on its own and returns whether it succeeded.
    async fn exit_status(&mut self) -> std::process::ExitStatus {
        let status = tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .expect("the example exits instead of stalling")
            .expect("waiting for the example");
        while let Ok(Some(line)) =
            tokio::time::timeout(Duration::from_secs(5), self.lines.recv()).await
        {
            self.seen.push(line);
        }
        status
    }
}

/// Applies the tutorial's manifests into `namespace`, letting the API server
/// pick the NodePort so namespaces do not collide on 30011.
async fn apply_tutorial(env: &TestEnv, namespace: &str) {
    let client = env.client().await.unwrap();
    let manifests = MANIFESTS.replace("      nodePort: 30011\n", "");
    examples::apply_yaml(&client, &manifests, Some(namespace), "test")
        .await
        .unwrap();
}

async fn pod_names(env: &TestEnv, namespace: &str, count: usize) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(env.client().await.unwrap(), namespace);
    let started = tokio::time::Instant::now();
    loop {
        let mut names: Vec<String> = pods
            .list(&ListParams::default().labels("app=nginx-app"))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.metadata.name)
            .collect();
        if names.len() == count {
            names.sort();
            return names;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "{} of {count} Pods after {PATIENCE:?}",
            names.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn label_line<'a>(name: &'a str, namespace: &'a str, key: &'a str, value: &'a str) -> [String; 3] {
    [
        format!("name [{name}], namespace [{namespace}]"),
        format!("key [{key}]"),
        format!("value [{value}]"),
    ]
}

async fn expect_label(example: &mut Example, name: &str, namespace: &str, key: &str, value: &str) {
    let parts = label_line(name, namespace, key, value);
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    example.expect(&parts).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_labels_updates_and_deletions() {
    let env = TestEnv::shared().await;
    let namespace = env.create_namespace("tutorial").await.unwrap();
    apply_tutorial(env, &namespace).await;
    let pods = pod_names(env, &namespace, 3).await;

    let mut example = Example::start(env.kubeconfig_path(), &namespace);
    example
        .expect(&[&format!(
            "name [nginx-service], namespace [{namespace}], label is empty"
        )])
        .await;
    for pod in &pods {
        for (key, value) in [
            ("app", "nginx-app"),
            ("type", "front-end"),
            ("language", "c"),
            ("business-service-type", "web"),
        ] {
            expect_label(&mut example, pod, &namespace, key, value).await;
        }
    }

    let client = env.client().await.unwrap();
    let patch = Patch::Merge(serde_json::json!({ "metadata": { "labels": { "edited": "yes" } } }));
    Api::<Service>::namespaced(client.clone(), &namespace)
        .patch("nginx-service", &PatchParams::default(), &patch)
        .await
        .unwrap();
    expect_label(&mut example, "nginx-service", &namespace, "edited", "yes").await;

    let victim = &pods[0];
    Api::<Pod>::namespaced(client, &namespace)
        .delete(victim, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    example
        .expect(&[&format!("{namespace}/{victim} does not exist anymore")])
        .await;
    let replacement = pod_names(env, &namespace, 3)
        .await
        .into_iter()
        .find(|name| !pods.contains(name))
        .expect("the ReplicaSet created a replacement Pod");
    expect_label(&mut example, &replacement, &namespace, "app", "nginx-app").await;
    expect_label(&mut example, &replacement, &namespace, "language", "c").await;
}

/// Waits until the API server's authorizer honours the Role just bound:
/// RBAC objects reach it through its own informers, a moment after they are
/// written.
fn await_permission(env: &TestEnv, namespace: &str) {
    let user = format!("system:serviceaccount:{namespace}:object-tutorials");
    let started = std::time::Instant::now();
    loop {
        let output = env
            .kubectl()
            .args([
                "auth", "can-i", "list", "pods", "-n", namespace, "--as", &user,
            ])
            .output()
            .expect("running kubectl auth can-i");
        if String::from_utf8_lossy(&output.stdout).trim() == "yes" {
            return;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "the Role never took effect for {user}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A kubeconfig for `namespace`'s `object-tutorials` ServiceAccount.
fn service_account_kubeconfig(env: &TestEnv, namespace: &str) -> PathBuf {
    let output = env
        .kubectl()
        .args(["create", "token", "object-tutorials", "-n", namespace])
        .output()
        .expect("running kubectl create token");
    assert!(output.status.success(), "kubectl create token: {output:?}");
    let token = String::from_utf8(output.stdout).unwrap().trim().to_owned();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(env.kubeconfig_path()).unwrap()).unwrap();
    config["users"][0]["user"] = serde_json::json!({ "token": token });
    let path = env.dir().join(format!("kubeconfig-{namespace}"));
    std::fs::write(&path, config.to_string()).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_with_the_shipped_role_and_fails_clearly_without_it() {
    let env = TestEnv::shared().await;
    let client = env.client().await.unwrap();

    let allowed = env.create_namespace("rbac-ok").await.unwrap();
    apply_tutorial(env, &allowed).await;
    // The RoleBinding's subject names the namespace too.
    let rbac = RBAC.replace("client-go-tutorials", &allowed);
    examples::apply_yaml(&client, &rbac, Some(&allowed), "test")
        .await
        .unwrap();
    await_permission(env, &allowed);
    let mut example = Example::start(&service_account_kubeconfig(env, &allowed), &allowed);
    example
        .expect(&[&format!(
            "name [nginx-service], namespace [{allowed}], label is empty"
        )])
        .await;
    let pods = pod_names(env, &allowed, 3).await;
    expect_label(&mut example, &pods[0], &allowed, "type", "front-end").await;

    // The same ServiceAccount, with no Role bound to it.
    let denied = env.create_namespace("rbac-denied").await.unwrap();
    let service_account_only: String = RBAC.split("\n---\n").next().unwrap().to_owned();
    examples::apply_yaml(&client, &service_account_only, Some(&denied), "test")
        .await
        .unwrap();
    let mut example = Example::start(&service_account_kubeconfig(env, &denied), &denied);
    let status = example.exit_status().await;
    assert!(
        !status.success(),
        "exits with an error; log:\n{}",
        example.seen.join("\n")
    );
    let line = example.expect(&["forbidden"]).await;
    assert!(
        line.contains(&denied) && (line.contains("pods") || line.contains("services")),
        "the error names the resource and namespace: {line}"
    );
    assert!(
        !example.seen.iter().any(|l| l.contains("panicked")),
        "no panic; log:\n{}",
        example.seen.join("\n")
    );
}
