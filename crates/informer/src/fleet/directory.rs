//! [`KubeconfigDirectory`]: a cluster per kubeconfig file in a directory.

use std::{
    collections::{BTreeMap, HashSet},
    path::{Path, PathBuf},
    time::Duration,
};

use tokio_util::sync::CancellationToken;

use super::{
    ClusterEvents, ClusterName, ClusterProvider, FleetError, channel_stream,
    kubeconfig::{Announced, MAX_KUBECONFIG_BYTES},
};

/// The clusters of a directory of kubeconfig files, one per file, named after the file
/// without its extension (`eu-west.yaml` is `eu-west`); hidden files (`.name`) are skipped,
/// as are the `..data` links a mounted Secret or ConfigMap has. The directory is read
/// again every [`poll_every`](Self::poll_every) (2 s by default), so a file added,
/// rewritten (a rotated credential) or removed is announced within that.
///
/// Each file's current context is used.
///
/// ```no_run
/// use std::time::Duration;
/// use kube_informer::{CancellationToken, fleet::{ClusterProvider, KubeconfigDirectory}};
///
/// let clusters = KubeconfigDirectory::new("/etc/fleet")
///     .poll_every(Duration::from_secs(10))
///     .events(CancellationToken::new());
/// ```
#[derive(Clone, Debug)]
pub struct KubeconfigDirectory {
    path: PathBuf,
    every: Duration,
}

impl KubeconfigDirectory {
    /// The kubeconfigs in `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            every: Duration::from_secs(2),
        }
    }

    /// How often the directory is read again (2 s by default).
    #[must_use]
    pub fn poll_every(mut self, every: Duration) -> Self {
        self.every = every;
        self
    }
}

impl ClusterProvider for KubeconfigDirectory {
    fn events(self, cancel: CancellationToken) -> ClusterEvents {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut announced = Announced::new(tx);
            let mut duplicates = HashSet::new();
            // The last failure to read the directory, reported once until it changes.
            let mut failing: Option<String> = None;
            loop {
                match files(&self.path).await {
                    Ok(files) => {
                        failing = None;
                        read_all(&mut announced, &mut duplicates, files).await;
                    }
                    Err(error) => {
                        let text = error.to_string();
                        if failing.as_ref() != Some(&text) {
                            tracing::warn!(path = %self.path.display(), %error, "cannot read the kubeconfig directory");
                            failing = Some(text);
                            announced.source_failed(FleetError::Directory {
                                path: self.path.display().to_string(),
                                source: error,
                            });
                        }
                    }
                }
                if announced.is_closed() {
                    return;
                }
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(self.every) => {}
                }
            }
        });
        channel_stream(rx)
    }
}

/// Announces what changed in the directory's reading, and what went.
/// `duplicates` holds the files refused for a name another file gives, each reported once
/// while it lasts.
async fn read_all(
    announced: &mut Announced,
    duplicates: &mut HashSet<PathBuf>,
    files: BTreeMap<ClusterName, Vec<File>>,
) {
    duplicates.retain(|path| files.values().flatten().any(|f| &f.path == path));
    for (name, files) in &files {
        let (kept, others) = files.split_first().expect("a name has a file");
        duplicates.retain(|path| path != &kept.path);
        for other in others {
            if duplicates.insert(other.path.clone()) {
                announced.source_failed(FleetError::DuplicateName {
                    name: name.to_string(),
                    kept: kept.path.display().to_string(),
                    refused: other.path.display().to_string(),
                });
            }
        }
        let origin = kept.path.display().to_string();
        match &kept.text {
            Ok(text) => announced.kubeconfig(name.clone(), text, &origin).await,
            // Removed between the listing and the read: the next reading sees it gone.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => announced.unreadable(name.clone(), &origin, &error.to_string()),
        }
    }
    let gone: Vec<ClusterName> = announced
        .names()
        .filter(|name| !files.contains_key(*name))
        .cloned()
        .collect();
    for name in &gone {
        announced.removed(name);
    }
}

/// One kubeconfig file as read.
struct File {
    path: PathBuf,
    /// Its bytes, at most one past the kubeconfig limit (so an oversized file is refused
    /// without being held); only the first file of a name is read.
    text: std::io::Result<Vec<u8>>,
}

/// The directory's kubeconfig files by cluster name, each name's files in name order, off
/// the runtime's threads.
async fn files(dir: &Path) -> std::io::Result<BTreeMap<ClusterName, Vec<File>>> {
    let dir = dir.to_owned();
    tokio::task::spawn_blocking(move || read_directory(&dir))
        .await
        .map_err(std::io::Error::other)?
}

fn read_directory(dir: &Path) -> std::io::Result<BTreeMap<ClusterName, Vec<File>>> {
    let mut paths: BTreeMap<ClusterName, Vec<PathBuf>> = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let file_name = entry.file_name();
        let Some(file_name) = file_name.to_str() else {
            continue;
        };
        if file_name.starts_with('.') {
            continue;
        }
        // A link is followed: a mounted Secret's files are links into `..data`.
        if !std::fs::metadata(entry.path()).is_ok_and(|meta| meta.is_file()) {
            continue;
        }
        paths
            .entry(cluster_name(file_name))
            .or_default()
            .push(entry.path());
    }
    Ok(paths
        .into_iter()
        .map(|(name, mut paths)| {
            paths.sort();
            let files = paths
                .into_iter()
                .enumerate()
                .map(|(i, path)| {
                    let text = if i == 0 {
                        read_bounded(&path)
                    } else {
                        Ok(Vec::new())
                    };
                    File { path, text }
                })
                .collect();
            (name, files)
        })
        .collect())
}

fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut text = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_KUBECONFIG_BYTES as u64 + 1)
        .read_to_end(&mut text)?;
    Ok(text)
}

/// `eu-west.yaml` is `eu-west`; a name without a kubeconfig extension is kept whole.
fn cluster_name(file_name: &str) -> ClusterName {
    let stem = [".yaml", ".yml", ".json", ".kubeconfig", ".conf"]
        .iter()
        .find_map(|ext| file_name.strip_suffix(ext))
        .filter(|stem| !stem.is_empty())
        .unwrap_or(file_name);
    ClusterName::from(stem)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_names_its_cluster_without_its_extension() {
        assert_eq!(cluster_name("eu-west.yaml").as_str(), "eu-west");
        assert_eq!(cluster_name("edge-7.kubeconfig").as_str(), "edge-7");
        assert_eq!(cluster_name("plain").as_str(), "plain");
        assert_eq!(cluster_name(".yaml").as_str(), ".yaml");
        assert_eq!(cluster_name("a.b.yml").as_str(), "a.b");
    }
}
