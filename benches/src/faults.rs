//! Faults both benchmark drivers force through kube-testenv's Toxiproxy: the cut during
//! which etcd is compacted (and kube-apiserver restarted), so that an informer watching
//! from before the cut gets `410 Gone` and must relist.

use std::future::Future;

use anyhow::Context;
use kube_testenv::{FaultProxy, TestEnv};

/// Cuts every proxy off (connections closed, new ones refused), runs `changes` (made
/// directly, not through the proxies), compacts etcd to its current revision and, if
/// `restart`, restarts kube-apiserver (without the restart its watch cache still serves
/// the old resourceVersion and nobody gets a 410; restarted, the cache starts past it),
/// then lets the proxies through again. Returns what `changes` returned and the Unix ns
/// of the moment the proxies were restored.
///
/// # Errors
///
/// When a proxy, the changes, the compaction or the restart fails; the proxies may then
/// still be cut (the caller resets them).
pub async fn cut_compacted<T, Fut>(
    env: &TestEnv,
    proxies: &[&FaultProxy],
    restart: bool,
    changes: Fut,
) -> anyhow::Result<(T, i64)>
where
    Fut: Future<Output = anyhow::Result<T>>,
{
    futures::future::try_join_all(proxies.iter().map(|p| p.cut()))
        .await
        .context("cutting the proxies")?;
    let changed = changes.await?;
    let revision = env.compact_etcd().await.context("compacting etcd")?;
    tracing::info!(revision, "etcd compacted");
    if restart {
        env.restart_apiserver()
            .await
            .context("restarting kube-apiserver")?;
    }
    let from = crate::unix_nanos();
    futures::future::try_join_all(proxies.iter().map(|p| p.restore()))
        .await
        .context("restoring the proxies")?;
    Ok((changed, from))
}
