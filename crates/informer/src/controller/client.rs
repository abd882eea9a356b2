//! The controller's client: writes to the API server that the controller's reads of its
//! caches then wait to see. The full documentation is on [`ControllerClient`].

use std::{fmt::Debug, sync::Arc, time::Duration};

use either::Either;
use kube_client::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use kube_core::Resource;
use serde::{Serialize, de::DeserializeOwned};

use super::own_writes::{Cache, Caches, NotObserved, OwnWrites, ResourceVersion, Written};
use crate::{
    apply::{Applier, ApplyError, Conflicts},
    error::{Error, server_says},
    informer::FactoryScope,
    key::ObjectKey,
    store::{Selector, Store},
};

/// Why a [`ControllerClient`] read or write failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The API server refused the write or did not answer.
    #[error("{verb} {kind} {key}: {}", server_says(source))]
    Api {
        /// `create`, `replace`, `patch`, `delete`, or the status variants.
        verb: &'static str,
        /// The object's kind.
        kind: String,
        /// The object's key.
        key: String,
        /// The client's error (its status code says why: 409 for AlreadyExists and
        /// Conflict, 404 for NotFound).
        #[source]
        source: Box<kube_client::Error>,
    },
    /// A server-side apply failed.
    #[error(transparent)]
    Apply(#[from] ApplyError),
    /// The cache did not observe the controller's write to `key` within the
    /// [timeout](OwnWrites::Awaited): the watch lags, or it broke and is relisting. The
    /// reconcile fails, and its error policy retries it.
    #[error("{kind} {key}: the cache has not observed this controller's {write} after {waited:?}")]
    NotObserved {
        /// The object's kind.
        kind: String,
        /// The key written and not yet observed.
        key: ObjectKey,
        /// Which write: its resourceVersion, or the deletion's UID.
        write: String,
        /// How long the read waited.
        waited: Duration,
    },
    /// The controller stopped while the read waited.
    #[error(
        "read of {kind} cancelled while waiting for the cache to observe this controller's writes"
    )]
    Cancelled {
        /// The kind read.
        kind: String,
    },
    /// The informer stopped before its cache observed the writes a read waited for.
    #[error("the {kind} informer stopped before its cache observed this controller's writes")]
    CacheStopped {
        /// The kind read.
        kind: String,
    },
    /// The controller has no informer of the kind read: give it one (its primary, or an
    /// [`owns`](crate::Controller::owns) or [`watches`](crate::Controller::watches)
    /// source).
    #[error("this controller has no informer of {kind}; add one (owns, watches) to read it")]
    NoCache {
        /// The kind read.
        kind: String,
    },
    /// The object cannot be written as it is.
    #[error("cannot {verb} {kind}: {reason}")]
    Invalid {
        /// The write.
        verb: &'static str,
        /// The object's kind.
        kind: String,
        /// What is missing.
        reason: &'static str,
    },
    /// A read by an index the informer does not have.
    #[error(transparent)]
    Index(Error),
    /// [`confirm_cached`](ControllerClient::confirm_cached): the cache's view of the object
    /// is not the server's. A disruptive action taken on it would act on a world that is
    /// gone; the next event brings the cache's new view.
    #[error(
        "the cache's view of {kind} {key} is stale: cached {cached}, live {live}; not acting on it"
    )]
    StaleCache {
        /// The object's kind.
        kind: String,
        /// The object's key.
        key: ObjectKey,
        /// What the cache holds (`absent`, or the uid and resourceVersion).
        cached: String,
        /// What the server holds.
        live: String,
    },
}

impl ClientError {
    /// The HTTP status the API server answered with, if it answered: 409 for
    /// AlreadyExists and Conflict, 404 for NotFound, 403 for a missing permission.
    pub fn status_code(&self) -> Option<u16> {
        let source: &kube_client::Error = match self {
            ClientError::Api { source, .. } => source,
            ClientError::Apply(ApplyError::Api { source, .. }) => source,
            ClientError::Apply(ApplyError::Conflict { .. }) => return Some(409),
            _ => return None,
        };
        match source {
            kube_client::Error::Api(status) => Some(status.code),
            _ => None,
        }
    }

