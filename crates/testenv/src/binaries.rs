//! The control plane's binaries: found in a cache, or built from the Go module
//! in this crate's `go/` directory (how is in `go_build`).

use std::path::{Path, PathBuf};

use crate::{Error, Result, go_build::GoBuild};

/// The Go module that builds the control plane.
const GO_MODULE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/go");

/// The Kubernetes release the Go module builds, as in `go/KUBERNETES_VERSION`.
pub const KUBERNETES_VERSION: &str = include_str!("../go/KUBERNETES_VERSION").trim_ascii();

const COMMANDS: [&str; 4] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kubectl",
];

/// Where the control plane's binaries are.
#[derive(Debug, Clone)]
pub struct Binaries {
    dir: PathBuf,
}

impl Binaries {
    /// Finds the binaries, building them first if the cache has none for the
    /// current sources.
    ///
    /// `KUBE_TESTENV_BIN_DIR` overrides the cache with a directory of prebuilt
    /// binaries; `KUBE_TESTENV_CACHE_DIR` moves the cache (default:
    /// `$XDG_CACHE_HOME/kube-testenv` or `~/.cache/kube-testenv`).
    ///
    /// # Errors
    ///
    /// [`Error::GoMissing`] without a Go toolchain, [`Error::BuildFailed`]
    /// naming the build log when `go build` fails, [`Error::BinaryMissing`]
    /// when `KUBE_TESTENV_BIN_DIR` lacks a binary.
    pub fn ensure() -> Result<Self> {
        if let Some(dir) = std::env::var_os("KUBE_TESTENV_BIN_DIR") {
            let binaries = Self {
                dir: PathBuf::from(dir),
            };
            for command in COMMANDS {
                let path = binaries.dir.join(command);
                if !path.is_file() {
                    return Err(Error::BinaryMissing(path));
                }
            }
            return Ok(binaries);
        }
        let build = GoBuild {
            what: "the control plane",
            takes: "several minutes",
            module: GO_MODULE,
            sources: &["cmd"],
            packages: &["./cmd/..."],
            binary: None,
            name: KUBERNETES_VERSION.to_owned(),
            // The names every earlier version used, so that builds by older and
            // newer checkouts still wait for each other.
            file_prefix: "",
            ldflags: ldflags(),
        };
        Ok(Self {
            dir: build.ensure()?,
        })
    }

    /// The directory holding the binaries.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of etcd.
    pub fn etcd(&self) -> PathBuf {
        self.dir.join("etcd")
    }

    /// The path of kube-apiserver.
    pub fn kube_apiserver(&self) -> PathBuf {
        self.dir.join("kube-apiserver")
    }

    /// The path of kube-controller-manager.
    pub fn kube_controller_manager(&self) -> PathBuf {
        self.dir.join("kube-controller-manager")
    }

    /// The path of kubectl.
    pub fn kubectl(&self) -> PathBuf {
        self.dir.join("kubectl")
    }
}

fn ldflags() -> String {
    let version = KUBERNETES_VERSION;
    let mut parts = version.trim_start_matches('v').split('.');
    let major = parts.next().unwrap_or("1");
    let minor = parts.next().unwrap_or("0");
    let mut flags = vec!["-s".to_owned(), "-w".to_owned()];
    // Both packages carry the version: the servers report component-base's on
    // /version, kubectl reports client-go's as its client version.
    for package in [
        "k8s.io/component-base/version",
        "k8s.io/client-go/pkg/version",
    ] {
        for (name, value) in [
            ("gitVersion", version),
            ("gitMajor", major),
            ("gitMinor", minor),
            ("gitTreeState", "clean"),
            ("buildDate", "1970-01-01T00:00:00Z"),
        ] {
            flags.push(format!("-X {package}.{name}={value}"));
        }
    }
    flags.join(" ")
}
