//! The one error type of this crate.

use std::path::PathBuf;

/// Everything that can go wrong while building or running the control plane.
///
/// Errors about a running component name the log file that holds its output,
/// because the reason is almost always in there.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Go toolchain is needed to build a Go module but is not on `PATH`.
    #[error(
        "the Go toolchain (`go`) was not found on PATH; it is needed once to build {what} from \
         {module}. Install Go 1.26 or newer, or point KUBE_TESTENV_BIN_DIR at a directory of \
         prebuilt binaries (etcd, kube-apiserver, kube-controller-manager, kubectl and, for \
         FaultProxy, toxiproxy-server)"
    )]
    GoMissing {
        /// What would have been built: "the control plane" or "Toxiproxy".
        what: &'static str,
        /// The Go module that would have been built.
        module: PathBuf,
    },

    /// `go build` failed.
    #[error("building {what} failed ({status}); the build log is {log}")]
    BuildFailed {
        /// What was built: "the control plane" or "Toxiproxy".
        what: &'static str,
        /// How `go build` exited.
        status: String,
        /// The full output of the build.
        log: PathBuf,
    },

    /// `KUBE_TESTENV_BIN_DIR` names a directory that lacks a binary.
    #[error("KUBE_TESTENV_BIN_DIR is set, but {0} does not exist or is not executable")]
    BinaryMissing(PathBuf),

    /// A component could not be started.
    #[error("could not start {component} ({binary}): {source}")]
    Spawn {
        /// Which component.
        component: &'static str,
        /// The binary that was run.
        binary: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },

    /// A component exited while it was expected to run.
    #[error("{component} exited ({status}) before it became ready; its log is {log}{tail}")]
    Exited {
        /// Which component.
        component: &'static str,
        /// How it exited.
        status: String,
        /// Where its output went.
        log: PathBuf,
        /// The last lines of its log, prefixed with a newline, or empty.
        tail: String,
    },

    /// A component did not become ready in time.
    #[error("{component} was not ready after {waited:?} ({last_problem}); its log is {log}")]
    NotReady {
        /// Which component.
        component: &'static str,
        /// How long the readiness check waited.
        waited: std::time::Duration,
        /// What the last readiness probe saw.
        last_problem: String,
        /// Where its output went.
        log: PathBuf,
    },

    /// The operation needs the API server running, but it is stopped.
    #[error("the API server is stopped; call start_apiserver() first")]
    ApiServerStopped,

    /// The operation needs etcd running, but it is stopped
    /// ([`TestEnv::stop_etcd`](crate::TestEnv::stop_etcd) or
    /// [`TestEnv::kill_etcd`](crate::TestEnv::kill_etcd)).
    #[error("etcd is stopped; call start_etcd() first")]
    EtcdStopped,

    /// A request to etcd's HTTP gateway failed.
    #[error("etcd request {path} failed: {reason}; etcd's log is {log}")]
    Etcd {
        /// The gateway path requested.
        path: &'static str,
        /// What went wrong.
        reason: String,
        /// Where etcd's output went.
        log: PathBuf,
    },

    /// Toxiproxy's HTTP API refused or did not answer a request of a
    /// [`FaultProxy`](crate::FaultProxy).
    #[error("Toxiproxy: {action} failed: {reason}; its log is {log}")]
    Toxiproxy {
        /// What was asked of it, e.g. "adding toxic stall_upstream".
        action: String,
        /// The HTTP status and body it answered, or why there was no answer.
        reason: String,
        /// Where toxiproxy-server's output went.
        log: PathBuf,
    },

    /// Generating certificates or keys failed.
    #[error("generating certificates failed: {0}")]
    Certificates(#[from] rcgen::Error),

    /// Building a client from the generated kubeconfig failed.
    #[error("building a client for the local control plane failed: {0}")]
    Client(String),

    /// A Kubernetes API call made by the environment itself failed.
    #[error("{action} failed: {source}")]
    Kube {
        /// What was attempted.
        action: String,
        /// The client's error.
        source: kube_client::Error,
    },

    /// A file in the environment's directory could not be read or written.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was attempted.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },
}

impl Error {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Error::Io {
            action,
            path,
            source,
        }
    }
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