    /// Whether the API server answered 404 Not Found: the object (or its namespace) is
    /// gone, which a reconcile usually takes as done.
    pub fn is_not_found(&self) -> bool {
        self.status_code() == Some(404)
    }
}

/// What a [`ControllerClient`] writes: a typed resource the API server stores.
pub trait Writable:
    Resource<DynamicType = (), Scope: FactoryScope>
    + Serialize
    + DeserializeOwned
    + Clone
    + Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> Writable for K where
    K: Resource<DynamicType = (), Scope: FactoryScope>
        + Serialize
        + DeserializeOwned
        + Clone
        + Debug
        + Send
        + Sync
        + 'static
{
}

/// A controller's client: it writes to the API server and reads the controller's caches
/// (its informers: the primary's, and those of its [`owns`](crate::Controller::owns) and
/// [`watches`](crate::Controller::watches) sources; the first of each type), and a read
/// waits until the cache has observed what this client wrote to the keys it reads. From
/// [`Controller::client`](crate::Controller::client); cheap to clone, so it lives in the
/// reconcile's context.
///
/// Without it, the reconcile that follows a write (often milliseconds later: the write's
/// own event, or the next of a burst of updates, enqueues the key again) reads the cache
/// as it was before the write, and creates a child that already exists, updates from a
/// stale resourceVersion (a Conflict) or decides twice.
///
/// # What is guaranteed
///
/// - After a create, update, patch, apply or status write through this client returns,
///   a [`get`](Self::get) of that key returns that object or a later state of it, and a
///   [`list`](Self::list) of its type holds it or a later state (for every key of the type
///   the client wrote). A later state may be someone else's write: any version at or past
///   the one the server answered with releases the read.
/// - After a [`delete`](Self::delete), reads do not return the deleted object (by UID; an
///   object with finalizers is deleted once they are gone, and reads return it with its
///   deletion timestamp until then).
/// - A read waits at most the [`OwnWrites::Awaited`] timeout (10 s by default), and fails
///   with [`ClientError::NotObserved`] naming the write; a cancelled reconcile's read fails
///   with [`ClientError::Cancelled`], and one of a stopped informer with
///   [`ClientError::CacheStopped`]. A relist that passes the version releases the read as
///   an event would.
///
/// # What is not
///
/// - Writes by other clients, other controllers' clients or other replicas: a read waits
///   only for this client's writes (and its clones').
/// - Reads of the stores themselves ([`store`](Self::store),
///   [`Controller::store`](crate::Controller::store), an informer's): they never wait. A
///   read that does not need the guarantee (a list of everything for a report) reads the
///   store.
/// - A type with several informers in the controller: reads use the first one. A write
///   that takes an object out of that informer's scope (a label its selector excludes)
///   is observed as the delete event the informer gets.
/// - Writes of a type the controller has no informer of are sent and not recorded.
///
/// # Beside controller-runtime
///
/// controller-runtime v0.25's `EnableReadYourWritesConsistency` (experimental, off by
/// default) does the same for its cache-backed client. Here it is on by default and can be
/// turned off per controller ([`Controller::own_writes`](crate::Controller::own_writes));
/// a read that does not need it reads the store instead, so a list for a report does not
/// wait behind the controller's writes; and the records are per controller, not per
/// manager.
///
/// ```no_run
/// use std::sync::Arc;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube_informer::{
///     Action, CancellationToken, ClientError, Controller, ControllerClient, InformerFactory,
///     ObjectKey, ReconcileRequest, Scope, retry_with_backoff,
/// };
///
/// # async fn doc(factory: InformerFactory) -> Result<(), kube_informer::Error> {
/// let scope = || Scope::namespace("web").labels("app=demo");
/// let controller = Controller::new("parents", factory.informer::<ConfigMap>(scope()));
/// let client = controller.client(factory.client());
/// let cancel = CancellationToken::new();
/// factory.start(&cancel);
/// let reconcile = |request: ReconcileRequest<ConfigMap>, client: Arc<ControllerClient>| async move {
///     let ReconcileRequest::Present(parent) = request else { return Ok(Action::done()) };
///     let key = ObjectKey::from_object(&*parent).expect("cached objects have names");
///     // Waits until the cache holds what this client last wrote to the key.
///     if let Some(current) = client.get::<ConfigMap>(&key).await? {
///         let mut next = (*current).clone();
///         next.data.get_or_insert_default().insert("seen".into(), "yes".into());
///         client.replace(&next).await?;
///     }
///     Ok::<_, ClientError>(Action::done())
/// };
/// controller.run((reconcile, retry_with_backoff(), Arc::new(client)), cancel).await
/// # }
/// ```
#[derive(Clone)]
pub struct ControllerClient {
    client: Client,
    caches: Arc<Caches>,
    applier: Applier,
}

