//! [`TestEnv`]: one running control plane.

use std::{
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use k8s_openapi::api::core::v1::Namespace;
use kube_client::{Api, api::PostParams};

use crate::{
    Binaries, Error, FaultProxy, Result,
    apiserver::{self, ApiServerSpec},
    certs::Credentials,
    controller_manager,
    etcd::{Etcd, Gateway},
    kubeconfig, ports,
    process::Supervised,
};

/// Configures and starts a [`TestEnv`].
#[derive(Debug, Clone)]
pub struct Builder {
    controller_manager: bool,
    apiserver_args: Vec<String>,
    start_timeout: Duration,
}

impl Default for Builder {
    fn default() -> Self {
        Self {
            controller_manager: false,
            apiserver_args: Vec::new(),
            start_timeout: Duration::from_secs(120),
        }
    }
}

impl Builder {
    /// Also runs kube-controller-manager (Deployments, ReplicaSets, garbage
    /// collection, namespace deletion, default service accounts).
    #[must_use]
    pub fn controller_manager(mut self, enabled: bool) -> Self {
        self.controller_manager = enabled;
        self
    }

    /// Adds a flag to kube-apiserver's command line, e.g. `--v=4`.
    #[must_use]
    pub fn apiserver_arg(mut self, arg: impl Into<String>) -> Self {
        self.apiserver_args.push(arg.into());
        self
    }

    /// How long each component may take to become ready (default 120 s).
    #[must_use]
    pub fn start_timeout(mut self, timeout: Duration) -> Self {
        self.start_timeout = timeout;
        self
    }

    /// Builds the binaries if needed, then starts etcd, kube-apiserver and,
    /// if asked, kube-controller-manager, and waits until they are ready.
    ///
    /// # Errors
    ///
    /// Any [`Error`]: a missing Go toolchain or failed build, a component
    /// that exits or is not ready in time (naming its log), an unwritable
    /// temporary directory.
    pub async fn start(self) -> Result<TestEnv> {
        let started = Instant::now();
        let binaries = tokio::task::spawn_blocking(Binaries::ensure)
            .await
            .expect("the binary build does not panic")?;
        let dir = scratch_dir(None)?;
        let creds = Credentials::generate(dir.path())?;
        let etcd_client_port = ports::free_port()?;
        let etcd_peer_port = ports::free_port()?;
        let etcd = Etcd::start_on(
            &binaries.etcd(),
            dir.path(),
            etcd_client_port,
            etcd_peer_port,
            self.start_timeout,
            None,
        )
        .await?;
        let etcd_gateway = Gateway::new(etcd_client_port, etcd.log().to_owned());
        let spec = ApiServerSpec::new(
            binaries.kube_apiserver(),
            dir.path(),
            ports::free_port()?,
            etcd_gateway.url(),
            &creds,
            &self.apiserver_args,
        );
        let kubeconfig_path = dir.path().join("kubeconfig");
        kubeconfig::write_admin(&kubeconfig_path, &spec.url(), &creds)?;
        let mut apiserver = spec.start()?;
        let client = kubeconfig::client_from(&kubeconfig_path, None).await?;
        apiserver::wait_ready(&mut apiserver, &client, self.start_timeout).await?;
        let controller_manager = if self.controller_manager {
            let mut process = controller_manager::start(
                &binaries.kube_controller_manager(),
                dir.path(),
                &kubeconfig_path,
                &creds,
            )?;
            process.check_running()?;
            Some(process)
        } else {
            None
        };
        tracing::info!(
            server = %spec.url(),
            kubeconfig = %kubeconfig_path.display(),
            controller_manager = self.controller_manager,
            elapsed_ms = started.elapsed().as_millis(),
            "control plane ready"
        );
        Ok(TestEnv {
            controller_manager: Mutex::new(controller_manager),
            apiserver: Mutex::new(Some(apiserver)),
            etcd: Mutex::new(Some(etcd)),
            etcd_gateway,
            etcd_client_port,
            etcd_peer_port,
            spec,
            kubeconfig_path,
            binaries,
            creds,
            start_timeout: self.start_timeout,
            dir,
        })
    }
}

/// A running control plane: etcd, kube-apiserver and optionally
/// kube-controller-manager, on free loopback ports, with their data, keys and
/// logs in a temporary directory.
///
/// Dropping it stops every process it started and removes the directory.
/// The processes also die with the current process if it is killed, so a
/// crashed test run leaves nothing behind.
///
/// ```no_run
/// # async fn demo() -> kube_testenv::Result<()> {
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube_client::Api;
///
/// let env = kube_testenv::TestEnv::builder().start().await?;
/// let namespace = env.create_namespace("demo").await?;
/// let config_maps: Api<ConfigMap> = Api::namespaced(env.client().await?, &namespace);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct TestEnv {
    // Fields drop in order: clients of the API server first, etcd last, the
    // directory holding their data after all of them.
    controller_manager: Mutex<Option<Supervised>>,
    apiserver: Mutex<Option<Supervised>>,
    etcd: Mutex<Option<Etcd>>,
    etcd_gateway: Gateway,
    etcd_client_port: u16,
    etcd_peer_port: u16,
    spec: ApiServerSpec,
    kubeconfig_path: PathBuf,
    binaries: Binaries,
    creds: Credentials,
    start_timeout: Duration,
    dir: tempfile::TempDir,
}

