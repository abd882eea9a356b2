//! The control plane's binaries: found in a cache, or built from the Go module
//! in this crate's `go/` directory.
//!
//! The cache key is a hash of everything that determines the build (the Go
//! sources, `go.mod`, `go.sum` and the Go toolchain's version), so the binaries
//! are rebuilt exactly when one of those changes. A file lock serialises
//! concurrent builds, e.g. of several test binaries started at once.

use std::{
    fs::{self, File},
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use sha2::{Digest, Sha256};

use crate::{Error, Result};

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
        let module = Path::new(GO_MODULE);
        let go_version = go_version(module)?;
        let key = source_hash(module, &go_version)?;
        let root = cache_root();
        let dir = root.join(format!("{KUBERNETES_VERSION}-{}", &key[..16]));
        let binaries = Self { dir };
        if binaries.complete() {
            return Ok(binaries);
        }
        fs::create_dir_all(&root).map_err(Error::io("creating the cache directory", &root))?;
        let lock_path = root.join("build.lock");
        let lock = File::create(&lock_path).map_err(Error::io("creating", &lock_path))?;
        lock.lock().map_err(Error::io("locking", &lock_path))?;
        // Another process may have finished the build while this one waited.
        if !binaries.complete() {
            build(
                module,
                &binaries.dir,
                &root.join(format!("build-{}.log", &key[..16])),
            )?;
        }
        Ok(binaries)
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

    fn complete(&self) -> bool {
        self.dir.join(".complete").is_file()
    }
}

fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("KUBE_TESTENV_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("kube-testenv")
}

fn go_version(module: &Path) -> Result<String> {
    let output = Command::new("go")
        .args(["env", "GOVERSION"])
        .current_dir(module)
        .output()
        .map_err(|_| Error::GoMissing {
            module: module.to_owned(),
        })?;
    if !output.status.success() {
        return Err(Error::GoMissing {
            module: module.to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// Hashes the files that determine the build, in a stable order.
fn source_hash(module: &Path, go_version: &str) -> Result<String> {
    let mut files = vec![module.join("go.mod"), module.join("go.sum")];
    collect_go_files(&module.join("cmd"), &mut files)?;
    files.sort();
    let mut hasher = Sha256::new();
    hasher.update(go_version.as_bytes());
    for file in files {
        let relative = file.strip_prefix(module).unwrap_or(&file);
        hasher.update(relative.to_string_lossy().as_bytes());
        hasher.update(fs::read(&file).map_err(Error::io("reading", &file))?);
    }
    Ok(hex::encode(hasher.finalize()))
}

fn collect_go_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir).map_err(Error::io("listing", dir))? {
        let path = entry.map_err(Error::io("listing", dir))?.path();
        if path.is_dir() {
            collect_go_files(&path, out)?;
        } else if path.extension().is_some_and(|ext| ext == "go") {
            out.push(path);
        }
    }
    Ok(())
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

/// Runs `go build`, reporting progress as packages compile.
fn build(module: &Path, out_dir: &Path, log_path: &Path) -> Result<()> {
    let started = Instant::now();
    let total = Command::new("go")
        .args(["list", "-deps", "./cmd/..."])
        .current_dir(module)
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| o.stdout.iter().filter(|b| **b == b'\n').count())
        .unwrap_or(0);
    tracing::info!(
        version = KUBERNETES_VERSION,
        packages = total,
        log = %log_path.display(),
        "building the control plane from Go modules (first time only; takes several minutes)"
    );
    let staging = out_dir.with_extension("partial");
    let _ = fs::remove_dir_all(&staging);
    fs::create_dir_all(&staging).map_err(Error::io("creating", &staging))?;
    let mut log = File::create(log_path).map_err(Error::io("creating the build log", log_path))?;
    let mut child = Command::new("go")
        .args(["build", "-v", "-trimpath", "-ldflags", &ldflags(), "-o"])
        .arg(&staging)
        .arg("./cmd/...")
        .current_dir(module)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|_| Error::GoMissing {
            module: module.to_owned(),
        })?;
    let stderr = child.stderr.take().expect("stderr is piped");
    let mut compiled = 0usize;
    let mut reported = 0usize;
    for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
        use std::io::Write;
        let _ = writeln!(log, "{line}");
        compiled += 1;
        let percent = (compiled * 100).checked_div(total).unwrap_or(0).min(99);
        if percent >= reported + 10 {
            reported = percent - percent % 10;
            tracing::info!(
                compiled,
                total,
                elapsed_s = started.elapsed().as_secs(),
                "building the control plane: {percent}%"
            );
        }
    }
    let status = child
        .wait()
        .map_err(Error::io("waiting for go build in", module))?;
    if !status.success() {
        return Err(Error::BuildFailed {
            status: status.to_string(),
            log: log_path.to_owned(),
        });
    }
    fs::write(staging.join(".complete"), KUBERNETES_VERSION)
        .map_err(Error::io("writing", staging.join(".complete")))?;
    let _ = fs::remove_dir_all(out_dir);
    fs::rename(&staging, out_dir).map_err(Error::io("moving the build to", out_dir))?;
    tracing::info!(
        dir = %out_dir.display(),
        elapsed_s = started.elapsed().as_secs(),
        "control plane built"
    );
    Ok(())
}