impl Debug for ControllerClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerClient")
            .field("field_manager", &self.applier.manager())
            .field("caches", &self.caches)
            .finish_non_exhaustive()
    }
}

impl ControllerClient {
    pub(super) fn new(client: Client, caches: Arc<Caches>, field_manager: &str) -> Self {
        Self {
            applier: Applier::new(client.clone(), field_manager),
            client,
            caches,
        }
    }

    /// The Kubernetes client it writes with, for what it does not cover.
    pub fn kube_client(&self) -> &Client {
        &self.client
    }

    /// The controller's cache of `C`, read as it is: reads of the store never wait.
    pub fn store<C: Resource + Send + Sync + 'static>(&self) -> Option<Store<C>> {
        Some(self.caches.cache::<C>()?.handle().store())
    }

    /// A guard before a disruptive action (a delete, a scale-down) decided on the cache's
    /// word about `key`: that it holds this object, or that there is none. When the cache
    /// of `C` is known to be at most `bound` behind the server (its informer's
    /// [staleness probe](crate::informer::InformerBuilder::staleness_probe) says so), it
    /// returns at once and costs nothing. Otherwise (further behind, or no probe to say)
    /// it reads the object live and compares: the same object (uid and resourceVersion),
    /// or absent on both sides, passes; anything else is refused with
    /// [`ClientError::StaleCache`] and logged, and the reconcile, failing, is retried once
    /// the cache has caught up.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    /// # use kube_informer::{ClientError, ControllerClient, ObjectKey};
    /// # async fn doc(client: ControllerClient, child: ObjectKey, owner: ObjectKey) -> Result<(), ClientError> {
    /// // The cache says the owner is gone: make sure before deleting the orphan.
    /// client.confirm_cached::<Secret>(&owner, Duration::from_secs(5)).await?;
    /// client.delete::<ConfigMap>(&child).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`ClientError::StaleCache`]; [`ClientError::NoCache`] without an informer of `C`;
    /// [`ClientError::Api`] when the live read fails.
    pub async fn confirm_cached<C: Writable>(
        &self,
        key: &ObjectKey,
        bound: Duration,
    ) -> Result<(), ClientError> {
        let kind = || C::kind(&()).into_owned();
        let cache = self
            .caches
            .cache::<C>()
            .ok_or_else(|| ClientError::NoCache { kind: kind() })?;
        let handle = cache.handle();
        if handle.staleness().is_some_and(|s| s.behind <= bound) {
            return Ok(());
        }
        let cached = handle.store().get_by_key(key);
        let api = self.api_at::<C>(key, "get")?;
        let live = api
            .get_opt(key.name())
            .await
            .map_err(|source| api_error::<C>("get", key, source))?;
        let version =
            |meta: &kube_core::ObjectMeta| (meta.uid.clone(), meta.resource_version.clone());
        let same = match (&cached, &live) {
            (None, None) => true,
            (Some(cached), Some(live)) => version(cached.meta()) == version(live.meta()),
            _ => false,
        };
        if same {
            return Ok(());
        }
        let describe = |meta: Option<&kube_core::ObjectMeta>| match meta {
            None => "absent".to_owned(),
            Some(meta) => format!(
                "uid {} at resourceVersion {}",
                meta.uid.as_deref().unwrap_or("?"),
                meta.resource_version.as_deref().unwrap_or("?")
            ),
        };
        let error = ClientError::StaleCache {
            kind: kind(),
            key: key.clone(),
            cached: describe(cached.as_deref().map(Resource::meta)),
            live: describe(live.as_ref().map(Resource::meta)),
        };
        tracing::warn!(behind = ?handle.staleness().map(|s| s.behind), %error, "refused an action on a stale cache");
        Err(error)
    }

    /// The cached object at `key`, once the cache has observed this client's writes to it.
    ///
    /// # Errors
    ///
    /// [`ClientError::NoCache`], [`ClientError::NotObserved`],
    /// [`ClientError::Cancelled`], [`ClientError::CacheStopped`].
    pub async fn get<C: Resource<DynamicType = ()> + Send + Sync + 'static>(
        &self,
        key: &ObjectKey,
    ) -> Result<Option<Arc<C>>, ClientError> {
        let cache = self.observed::<C>(Some(key)).await?;
        Ok(cache.handle().store().get_by_key(key))
    }

    /// Every cached object of `C`, once the cache has observed this client's writes to
    /// any of them.
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get).
    pub async fn list<C: Resource<DynamicType = ()> + Send + Sync + 'static>(
        &self,
    ) -> Result<Vec<Arc<C>>, ClientError> {
        let cache = self.observed::<C>(None).await?;
        Ok(cache.handle().store().list())
    }

    /// The cached objects of `C` that match `selector`, once the cache has observed this
    /// client's writes to objects of `C`.
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get).
    pub async fn list_selector<C: Resource<DynamicType = ()> + Send + Sync + 'static>(
        &self,
        selector: &Selector,
    ) -> Result<Vec<Arc<C>>, ClientError> {
        let cache = self.observed::<C>(None).await?;
        Ok(cache.handle().store().list_selector(selector))
    }

    /// The cached objects of `C` whose index `index` holds `value`, once the cache has
    /// observed this client's writes to objects of `C`.
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get), and [`ClientError::Index`] for an index the informer does
    /// not have.
    pub async fn by_index<C: Resource<DynamicType = ()> + Send + Sync + 'static>(
        &self,
        index: &str,
        value: &str,
    ) -> Result<Vec<Arc<C>>, ClientError> {
        let cache = self.observed::<C>(None).await?;
        cache
            .handle()
            .store()
            .by_index(index, value)
            .map_err(ClientError::Index)
    }

    async fn observed<C: Resource<DynamicType = ()> + Send + Sync + 'static>(
        &self,
        key: Option<&ObjectKey>,
    ) -> Result<Arc<Cache<C>>, ClientError> {
        let kind = || C::kind(&()).into_owned();
        let cache = self
            .caches
            .cache::<C>()
            .ok_or_else(|| ClientError::NoCache { kind: kind() })?;
        match self.caches.observe(&cache, key).await {
            Ok(()) => Ok(cache),
            Err(NotObserved::TimedOut {
                key,
                written,
                waited,
            }) => Err(ClientError::NotObserved {
                kind: kind(),
                key,
                write: written.to_string(),
                waited,
            }),
            Err(NotObserved::Cancelled) => Err(ClientError::Cancelled { kind: kind() }),
            Err(NotObserved::Stopped) => Err(ClientError::CacheStopped { kind: kind() }),
        }
    }

    /// Creates `obj` (as the controller's field manager) and returns it as stored.
    ///
    /// # Errors
    ///
    /// [`ClientError::Api`] (409 when it exists already); [`ClientError::Invalid`] for an
    /// object without a name, or a namespaced one without a namespace.
    pub async fn create<C: Writable>(&self, obj: &C) -> Result<C, ClientError> {
        let (api, key) = self.api_for(obj, "create")?;
        let stored = api.create(&self.post_params(), obj).await;
        self.stored("create", key, stored)
    }

    /// Replaces `obj` (an update: its resourceVersion must be current) and returns it as
    /// stored.
    ///
    /// # Errors
    ///
    /// As [`create`](Self::create); 409 when the resourceVersion is stale.
    pub async fn replace<C: Writable>(&self, obj: &C) -> Result<C, ClientError> {
        let (api, key) = self.api_for(obj, "replace")?;
        let stored = api.replace(key.name(), &self.post_params(), obj).await;
        self.stored("replace", key, stored)
    }

    /// Replaces `obj`'s status (its resourceVersion must be current) and returns the object
    /// as stored.
    ///
    /// # Errors
    ///
    /// As [`replace`](Self::replace).
    pub async fn replace_status<C: Writable>(&self, obj: &C) -> Result<C, ClientError> {
        let (api, key) = self.api_for(obj, "replace status of")?;
        let stored = api
            .replace_status(key.name(), &self.post_params(), obj)
            .await;
        self.stored("replace status of", key, stored)
    }

    /// Patches the object at `key` and returns it as stored.
    ///
    /// # Errors
    ///
    /// [`ClientError::Api`]; [`ClientError::Invalid`] for a namespaced kind's key without
    /// a namespace.
    pub async fn patch<C: Writable, P: Serialize + Debug>(
        &self,
        key: &ObjectKey,
        patch: &Patch<P>,
    ) -> Result<C, ClientError> {
        let api = self.api_at::<C>(key, "patch")?;
        let stored = api.patch(key.name(), &self.patch_params(), patch).await;
        self.stored("patch", key.clone(), stored)
    }

    /// Patches the status of the object at `key` and returns it as stored.
    ///
    /// # Errors
    ///
    /// As [`patch`](Self::patch).
    pub async fn patch_status<C: Writable, P: Serialize + Debug>(
        &self,
        key: &ObjectKey,
        patch: &Patch<P>,
    ) -> Result<C, ClientError> {
        let api = self.api_at::<C>(key, "patch status of")?;
        let stored = api
            .patch_status(key.name(), &self.patch_params(), patch)
            .await;
        self.stored("patch status of", key.clone(), stored)
    }

    /// Deletes the object at `key`. Reads then do not return it: the object that was
    /// deleted (by UID) once the cache has seen it go, or, for an object that finalizers
    /// keep, its state with the deletion timestamp set.
    ///
    /// # Errors
    ///
    /// As [`patch`](Self::patch); 404 when there is no such object.
    pub async fn delete<C: Writable>(&self, key: &ObjectKey) -> Result<(), ClientError> {
        let api = self.api_at::<C>(key, "delete")?;
        let deleted = api
            .delete(key.name(), &DeleteParams::default())
            .await
            .map_err(|source| api_error::<C>("delete", key, source))?;
        match deleted {
            Either::Left(kept) => self.record_version(key.clone(), &kept),
            Either::Right(status) => {
                let uid = status.details.map(|d| d.uid).filter(|uid| !uid.is_empty());
                // A status without the UID: the cached object is the one deleted.
                let uid = uid.or_else(|| {
                    let cached = self.store::<C>()?.get_by_key(key)?;
                    cached.meta().uid.clone()
                });
                if let Some(uid) = uid {
                    self.record::<C>(key.clone(), Written::Deleted { uid });
                }
            }
        }
        Ok(())
    }

    /// Applies `desired` server-side as the controller's field manager and returns the
    /// object as stored: the fields it sets become the controller's, and fields the
    /// controller set before and `desired` leaves out are removed. Fields another manager
    /// owns are taken only with [`Conflicts::TakeOwnership`]. An apply that changes nothing
    /// writes nothing (the resourceVersion stays), so applying the same object on every
    /// reconcile causes no watch event and no reconcile loop.
    ///
    /// # Errors
    ///
    /// [`ClientError::Apply`]: [`ApplyError::Conflict`] naming the other managers and their
    /// fields (with [`Conflicts::Refuse`]), [`ApplyError::NoName`], [`ApplyError::Api`].
    pub async fn apply<C: Writable>(
        &self,
        desired: &C,
        conflicts: Conflicts,
    ) -> Result<C, ClientError> {
        let applied = self.applier.apply(desired, conflicts).await?;
        Ok(self.applied(applied))
    }

    /// Applies the status `desired` holds server-side as the controller's field manager
    /// (its other fields are not written) and returns the object as stored; as
    /// [`apply`](Self::apply).
    ///
    /// # Errors
    ///
    /// As [`apply`](Self::apply).
    pub async fn apply_status<C: Writable>(
        &self,
        desired: &C,
        conflicts: Conflicts,
    ) -> Result<C, ClientError> {
        let applied = self.applier.apply_status(desired, conflicts).await?;
        Ok(self.applied(applied))
    }

    /// An applied object, recorded.
    fn applied<C: Writable>(&self, applied: C) -> C {
        if let Ok(key) = ObjectKey::from_object(&applied) {
            self.record_version(key, &applied);
        }
        applied
    }

    /// The server's answer to a write of `key`: the object recorded, or the error named.
    fn stored<C: Writable>(
        &self,
        verb: &'static str,
        key: ObjectKey,
        answer: Result<C, kube_client::Error>,
    ) -> Result<C, ClientError> {
        let stored = answer.map_err(|source| api_error::<C>(verb, &key, source))?;
        let meta = stored.meta();
        // A write that took the last finalizer off an object being deleted (with no grace
        // period left) deleted it, and the server answers with the object's last state,
        // at a version the cache may have passed already: the write is observed once the
        // cache no longer holds that object.
        let deleted = meta.deletion_timestamp.is_some()
            && meta.finalizers.as_ref().is_none_or(Vec::is_empty)
            && meta.deletion_grace_period_seconds.unwrap_or(0) == 0;
        match meta.uid.clone().filter(|_| deleted) {
            Some(uid) => self.record::<C>(key, Written::Deleted { uid }),
            None => self.record_version(key, &stored),
        }
        Ok(stored)
    }

    fn record_version<C: Resource + Send + Sync + 'static>(&self, key: ObjectKey, stored: &C) {
        let version = stored
            .meta()
            .resource_version
            .as_deref()
            .and_then(ResourceVersion::parse);
        if let Some(version) = version {
            self.record::<C>(key, Written::Version(version));
        }
    }

    fn record<C: Resource + Send + Sync + 'static>(&self, key: ObjectKey, written: Written) {
        if self.caches.mode() == OwnWrites::Ignored {
            return;
        }
        if let Some(cache) = self.caches.cache::<C>() {
            cache.record(key, written);
            self.caches.count_recorded();
        }
    }

    fn post_params(&self) -> PostParams {
        PostParams {
            field_manager: Some(self.applier.manager().to_owned()),
            ..PostParams::default()
        }
    }

    fn patch_params(&self) -> PatchParams {
        PatchParams {
            field_manager: Some(self.applier.manager().to_owned()),
            ..PatchParams::default()
        }
    }

    fn api_for<C: Writable>(
        &self,
        obj: &C,
        verb: &'static str,
    ) -> Result<(Api<C>, ObjectKey), ClientError> {
        let meta = obj.meta();
        let Some(name) = meta.name.as_deref().filter(|n| !n.is_empty()) else {
            return Err(invalid::<C>(verb, "the object has no name"));
        };
        let key = ObjectKey::new(meta.namespace.as_deref(), name);
        Ok((self.api_at::<C>(&key, verb)?, key))
    }

    fn api_at<C: Writable>(
        &self,
        key: &ObjectKey,
        verb: &'static str,
    ) -> Result<Api<C>, ClientError> {
        let namespaced = <C::Scope as FactoryScope>::NAMESPACED;
        if namespaced && key.namespace().is_none() {
            return Err(invalid::<C>(verb, "a namespaced object needs a namespace"));
        }
        Ok(<C::Scope as FactoryScope>::api(
            self.client.clone(),
            key.namespace(),
        ))
    }
}

fn api_error<C: Resource<DynamicType = ()>>(
    verb: &'static str,
    key: &ObjectKey,
    source: kube_client::Error,
) -> ClientError {
    ClientError::Api {
        verb,
        kind: C::kind(&()).into_owned(),
        key: key.to_string(),
        source: Box::new(source),
    }
}

fn invalid<C: Resource<DynamicType = ()>>(verb: &'static str, reason: &'static str) -> ClientError {
    ClientError::Invalid {
        verb,
        kind: C::kind(&()).into_owned(),
        reason,
    }
}