impl TestEnv {
    /// A builder with the defaults: no controller-manager, 120 s start timeout.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// The environment shared by every test of the current test binary, with
    /// kube-controller-manager, started on first use.
    ///
    /// Give each test its own namespace ([`TestEnv::create_namespace`]) and
    /// start a private environment for tests that stop or break it.
    ///
    /// # Panics
    ///
    /// If the environment cannot start; the message is the start error, and
    /// every later call panics with the same message instead of retrying.
    pub async fn shared() -> &'static TestEnv {
        static SHARED: tokio::sync::OnceCell<Result<TestEnv, String>> =
            tokio::sync::OnceCell::const_new();
        let env = SHARED
            .get_or_init(|| async {
                TestEnv::builder()
                    .controller_manager(true)
                    .start()
                    .await
                    .map_err(|e| e.to_string())
            })
            .await;
        match env {
            Ok(env) => env,
            Err(message) => panic!("the shared control plane did not start: {message}"),
        }
    }

    /// A new client authenticated as cluster admin.
    ///
    /// Clients are tied to the tokio runtime that creates them, so tests that
    /// share one environment each ask for their own.
    ///
    /// # Errors
    ///
    /// [`Error::Client`] if the kubeconfig cannot be turned into a client.
    pub async fn client(&self) -> Result<kube_client::Client> {
        kubeconfig::client_from(&self.kubeconfig_path, None).await
    }

    /// A new client that authenticates as admin but acts as `user` (e.g.
    /// `system:serviceaccount:<namespace>:<name>`), so RBAC applies exactly
    /// as it would to that user.
    ///
    /// # Errors
    ///
    /// [`Error::Client`] if the kubeconfig cannot be turned into a client.
    pub async fn client_as(&self, user: &str) -> Result<kube_client::Client> {
        kubeconfig::client_from(&self.kubeconfig_path, Some(user)).await
    }

    /// The admin kubeconfig file.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// The API server's URL, e.g. `https://127.0.0.1:41234`.
    pub fn server_url(&self) -> String {
        self.spec.url()
    }

    /// The API server's address, e.g. `127.0.0.1:41234`: what a
    /// [`FaultProxy`] forwards to. It stays the same across
    /// [`restart_apiserver`](Self::restart_apiserver).
    pub fn apiserver_addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.spec.port))
    }

    /// The admin client configuration, but with the server at `proxy`'s
    /// address, for tests that tune it (timeouts, retries) before building a
    /// client.
    ///
    /// TLS passes through the proxy as plain TCP, and the serving certificate
    /// covers `127.0.0.1`, so the client verifies the API server as usual.
    ///
    /// # Errors
    ///
    /// [`Error::Client`] or [`Error::Io`] if the credentials cannot be read.
    pub async fn config_via(&self, proxy: &FaultProxy) -> Result<kube_client::Config> {
        kubeconfig::admin_config(&proxy_url(proxy), &self.creds).await
    }

    /// A new admin client whose every connection goes through `proxy`, so the
    /// faults it injects hit this client and no other.
    ///
    /// # Errors
    ///
    /// [`Error::Client`] if the client cannot be built.
    pub async fn client_via(&self, proxy: &FaultProxy) -> Result<kube_client::Client> {
        let config = self.config_via(proxy).await?;
        kube_client::Client::try_from(config).map_err(|e| Error::Client(e.to_string()))
    }

    /// Writes an admin kubeconfig whose server is `proxy`'s address to
    /// `path`, for a program under test that takes a kubeconfig (kubectl, a
    /// Go controller).
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if the file cannot be written.
    pub fn kubeconfig_via(&self, proxy: &FaultProxy, path: &Path) -> Result<()> {
        kubeconfig::write_admin(path, &proxy_url(proxy), &self.creds)
    }

    /// etcd's client URL, e.g. `http://127.0.0.1:42345`. It stays the same
    /// across [`restart_etcd`](Self::restart_etcd).
    pub fn etcd_url(&self) -> String {
        self.etcd_gateway.url().to_owned()
    }

    /// The directory holding data, keys and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The log file of a component: `etcd`, `kube-apiserver` or
    /// `kube-controller-manager`.
    pub fn log_path(&self, component: &str) -> PathBuf {
        self.dir.path().join(format!("{component}.log"))
    }

    /// The binaries this environment runs.
    pub fn binaries(&self) -> &Binaries {
        &self.binaries
    }

    /// A `kubectl` command already pointed at this environment.
    pub fn kubectl(&self) -> std::process::Command {
        let mut command = std::process::Command::new(self.binaries.kubectl());
        command.arg("--kubeconfig").arg(&self.kubeconfig_path);
        command
    }

    /// Creates a namespace with a fresh name starting with `prefix` and
    /// returns the name.
    ///
    /// # Errors
    ///
    /// [`Error::Kube`] if the API server refuses.
    pub async fn create_namespace(&self, prefix: &str) -> Result<String> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .subsec_nanos();
        let name = format!(
            "{prefix}-{}-{:05x}",
            NEXT.fetch_add(1, Ordering::Relaxed),
            nanos & 0xfffff
        );
        let namespace = Namespace {
            metadata: kube_client::api::ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: Api<Namespace> = Api::all(self.client().await?);
        api.create(&PostParams::default(), &namespace)
            .await
            .map_err(|source| Error::Kube {
                action: format!("creating namespace {name}"),
                source,
            })?;
        Ok(name)
    }

    /// Stops kube-apiserver (`SIGTERM`, then `SIGKILL` after 10 s). etcd and
    /// its data stay. Does nothing if it is already stopped.
    ///
    /// [`kill_apiserver`](Self::kill_apiserver) crashes it instead.
    pub async fn stop_apiserver(&self) {
        let process = self
            .apiserver
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(mut process) = process {
            tokio::task::spawn_blocking(move || process.stop())
                .await
                .expect("stopping a process does not panic");
            tracing::info!("kube-apiserver stopped");
        }
    }

    /// Starts kube-apiserver again on the same port, with the same flags and
    /// the same etcd, and waits until it is ready. Does nothing if it runs.
    ///
    /// After [`kill_apiserver`](Self::kill_apiserver) this is its recovery, as
    /// a supervisor restarting a crashed API server would be.
    ///
    /// The port is free while the API server is stopped, so another process
    /// could take it in between; nothing here picks ports then, so only a
    /// foreign process could.
    ///
    /// # Errors
    ///
    /// [`Error::Exited`] or [`Error::NotReady`] naming its log.
    pub async fn start_apiserver(&self) -> Result<()> {
        if self
            .apiserver
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
        {
            return Ok(());
        }
        let mut process = self.spec.start()?;
        let client = self.client().await?;
        apiserver::wait_ready(&mut process, &client, self.start_timeout).await?;
        *self.apiserver.lock().unwrap_or_else(|p| p.into_inner()) = Some(process);
        tracing::info!("kube-apiserver started");
        Ok(())
    }

    /// [`stop_apiserver`](Self::stop_apiserver), then
    /// [`start_apiserver`](Self::start_apiserver).
    ///
    /// # Errors
    ///
    /// As [`start_apiserver`](Self::start_apiserver).
    pub async fn restart_apiserver(&self) -> Result<()> {
        self.stop_apiserver().await;
        self.start_apiserver().await
    }

    /// Kills kube-apiserver with `SIGKILL`, as a crash would: no graceful
    /// shutdown, its connections are reset by the kernel rather than closed by
    /// the server. Returns once the process is gone and reaped, so
    /// [`start_apiserver`](Self::start_apiserver) can start it again on the
    /// same port. etcd and its data stay. Does nothing if it is already
    /// stopped.
    pub async fn kill_apiserver(&self) {
        let process = self
            .apiserver
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(mut process) = process {
            tokio::task::spawn_blocking(move || process.kill())
                .await
                .expect("killing a process does not panic");
            tracing::info!("kube-apiserver killed");
        }
    }

    /// Whether kube-apiserver is running (not stopped by
    /// [`stop_apiserver`](Self::stop_apiserver) or
    /// [`kill_apiserver`](Self::kill_apiserver)).
    pub fn apiserver_running(&self) -> bool {
        self.apiserver
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// Compacts etcd up to its current revision, so every older
    /// resourceVersion is gone: a watch or list from one fails with
    /// `410 Gone`. Returns the revision compacted to.
    ///
    /// The API server compacts on its own every five minutes; this makes it
    /// happen now.
    ///
    /// # Errors
    ///
    /// [`Error::EtcdStopped`] while etcd is stopped; [`Error::Etcd`] if etcd
    /// refuses or does not answer.
    pub async fn compact_etcd(&self) -> Result<i64> {
        if !self.etcd_running() {
            return Err(Error::EtcdStopped);
        }
        self.etcd_gateway.compact().await
    }

    /// Stops etcd (`SIGTERM`, then `SIGKILL` after 10 s); its data stays.
    /// Does nothing if it is already stopped.
    ///
    /// kube-apiserver keeps running: requests that need storage fail or hang
    /// until their timeout, and its `/readyz` fails, until
    /// [`start_etcd`](Self::start_etcd).
    pub async fn stop_etcd(&self) {
        let member = self.etcd.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(member) = member {
            tokio::task::spawn_blocking(move || drop(member))
                .await
                .expect("stopping a process does not panic");
            tracing::info!(url = %self.etcd_url(), "etcd stopped");
        }
    }

    /// Kills etcd with `SIGKILL`, as a crash would: no graceful shutdown.
    /// Returns once the process is gone and reaped. Its data stays as the
    /// crash left it: every write it acknowledged survives, because only a
    /// machine crash loses what etcd has not synced to disk. Does nothing if
    /// it is already stopped.
    ///
    /// kube-apiserver keeps running, as with [`stop_etcd`](Self::stop_etcd).
    pub async fn kill_etcd(&self) {
        let member = self.etcd.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(member) = member {
            tokio::task::spawn_blocking(move || member.kill())
                .await
                .expect("killing a process does not panic");
            tracing::info!(url = %self.etcd_url(), "etcd killed");
        }
    }

    /// Starts etcd again on the same ports with the same data, and waits
    /// until it is healthy. Does nothing if it runs.
    ///
    /// kube-apiserver, if it runs, reconnects by itself, typically within a
    /// few seconds; it is ready again when its `/readyz` says so, which this
    /// does not wait for.
    ///
    /// The ports are free while etcd is stopped, so another process could
    /// take them in between; nothing here picks ports then, so only a foreign
    /// process could.
    ///
    /// # Errors
    ///
    /// [`Error::Spawn`], [`Error::Exited`] or [`Error::NotReady`] naming
    /// etcd's log.
    pub async fn start_etcd(&self) -> Result<()> {
        if self.etcd_running() {
            return Ok(());
        }
        let member = Etcd::start_on(
            &self.binaries.etcd(),
            self.dir.path(),
            self.etcd_client_port,
            self.etcd_peer_port,
            self.start_timeout,
            None,
        )
        .await?;
        tracing::info!(url = %self.etcd_url(), pid = member.pid(), "etcd started");
        *self.etcd.lock().unwrap_or_else(|p| p.into_inner()) = Some(member);
        Ok(())
    }

    /// [`stop_etcd`](Self::stop_etcd), then [`start_etcd`](Self::start_etcd).
    ///
    /// # Errors
    ///
    /// As [`start_etcd`](Self::start_etcd).
    pub async fn restart_etcd(&self) -> Result<()> {
        self.stop_etcd().await;
        self.start_etcd().await
    }

    /// Whether etcd is running (not stopped by [`stop_etcd`](Self::stop_etcd)
    /// or [`kill_etcd`](Self::kill_etcd)).
    pub fn etcd_running(&self) -> bool {
        self.etcd
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// The process ids of the running components, for tests that check
    /// nothing is left behind. A stopped component has none, so the list is
    /// shorter while one is stopped.
    pub fn pids(&self) -> Vec<u32> {
        let mut pids = Vec::new();
        if let Some(etcd) = self.etcd.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            pids.push(etcd.pid());
        }
        for process in [&self.apiserver, &self.controller_manager] {
            if let Some(p) = process.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                pids.push(p.pid());
            }
        }
        pids
    }

    /// The process id of etcd. A restart gives it a new one.
    ///
    /// # Panics
    ///
    /// While etcd is stopped ([`etcd_running`](Self::etcd_running) is
    /// false): there is no process then.
    pub fn etcd_pid(&self) -> u32 {
        self.etcd
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(Etcd::pid)
            .expect("etcd_pid() is called while etcd runs, not after stop_etcd() or kill_etcd()")
    }

    /// The process id of kube-apiserver; `None` while it is stopped. A restart gives it a
    /// new one.
    pub fn apiserver_pid(&self) -> Option<u32> {
        self.apiserver
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(Supervised::pid)
    }
}

fn proxy_url(proxy: &FaultProxy) -> String {
    format!("https://{}", proxy.listen_addr())
}

/// A fresh directory under `$TMPDIR/kube-testenv`, named after this process
/// and `label`, after removing those left by processes that no longer exist
/// (a shared environment lives in a static and is never dropped).
pub(crate) fn scratch_dir(label: Option<&str>) -> Result<tempfile::TempDir> {
    let base = std::env::temp_dir().join("kube-testenv");
    std::fs::create_dir_all(&base).map_err(Error::io("creating", &base))?;
    if let Ok(entries) = std::fs::read_dir(&base) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let pid = name
                .to_string_lossy()
                .split('-')
                .next()
                .and_then(|p| p.parse::<u32>().ok());
            if let Some(pid) = pid
                && !Path::new(&format!("/proc/{pid}")).exists()
            {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let prefix = match label {
        Some(label) => format!("{}-{label}-", std::process::id()),
        None => format!("{}-", std::process::id()),
    };
    tempfile::Builder::new()
        .prefix(&prefix)
        .tempdir_in(&base)
        .map_err(Error::io("creating a directory in", base))
}
