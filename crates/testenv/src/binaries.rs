//! The binaries kube-testenv runs: found in a cache, or built from the Go
//! modules beside this crate, `go/` for the control plane and `toxiproxy/` for
//! [`FaultProxy`](crate::FaultProxy)'s Toxiproxy.
//!
//! They are separate modules so that neither build's cache key covers the
//! other's sources: a change to Toxiproxy never rebuilds the control plane,
//! which takes minutes. How a module is built and cached is in `go_build`.

use std::path::{Path, PathBuf};

use crate::{Error, Result, go_build::GoBuild};

/// The Go module that builds the control plane.
const GO_MODULE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/go");

/// The Go module that builds toxiproxy-server.
const TOXIPROXY_MODULE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/toxiproxy");

/// The Kubernetes release the Go module builds, as in `go/KUBERNETES_VERSION`.
pub const KUBERNETES_VERSION: &str = include_str!("../go/KUBERNETES_VERSION").trim_ascii();

/// The Go module that builds Jaeger (`jaeger/go.mod` names its binary as a tool).
const JAEGER_MODULE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/jaeger");

/// The Jaeger release `jaeger/go.mod` requires.
pub const JAEGER_VERSION: &str = "v1.75.0";

/// The Toxiproxy release `toxiproxy/go.mod` requires.
pub const TOXIPROXY_VERSION: &str = "v2.5.0";

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

/// Where toxiproxy-server is: the Toxiproxy build that
/// [`FaultProxy`](crate::FaultProxy) runs.
#[derive(Debug, Clone)]
pub struct ToxiproxyBinary {
    path: PathBuf,
}

impl ToxiproxyBinary {
    /// Finds toxiproxy-server, building it first (about a minute) if the cache
    /// has none for the current sources of `toxiproxy/`.
    ///
    /// A `toxiproxy-server` in `KUBE_TESTENV_BIN_DIR` is used instead of the
    /// cache; `KUBE_TESTENV_CACHE_DIR` moves the cache, as for [`Binaries`].
    ///
    /// # Errors
    ///
    /// [`Error::GoMissing`] without a Go toolchain, [`Error::BuildFailed`]
    /// naming the build log when `go build` fails.
    pub fn ensure() -> Result<Self> {
        const BINARY: &str = "toxiproxy-server";
        if let Some(dir) = std::env::var_os("KUBE_TESTENV_BIN_DIR") {
            let path = PathBuf::from(dir).join(BINARY);
            if path.is_file() {
                return Ok(Self { path });
            }
        }
        let build = GoBuild {
            what: "Toxiproxy",
            takes: "about a minute",
            module: TOXIPROXY_MODULE,
            // The module holds no Go source of its own (go.mod names the server
            // as a tool), but any added later changes what is built.
            sources: &["."],
            packages: &["github.com/Shopify/toxiproxy/v2/cmd/server"],
            binary: Some(BINARY),
            name: format!("toxiproxy-{TOXIPROXY_VERSION}"),
            file_prefix: "toxiproxy-",
            // Without the version, toxiproxy-server reports itself as "git".
            ldflags: format!(
                "-s -w -X github.com/Shopify/toxiproxy/v2.Version={TOXIPROXY_VERSION}"
            ),
        };
        Ok(Self {
            path: build.ensure()?.join(BINARY),
        })
    }

    /// The path of toxiproxy-server.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Where the Jaeger binary is: the all-in-one trace collector and query service that
/// [`Jaeger`](crate::Jaeger) runs, built from its Go module as the control plane is.
#[derive(Debug, Clone)]
pub struct JaegerBinary {
    path: PathBuf,
}

impl JaegerBinary {
    /// Finds `jaeger`, building it first (several minutes) if the cache has none for the
    /// current sources of `jaeger/`. A `jaeger` in `KUBE_TESTENV_BIN_DIR` is used instead.
    ///
    /// # Errors
    ///
    /// [`Error::GoMissing`] without a Go toolchain, [`Error::BuildFailed`] naming the build
    /// log when `go build` fails.
    pub fn ensure() -> Result<Self> {
        const BINARY: &str = "jaeger";
        if let Some(dir) = std::env::var_os("KUBE_TESTENV_BIN_DIR") {
            let path = PathBuf::from(dir).join(BINARY);
            if path.is_file() {
                return Ok(Self { path });
            }
        }
        let build = GoBuild {
            what: "Jaeger",
            takes: "several minutes",
            module: JAEGER_MODULE,
            sources: &["."],
            packages: &["github.com/jaegertracing/jaeger/cmd/jaeger"],
            binary: Some(BINARY),
            name: format!("jaeger-{JAEGER_VERSION}"),
            file_prefix: "jaeger-",
            ldflags: "-s -w".to_owned(),
        };
        Ok(Self {
            path: build.ensure()?.join(BINARY),
        })
    }

    /// The path of `jaeger`.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_jaeger_version_is_the_one_go_mod_requires() {
        let go_mod = include_str!("../jaeger/go.mod");
        let required = format!("github.com/jaegertracing/jaeger {JAEGER_VERSION}");
        assert!(
            go_mod
                .lines()
                .any(|line| line.trim().starts_with(&required)),
            "jaeger/go.mod does not require {required}"
        );
    }

    #[test]
    fn the_toxiproxy_version_is_the_one_go_mod_requires() {
        let go_mod = include_str!("../toxiproxy/go.mod");
        let required = format!("github.com/Shopify/toxiproxy/v2 {TOXIPROXY_VERSION}");
        assert!(
            go_mod
                .lines()
                .any(|line| line.trim().starts_with(&required)),
            "toxiproxy/go.mod does not require {required}"
        );
    }
}
