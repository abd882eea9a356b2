//! Go modules built once into a cache, shared by the control plane
//! ([`Binaries`](crate::Binaries)) and Toxiproxy
//! ([`ToxiproxyBinary`](crate::ToxiproxyBinary)).
//!
//! The cache key is a hash of everything that determines a build (the Go
//! sources, `go.mod`, `go.sum` and the Go toolchain's version), so a module is
//! rebuilt exactly when one of those changes. A file lock per module
//! serialises concurrent builds, e.g. of several test binaries started at once.

use std::{
    fs::{self, File},
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// One Go module and how to build it into a cache directory.
#[derive(Debug)]
pub(crate) struct GoBuild {
    /// What is built, for logs and errors: "the control plane".
    pub(crate) what: &'static str,
    /// How long a first build takes here, for the log line that starts one.
    pub(crate) takes: &'static str,
    /// The module's directory.
    pub(crate) module: &'static str,
    /// Directories of the module whose `.go` files are hashed with `go.mod`
    /// and `go.sum`.
    pub(crate) sources: &'static [&'static str],
    /// The packages handed to `go build`.
    pub(crate) packages: &'static [&'static str],
    /// The binary's name when a single package is built; without it `go build
    /// -o <dir>` names each binary after its package's directory.
    pub(crate) binary: Option<&'static str>,
    /// Starts the cache directory's name (`<name>-<key>`) and is written into
    /// its completion marker.
    pub(crate) name: String,
    /// Starts the names of the lock and build log in the cache root, so
    /// modules neither wait for each other's builds nor share a log.
    pub(crate) file_prefix: &'static str,
    /// `go build -ldflags`.
    pub(crate) ldflags: String,
}

impl GoBuild {
    /// The cache directory holding the module's binaries, built first if the
    /// cache has none for the current sources.
    ///
    /// # Errors
    ///
    /// [`Error::GoMissing`] without a Go toolchain, [`Error::BuildFailed`]
    /// naming the build log when `go build` fails.
    pub(crate) fn ensure(&self) -> Result<PathBuf> {
        let module = Path::new(self.module);
        let go_version = self.go_version()?;
        let key = source_hash(module, self.sources, &go_version)?;
        let key = &key[..16];
        let root = cache_root();
        let dir = root.join(format!("{}-{key}", self.name));
        if complete(&dir) {
            return Ok(dir);
        }
        fs::create_dir_all(&root).map_err(Error::io("creating the cache directory", &root))?;
        let lock_path = root.join(format!("{}build.lock", self.file_prefix));
        let lock = File::create(&lock_path).map_err(Error::io("creating", &lock_path))?;
        lock.lock().map_err(Error::io("locking", &lock_path))?;
        // Another process may have finished the build while this one waited.
        if !complete(&dir) {
            let log = root.join(format!("{}build-{key}.log", self.file_prefix));
            self.build(&dir, &log)?;
        }
        Ok(dir)
    }

    fn go_missing(&self) -> Error {
        Error::GoMissing {
            what: self.what,
            module: PathBuf::from(self.module),
        }
    }

    fn go_version(&self) -> Result<String> {
        let output = Command::new("go")
            .args(["env", "GOVERSION"])
            .current_dir(self.module)
            .output()
            .map_err(|_| self.go_missing())?;
        if !output.status.success() {
            return Err(self.go_missing());
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }

    /// Runs `go build`, reporting progress as packages compile, into a staging
    /// directory that becomes `out_dir` only once complete.
    fn build(&self, out_dir: &Path, log_path: &Path) -> Result<()> {
        let module = Path::new(self.module);
        let started = Instant::now();
        let total = Command::new("go")
            .args(["list", "-deps"])
            .args(self.packages)
            .current_dir(module)
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| o.stdout.iter().filter(|b| **b == b'\n').count())
            .unwrap_or(0);
        tracing::info!(
            what = self.what,
            name = %self.name,
            packages = total,
            log = %log_path.display(),
            "building {} from Go modules (first time only; takes {})",
            self.what,
            self.takes
        );
        // Appended, not `with_extension`: the name's dots are a version's.
        let mut staging = out_dir.as_os_str().to_owned();
        staging.push(".partial");
        let staging = PathBuf::from(staging);
        let _ = fs::remove_dir_all(&staging);
        fs::create_dir_all(&staging).map_err(Error::io("creating", &staging))?;
        let output = match self.binary {
            Some(binary) => staging.join(binary),
            None => staging.clone(),
        };
        let mut log =
            File::create(log_path).map_err(Error::io("creating the build log", log_path))?;
        let mut child = Command::new("go")
            .args(["build", "-v", "-trimpath", "-ldflags", &self.ldflags, "-o"])
            .arg(&output)
            .args(self.packages)
            .current_dir(module)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|_| self.go_missing())?;
        let stderr = child.stderr.take().expect("stderr is piped");
        let mut compiled = 0usize;
        let mut reported = 0usize;
        for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
            let _ = writeln!(log, "{line}");
            compiled += 1;
            let percent = (compiled * 100).checked_div(total).unwrap_or(0).min(99);
            if percent >= reported + 10 {
                reported = percent - percent % 10;
                tracing::info!(
                    what = self.what,
                    compiled,
                    total,
                    elapsed_s = started.elapsed().as_secs(),
                    "building {}: {percent}%",
                    self.what
                );
            }
        }
        let status = child
            .wait()
            .map_err(Error::io("waiting for go build in", module))?;
        if !status.success() {
            return Err(Error::BuildFailed {
                what: self.what,
                status: status.to_string(),
                log: log_path.to_owned(),
            });
        }
        let marker = staging.join(".complete");
        fs::write(&marker, &self.name).map_err(Error::io("writing", &marker))?;
        let _ = fs::remove_dir_all(out_dir);
        fs::rename(&staging, out_dir).map_err(Error::io("moving the build to", out_dir))?;
        tracing::info!(
            what = self.what,
            dir = %out_dir.display(),
            elapsed_s = started.elapsed().as_secs(),
            "{} built",
            self.what
        );
        Ok(())
    }
}

fn complete(dir: &Path) -> bool {
    dir.join(".complete").is_file()
}

/// `KUBE_TESTENV_CACHE_DIR`, else `$XDG_CACHE_HOME/kube-testenv` or
/// `~/.cache/kube-testenv`.
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

/// Hashes the files that determine the build, in a stable order.
///
/// The control plane's binaries are cached under this hash, so any change to
/// what it covers or how forces everyone to rebuild them (minutes): keep it
/// byte for byte.
fn source_hash(module: &Path, sources: &[&str], go_version: &str) -> Result<String> {
    let mut files = vec![module.join("go.mod"), module.join("go.sum")];
    for dir in sources {
        collect_go_files(&module.join(dir), &mut files)?;
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_covers_go_files_in_subdirectories_and_the_toolchain() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("go.mod"), "module m\n").unwrap();
        fs::write(dir.path().join("go.sum"), "").unwrap();
        let base = source_hash(dir.path(), &["."], "go1.26.0").unwrap();
        assert_ne!(base, source_hash(dir.path(), &["."], "go1.26.1").unwrap());

        fs::create_dir(dir.path().join("cmd")).unwrap();
        fs::write(dir.path().join("cmd/main.go"), "package main\n").unwrap();
        fs::write(dir.path().join("cmd/README"), "not Go\n").unwrap();
        let with_main = source_hash(dir.path(), &["."], "go1.26.0").unwrap();
        assert_ne!(base, with_main);
        assert_eq!(
            with_main,
            source_hash(dir.path(), &["cmd"], "go1.26.0").unwrap()
        );
    }
}
