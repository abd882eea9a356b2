//! The paged list step: every page of a full list, streamed into the store.

use std::{
    collections::HashSet,
    hash::{BuildHasher, RandomState},
};

use futures::StreamExt;
use kube_core::Resource;
use tokio::time::Instant;
use tracing::{debug, info};

use super::{
    Reflector,
    shard::Listed,
    state::ListFrom,
    store::{ReflectorEvent, ReflectorStore},
};
use crate::{
    error::{Error, Verb, quoted_short},
    list_watch::{ListItem, ListOptions, ListWatch, RawObject, Shard, ShardMode},
};
use kube_client::api::VersionMatch;

impl<K, L, S> Reflector<K, L, S>
where
    K: Resource + Send + Sync + 'static,
    L: ListWatch<K>,
    S: ReflectorStore<K>,
{
    /// Lists every page into the store; returns the list's resourceVersion.
    pub(super) async fn list_all(&self, from: ListFrom, last_rv: &str) -> Result<String, Error> {
        let started = Instant::now();
        let (resource_version, version_match) = match from {
            ListFrom::Any => (Some("0".to_owned()), None),
            ListFrom::LastSeen if !last_rv.is_empty() => {
                (Some(last_rv.to_owned()), Some(VersionMatch::NotOlderThan))
            }
            ListFrom::LastSeen => (Some("0".to_owned()), None),
            ListFrom::Latest => (None, None),
        };
        debug!(rv = ?resource_version, "listing");
        let limit = Some(self.config.page_size).filter(|l| *l > 0);
        let shard = self.current_shard();
        // The selector the server is asked for: none for a field it cannot select on.
        let selector = shard
            .as_ref()
            .filter(|s| s.field().server_side())
            .map(Shard::selector);
        let mut options = ListOptions {
            limit,
            continue_token: None,
            resource_version,
            version_match,
            shard: shard.clone(),
        };
        // Whether every page said the server applied the shard.
        let mut applied_by_server = true;
        let mut listed = 0usize;
        let mut pages = 0usize;
        // The tokens followed so far, by hash: a page's worth of memory is eight bytes,
        // however long the server's tokens.
        let hasher = RandomState::new();
        let mut followed = HashSet::new();
        self.store.apply(ReflectorEvent::ListStart);
        let list_rv = loop {
            let mut page = self.lw.list_stream(&options).await?;
            pages += 1;
            let mut end = None;
            while let Some(item) = page.next().await {
                // As in the watch: let the handlers run while a buffered page is applied.
                tokio::task::coop::consume_budget().await;
                match item? {
                    ListItem::Object(obj) => {
                        if self.in_shard(&obj) {
                            listed += usize::from(self.list_one(obj, None));
                        }
                    }
                    ListItem::Decoded { object, raw } => {
                        if self.in_shard(&object) {
                            listed += usize::from(self.list_one(object, Some(raw)));
                        }
                    }
                    // Listed, so not gone: its last good state stays in the store.
                    ListItem::Undecodable(undecodable) => {
                        self.report(&self.undecodable(Verb::List, &undecodable));
                        listed += 1;
                        self.store
                            .apply(ReflectorEvent::ListedUndecodable(undecodable.key));
                    }
                    ListItem::End {
                        resource_version,
                        continue_token,
                        shard_selector,
                    } => {
                        applied_by_server &= selector.is_some() && shard_selector == selector;
                        end = Some((resource_version, continue_token));
                    }
                }
            }
            let Some((page_rv, continue_token)) = end else {
                return Err(Error::Decode {
                    resource: self.resource.clone(),
                    verb: Verb::List,
                    source: "the list page ended without its metadata".into(),
                });
            };
            match continue_token {
                // A real server's token moves past the page it ends; one that comes back
                // would have the list fetch the same pages for ever.
                Some(token) if !followed.insert(hasher.hash_one(&token)) => {
                    return Err(Error::ContinueLoop {
                        resource: self.resource.clone(),
                        token: quoted_short(&token),
                        pages,
                    });
                }
                Some(token) => {
                    options = ListOptions {
                        limit,
                        continue_token: Some(token),
                        resource_version: None,
                        version_match: None,
                        shard: shard.clone(),
                    };
                }
                None => break page_rv,
            }
        };
        // Before the store says it has synced, so whoever waited for that sees the mode.
        if let Some(shard) = &shard {
            let mode = if applied_by_server {
                ShardMode::Server
            } else {
                ShardMode::Client
            };
            if self.stats.set_shard_mode(mode) != Some(mode) {
                info!(?mode, selector = %shard, "shard applied");
            }
        }
        self.store.apply(ReflectorEvent::ListEnd(list_rv.clone()));
        self.synced.set(&list_rv);
        if let (Some(cell), Some(shard)) = (&self.shard, shard) {
            cell.set_listed(Listed {
                shard,
                resource_version: list_rv.clone(),
            });
        }
        info!(
            rv = %list_rv,
            objects = listed,
            pages,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "listed"
        );
        Ok(list_rv)
    }

    /// Stores one listed object; false (reported) for one without a name, which is skipped.
    fn list_one(&self, obj: K, raw: Option<RawObject>) -> bool {
        match self.prepare(obj, raw) {
            Ok((key, obj, raw)) => {
                self.store.apply(ReflectorEvent::Listed {
                    key,
                    object: obj,
                    raw,
                });
                true
            }
            Err(_) => {
                self.report(&Error::MalformedEvent {
                    resource: self.resource.clone(),
                    detail: "listed object has no metadata.name; skipped".to_owned(),
                });
                false
            }
        }
    }
}
