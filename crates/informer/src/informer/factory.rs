//! One informer per resource and scope, shared by everything that asks (client-go's
//! `SharedInformerFactory`). The full documentation is on [`InformerFactory`].

use std::{
    any::{Any, TypeId},
    fmt::{self, Debug},
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use dashmap::{DashMap, mapref::entry::Entry};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube_client::{Api, Client};
use kube_core::Resource;
use serde::{Serialize, de::DeserializeOwned};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use super::{
    InformerHandle, RunningInformer, SharedInformer, builder::InformerBuilder,
    health::InformerHealth, latency::ProcessingStats, listener::HandlerStats,
    staleness::StalenessStats, sync::HasSynced,
};
use crate::{
    error::Error,
    list_watch::{ApiListWatch, Shard},
    reflector::ReflectorStats,
    store::{Usage, WeakUsage, WorkingSet, WorkingSetStats},
};

/// A transform of every object's metadata, whatever its type.
type MetadataTransform = Arc<dyn Fn(&mut ObjectMeta) + Send + Sync>;

/// What every informer of a factory is built with (client-go's factory options): a resync
/// period and a transform of each object's metadata. An informer's own customisation
/// ([`InformerFactory::informer_with`]) comes after them: its resync period or transform
/// replaces the default.
#[derive(Clone, Default)]
pub struct FactoryDefaults {
    resync_period: Option<Duration>,
    staleness_probe: Option<Duration>,
    metadata_transform: Option<MetadataTransform>,
    working_set: Option<WorkingSet>,
    unused: UnusedInformers,
}

/// What a factory does with an informer nothing uses any more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum UnusedInformers {
    /// Stops it once it has been unused this long.
    StopAfter(Duration),
    /// Keeps it running until the factory shuts down.
    Keep,
}

/// How long an unused informer runs on by default: long enough for a controller that is
/// restarted in place, or a handler replaced by another, to find it still synced.
const UNUSED_GRACE: Duration = Duration::from_secs(30);

impl Default for UnusedInformers {
    fn default() -> Self {
        Self::StopAfter(UNUSED_GRACE)
    }
}

impl FactoryDefaults {
    /// Every informer resyncs this often (see [`InformerBuilder::resync_period`]).
    #[must_use]
    pub fn resync_period(mut self, period: Duration) -> Self {
        self.resync_period = Some(period);
        self
    }

    /// Gives each informer a [staleness probe](crate::informer::InformerBuilder::staleness_probe)
    /// every `period`: how far its cache is behind the server, measured and served.
    #[must_use]
    pub fn staleness_probe(mut self, period: Duration) -> Self {
        self.staleness_probe = Some(period);
        self
    }

    /// Every object's metadata goes through `transform` before it is stored.
    #[must_use]
    pub fn transform_metadata(
        mut self,
        transform: impl Fn(&mut ObjectMeta) + Send + Sync + 'static,
    ) -> Self {
        self.metadata_transform = Some(Arc::new(transform));
        self
    }

    /// Every informer's cache keeps this working set (see
    /// [`InformerBuilder::working_set`]).
    #[must_use]
    pub fn working_set(mut self, working_set: WorkingSet) -> Self {
        self.working_set = Some(working_set);
        self
    }

    /// How long an informer nothing uses any more keeps running before the factory stops
    /// it and lets its cache go (30 s by default). See [`InformerFactory`] for what counts
    /// as a use.
    #[must_use]
    pub fn stop_unused_after(mut self, grace: Duration) -> Self {
        self.unused = UnusedInformers::StopAfter(grace);
        self
    }

    /// Informers run until the factory shuts down, used or not (client-go's factories).
    #[must_use]
    pub fn keep_unused(mut self) -> Self {
        self.unused = UnusedInformers::Keep;
        self
    }

    /// Every object is stored without `metadata.managedFields`, usually the largest part of
    /// an object and one a controller never reads (see
    /// [`strip_managed_fields`](crate::store::strip_managed_fields)).
    #[must_use]
    pub fn strip_managed_fields(self) -> Self {
        self.transform_metadata(|meta| meta.managed_fields = None)
    }
}

impl Debug for FactoryDefaults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FactoryDefaults")
            .field("resync_period", &self.resync_period)
            .field("metadata_transform", &self.metadata_transform.is_some())
            .field("working_set", &self.working_set)
            .field("unused", &self.unused)
            .finish()
    }
}

/// Which objects of a resource an informer caches: a namespace (or all), and label and
/// field selectors. Informers of a factory are shared per resource and scope.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Scope {
    namespace: Option<String>,
    labels: Option<String>,
    fields: Option<String>,
    shard: Option<Shard>,
}

impl Scope {
    /// Every namespace (or a cluster-scoped resource), no selector.
    pub fn all() -> Self {
        Self::default()
    }

    /// One namespace, for a namespaced resource (a cluster-scoped one gets every object).
    pub fn namespace(namespace: impl Into<String>) -> Self {
        Self {
            namespace: Some(namespace.into()).filter(|ns: &String| !ns.is_empty()),
            ..Self::default()
        }
    }

    /// Only objects whose labels match `selector` (e.g. `app=web,tier!=db`).
    #[must_use]
    pub fn labels(mut self, selector: impl Into<String>) -> Self {
        self.labels = Some(selector.into());
        self
    }

    /// Only objects whose fields match `selector` (e.g. `spec.nodeName=node-1`).
    #[must_use]
    pub fn fields(mut self, selector: impl Into<String>) -> Self {
        self.fields = Some(selector.into());
        self
    }

    /// Only `shard`'s objects (see [`InformerBuilder::shard`](crate::informer::InformerBuilder::shard)).
    #[must_use]
    pub fn shard(mut self, shard: Shard) -> Self {
        self.shard = Some(shard);
        self
    }

    /// The shard, if any.
    pub fn selected_shard(&self) -> Option<&Shard> {
        self.shard.as_ref()
    }

    /// The namespace, if the scope is one.
    pub fn namespace_name(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// The label selector, if any.
    pub fn label_selector(&self) -> Option<&str> {
        self.labels.as_deref()
    }

    /// The field selector, if any.
    pub fn field_selector(&self) -> Option<&str> {
        self.fields.as_deref()
    }
}

/// A typed resource: a type whose kind is known at compile time (k8s-openapi's types, your
/// own `CustomResource`s, a [`LazyObject`](crate::list_watch::LazyObject) of either) and that the
/// default compact cache can keep. What a factory, a manager and a controller's bounds ask
/// for; implemented for every type with these bounds, so write `K: TypedResource` instead
/// of the list.
pub trait TypedResource:
    Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + Debug + Send + Sync + 'static
{
}

impl<K> TypedResource for K where
    K: Resource<DynamicType = ()>
        + Clone
        + Serialize
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static
{
}

/// The scopes of typed resources a factory builds informers for: namespaced ones (one
/// namespace, or all) and cluster-scoped ones. Implemented for k8s-openapi's scope types.
pub trait FactoryScope: sealed::Sealed + Sized {
    /// Whether objects of this scope live in a namespace.
    const NAMESPACED: bool;

    /// The `Api` of `K` in `namespace` (ignored for a cluster-scoped resource).
    fn api<K>(client: Client, namespace: Option<&str>) -> Api<K>
    where
        K: Resource<Scope = Self, DynamicType = ()>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for k8s_openapi::NamespaceResourceScope {}
    impl Sealed for k8s_openapi::ClusterResourceScope {}
}

impl FactoryScope for k8s_openapi::NamespaceResourceScope {
    const NAMESPACED: bool = true;

    fn api<K>(client: Client, namespace: Option<&str>) -> Api<K>
    where
        K: Resource<Scope = Self, DynamicType = ()>,
    {
        match namespace {
            Some(namespace) => Api::namespaced(client, namespace),
            None => Api::all(client),
        }
    }
}

impl FactoryScope for k8s_openapi::ClusterResourceScope {
    const NAMESPACED: bool = false;

    fn api<K>(client: Client, _namespace: Option<&str>) -> Api<K>
    where
        K: Resource<Scope = Self, DynamicType = ()>,
    {
        Api::all(client)
    }
}

/// Builder adjustments applied to an informer the factory creates.
type Customize<K> =
    Box<dyn FnOnce(InformerBuilder<K, ApiListWatch<K>>) -> InformerBuilder<K, ApiListWatch<K>>>;

/// A started informer, whatever its type.
trait Started: Send + Sync {
    fn stop(self: Box<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

impl<K: Resource + Send + Sync + 'static> Started for RunningInformer<K> {
    fn stop(self: Box<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(RunningInformer::stop(*self))
    }
}

/// An informer not started yet, whatever its type.
type Starter = Box<dyn FnOnce(CancellationToken) -> Box<dyn Started> + Send>;

/// A registered informer: its handle, whatever its type, its resource's name, and who uses
/// it.
struct Registered {
    synced: Arc<dyn Syncing>,
    resource: String,
    group: String,
    version: String,
    /// Tells this informer from a later one of the same type and scope.
    serial: u64,
    /// The shares handed out; dead once every one is dropped.
    users: WeakUsage,
    /// Counts the times the informer went from unused to used.
    generation: u64,
}

/// The key of an informer in a factory's registry.
type RegistryKey = (TypeId, Scope);

/// Dropped with the last share in an informer's use: schedules its stop.
struct LastUser {
    factory: std::sync::Weak<Inner>,
    key: RegistryKey,
    serial: u64,
    generation: u64,
}

impl Drop for LastUser {
    fn drop(&mut self) {
        let Some(inner) = self.factory.upgrade() else {
            return;
        };
        let UnusedInformers::StopAfter(grace) = inner.defaults.unused else {
            return;
        };
        // Dropped outside a runtime (after it shut down), nothing is left to stop.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let key = self.key.clone();
        let (serial, generation) = (self.serial, self.generation);
        drop(inner);
        let factory = self.factory.clone();
        runtime.spawn(async move {
            tokio::time::sleep(grace).await;
            if let Some(inner) = factory.upgrade() {
                InformerFactory { inner }
                    .stop_unused(&key, serial, generation, grace)
                    .await;
            }
        });
    }
}

/// An informer's handle, whatever its type: its sync, its size, and the handle itself
/// (downcast by type).
trait Syncing: HasSynced {
    fn health(&self) -> InformerHealth;
    fn wait_synced_or_fatal(&self) -> Pin<Box<dyn Future<Output = Result<(), Error>> + Send + '_>>;
    fn objects(&self) -> usize;
    fn working_set(&self) -> WorkingSetStats;
    fn handler_stats(&self) -> Vec<HandlerStats>;
    fn processing_stats(&self) -> ProcessingStats;
    fn staleness(&self) -> Option<StalenessStats>;
    fn last_sync_resource_version(&self) -> Option<String>;
    fn stats(&self) -> ReflectorStats;
    fn as_any(&self) -> &dyn Any;
}

impl<K: Resource + Send + Sync + 'static> Syncing for InformerHandle<K> {
    fn wait_synced_or_fatal(&self) -> Pin<Box<dyn Future<Output = Result<(), Error>> + Send + '_>> {
        Box::pin(InformerHandle::wait_synced_or_fatal(self))
    }

    fn health(&self) -> InformerHealth {
        InformerHandle::health(self)
    }

    fn objects(&self) -> usize {
        self.store().len()
    }

    fn working_set(&self) -> WorkingSetStats {
        self.store().working_set()
    }

    fn handler_stats(&self) -> Vec<HandlerStats> {
        InformerHandle::handler_stats(self)
    }

    fn processing_stats(&self) -> ProcessingStats {
        InformerHandle::processing_stats(self)
    }

    fn staleness(&self) -> Option<StalenessStats> {
        InformerHandle::staleness(self)
    }

    fn last_sync_resource_version(&self) -> Option<String> {
        InformerHandle::last_sync_resource_version(self)
    }

    fn stats(&self) -> ReflectorStats {
        self.reflector_stats()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// One informer of a factory, as [`InformerFactory::informers`] reports it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct InformerStatus {
    /// The resource's plural name.
    pub resource: String,
    /// Its API group (empty for the core group).
    pub group: String,
    /// Its API version.
    pub version: String,
    /// Its scope.
    pub scope: Scope,
    /// Objects cached.
    pub objects: usize,
    /// Whether it has synced.
    pub synced: bool,
    /// Syncing, synced, or without its resource (see [`InformerHealth`]).
    pub health: InformerHealth,
    /// The resourceVersion the cache last synced to.
    pub last_sync_resource_version: Option<String>,
    /// Its reflector's lists, watches and errors, and with a [shard](Scope::shard) whether
    /// the server or the informer applied it on the last list.
    pub reflector: ReflectorStats,
    /// Its cache's decoded working set (see [`WorkingSet`](crate::WorkingSet)).
    pub working_set: WorkingSetStats,
    /// How far behind each of its event handlers is.
    pub handlers: Vec<HandlerStats>,
    /// How long it took over each watch event before its handlers saw it.
    pub processing: ProcessingStats,
    /// How far its cache is behind the server, with a staleness probe.
    pub staleness: Option<StalenessStats>,
    /// The uses held of it: handles the factory returned, stores and listers taken from
    /// them, handlers registered through them. At zero, it is stopped after the grace
    /// period (see [`InformerFactory`]).
    pub users: usize,
}

#[derive(Default)]
struct Lifecycle {
    /// Set by `start`: informers registered later start at once.
    cancel: Option<CancellationToken>,
    /// By serial.
    pending: Vec<(u64, Starter)>,
    /// By serial.
    running: Vec<(u64, Box<dyn Started>)>,
}

/// One informer per resource type and [`Scope`], shared by every controller that asks
/// (client-go's `SharedInformerFactory`). Cheap to clone.
///
/// [`informer`](Self::informer) returns the existing informer for a type and scope, or
/// builds one on the factory's client; [`start`](Self::start) starts every informer
/// registered so far, and any registered later starts at once, so registering after start
/// is safe (a handler added to a running informer gets its cached objects first);
/// [`wait_synced`](Self::wait_synced) waits for all of them; [`shutdown`](Self::shutdown)
/// stops them and waits until they have.
///
/// # Informers that nobody uses
///
/// The factory counts the uses of each informer: every [`InformerHandle`] it returned
/// (and its clones), every [`Store`](crate::Store) or [`Lister`](crate::Lister) taken from
/// one, and every handler registered through one until it is
/// [removed](crate::informer::HandlerRegistration::remove). A controller holds all three while it
/// runs and lets go when it ends. When the last use is dropped, the informer keeps running
/// for a grace period (30 s; [`FactoryDefaults::stop_unused_after`]), so a controller
/// restarted in place finds it synced. If nothing asks for it within the grace period, the
/// factory stops it, closing its watch, and drops it from its registry, which releases its
/// cache; a later [`informer`](Self::informer) call builds a new one.
/// [`FactoryDefaults::keep_unused`] keeps every informer until shutdown, as client-go does.
///
/// ```no_run
/// use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap};
/// use kube_informer::{CancellationToken, InformerFactory, Scope};
///
/// # async fn doc(client: kube_client::Client) -> Result<(), kube_informer::Error> {
/// let factory = InformerFactory::new(client);
/// let deployments = factory.informer::<Deployment>(Scope::namespace("web"));
/// let config_maps = factory.informer::<ConfigMap>(Scope::namespace("web"));
/// // A second ask for the same type and scope gets the same informer.
/// let shared = factory.informer::<ConfigMap>(Scope::namespace("web"));
/// assert_eq!(factory.len(), 2);
///
/// let cancel = CancellationToken::new();
/// factory.start(&cancel);
/// factory.wait_synced().await?;
/// println!("{} deployments", deployments.store().len());
/// factory.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct InformerFactory {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    defaults: FactoryDefaults,
    registry: DashMap<RegistryKey, Registered>,
    lifecycle: Mutex<Lifecycle>,
    next_serial: std::sync::atomic::AtomicU64,
}

impl Debug for InformerFactory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let informers: Vec<String> = self
            .inner
            .registry
            .iter()
            .map(|e| format!("{} {:?}", e.resource, e.key().1))
            .collect();
        f.debug_struct("InformerFactory")
            .field("informers", &informers)
            .finish_non_exhaustive()
    }
}

impl InformerFactory {
    /// A factory whose informers list and watch through `client`.
    pub fn new(client: Client) -> Self {
        Self::with_defaults(client, FactoryDefaults::default())
    }

    /// A factory whose informers list and watch through `client`, each built with
    /// `defaults` (client-go's `NewSharedInformerFactoryWithOptions`).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use kube_informer::{FactoryDefaults, InformerFactory};
    ///
    /// # fn doc(client: kube_client::Client) {
    /// let defaults = FactoryDefaults::default()
    ///     .resync_period(Duration::from_secs(600))
    ///     .strip_managed_fields();
    /// let factory = InformerFactory::with_defaults(client, defaults);
    /// # }
    /// ```
    pub fn with_defaults(client: Client, defaults: FactoryDefaults) -> Self {
        Self {
            inner: Arc::new(Inner {
                client,
                defaults,
                registry: DashMap::new(),
                lifecycle: Mutex::default(),
                next_serial: std::sync::atomic::AtomicU64::new(0),
            }),
        }
    }

    /// The client the factory's informers use.
    pub fn client(&self) -> Client {
        self.inner.client.clone()
    }

    /// The informer of `K` in `scope`: the existing one, or a new one with the default
    /// configuration.
    pub fn informer<K>(&self, scope: Scope) -> InformerHandle<K>
    where
        K: TypedResource,
        K::Scope: FactoryScope,
    {
        self.informer_with(scope, |builder| builder)
    }

    /// The informer of `K` in `scope`: the existing one, or a new one whose builder
    /// `customize` adjusts (indexes, a transform, a compact cache, ...). Only the call that
    /// creates the informer customizes it; later ones share it as it is.
    pub fn informer_with<K>(
        &self,
        scope: Scope,
        customize: impl FnOnce(
            InformerBuilder<K, ApiListWatch<K>>,
        ) -> InformerBuilder<K, ApiListWatch<K>>
        + 'static,
    ) -> InformerHandle<K>
    where
        K: TypedResource,
        K::Scope: FactoryScope,
    {
        let key = (TypeId::of::<K>(), scope);
        let entry = match self.inner.registry.entry(key) {
            Entry::Occupied(mut entry) => {
                let key = entry.key().clone();
                let registered = entry.get_mut();
                let usage = match registered.users.upgrade() {
                    Some(usage) => usage,
                    None => {
                        // Used again within its grace period: its stop is called off.
                        registered.generation += 1;
                        let usage = self.usage(key, registered.serial, registered.generation);
                        registered.users = usage.downgrade();
                        usage
                    }
                };
                return downcast::<K>(registered.synced.as_any()).in_use(usage);
            }
            Entry::Vacant(entry) => entry,
        };
        let key = entry.key().clone();
        let informer = self.build::<K>(&key.1, Box::new(customize));
        let handle = informer.handle();
        let resource = format!("{}", K::plural(&()));
        debug!(%resource, scope = ?key.1, "informer registered");
        let serial = self
            .inner
            .next_serial
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let usage = self.usage(key, serial, 0);
        entry.insert(Registered {
            synced: Arc::new(handle.clone()),
            resource,
            group: K::group(&()).into_owned(),
            version: K::version(&()).into_owned(),
            serial,
            users: usage.downgrade(),
            generation: 0,
        });
        // Started outside the registry's shard lock.
        self.start_or_hold(
            serial,
            Box::new(move |cancel| Box::new(informer.spawn(cancel))),
        );
        handle.in_use(usage)
    }

    /// A first share in the use of informer `serial`, after none was left (`generation`
    /// counts those times): the last share dropped schedules its stop.
    fn usage(&self, key: RegistryKey, serial: u64, generation: u64) -> Usage {
        Usage::new(LastUser {
            factory: Arc::downgrade(&self.inner),
            key,
            serial,
            generation,
        })
    }

    /// Stops the informer `serial` if it has not been used again since generation
    /// `generation` went unused.
    async fn stop_unused(&self, key: &RegistryKey, serial: u64, generation: u64, grace: Duration) {
        let Some((_, registered)) = self.inner.registry.remove_if(key, |_, registered| {
            registered.serial == serial && registered.generation == generation
        }) else {
            return;
        };
        info!(
            resource = %registered.resource,
            scope = ?key.1,
            unused_for = ?grace,
            "stopping an informer nothing uses any more"
        );
        let running = {
            let mut lifecycle = self.lifecycle();
            lifecycle.pending.retain(|(pending, _)| *pending != serial);
            lifecycle
                .running
                .iter()
                .position(|(running, _)| *running == serial)
                .map(|at| lifecycle.running.swap_remove(at).1)
        };
        if let Some(running) = running {
            running.stop().await;
        }
    }

    fn build<K>(&self, scope: &Scope, customize: Customize<K>) -> SharedInformer<K>
    where
        K: TypedResource,
        K::Scope: FactoryScope,
    {
        let api = K::Scope::api::<K>(self.inner.client.clone(), scope.namespace.as_deref());
        let mut list_watch = ApiListWatch::new(api);
        if let Some(labels) = &scope.labels {
            list_watch = list_watch.labels(labels);
        }
        if let Some(fields) = &scope.fields {
            list_watch = list_watch.fields(fields);
        }
        let defaults = &self.inner.defaults;
        let mut builder = SharedInformer::builder(list_watch);
        if let Some(shard) = &scope.shard {
            builder = builder.shard(shard.clone());
        }
        if let Some(period) = defaults.resync_period {
            builder = builder.resync_period(period);
        }
        if let Some(period) = defaults.staleness_probe {
            builder = builder.staleness_probe(period);
        }
        if let Some(working_set) = defaults.working_set.clone() {
            builder = builder.working_set(working_set);
        }
        if let Some(transform) = defaults.metadata_transform.clone() {
            builder = builder.transform(move |mut obj: K| {
                transform(obj.meta_mut());
                obj
            });
        }
        customize(builder).build()
    }

    fn start_or_hold(&self, serial: u64, starter: Starter) {
        let mut lifecycle = self.lifecycle();
        match lifecycle.cancel.clone() {
            Some(cancel) => {
                let running = starter(cancel);
                lifecycle.running.push((serial, running));
            }
            None => lifecycle.pending.push((serial, starter)),
        }
    }

    fn lifecycle(&self) -> std::sync::MutexGuard<'_, Lifecycle> {
        self.inner
            .lifecycle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts every informer registered so far, each stopped by `cancel` (or by
    /// [`shutdown`](Self::shutdown)); informers registered later start at once. A second
    /// call does nothing.
    pub fn start(&self, cancel: &CancellationToken) {
        let mut lifecycle = self.lifecycle();
        if lifecycle.cancel.is_some() {
            return;
        }
        let cancel = cancel.child_token();
        lifecycle.cancel = Some(cancel.clone());
        let pending = std::mem::take(&mut lifecycle.pending);
        for (serial, starter) in pending {
            let running = starter(cancel.clone());
            lifecycle.running.push((serial, running));
        }
    }

    /// Whether every informer registered so far has synced.
    pub fn has_synced(&self) -> bool {
        self.inner.registry.iter().all(|e| e.synced.has_synced())
    }

    /// Waits until every informer registered so far has synced.
    ///
    /// # Errors
    ///
    /// The first error that retrying cannot fix (missing RBAC, an unknown resource) from
    /// an informer's list or watch, while that informer has not synced.
    pub async fn wait_synced(&self) -> Result<(), Error> {
        let informers: Vec<Arc<dyn Syncing>> = self
            .inner
            .registry
            .iter()
            .map(|e| e.synced.clone())
            .collect();
        for informer in informers {
            informer.wait_synced_or_fatal().await?;
        }
        Ok(())
    }

    /// Stops every informer and waits until each has stopped. Informers registered
    /// afterwards start again only after another [`start`](Self::start).
    pub async fn shutdown(&self) {
        let running = {
            let mut lifecycle = self.lifecycle();
            if let Some(cancel) = lifecycle.cancel.take() {
                cancel.cancel();
            }
            std::mem::take(&mut lifecycle.running)
        };
        for (_, informer) in running {
            informer.stop().await;
        }
    }

    /// Every informer registered: its resource and scope, objects cached, whether it has
    /// synced, to which resourceVersion, and how often it relisted and rewatched.
    pub fn informers(&self) -> Vec<InformerStatus> {
        self.inner
            .registry
            .iter()
            .map(|e| InformerStatus {
                resource: e.resource.clone(),
                group: e.group.clone(),
                version: e.version.clone(),
                scope: e.key().1.clone(),
                objects: e.synced.objects(),
                synced: e.synced.has_synced(),
                health: e.synced.health(),
                last_sync_resource_version: e.synced.last_sync_resource_version(),
                reflector: e.synced.stats(),
                working_set: e.synced.working_set(),
                handlers: e.synced.handler_stats(),
                processing: e.synced.processing_stats(),
                staleness: e.synced.staleness(),
                users: e.users.count(),
            })
            .collect()
    }

    /// The number of informers registered.
    pub fn len(&self) -> usize {
        self.inner.registry.len()
    }

    /// Whether no informer is registered.
    pub fn is_empty(&self) -> bool {
        self.inner.registry.is_empty()
    }
}

fn downcast<K: 'static>(handle: &dyn Any) -> InformerHandle<K> {
    handle
        .downcast_ref::<InformerHandle<K>>()
        .expect("the registry is keyed by type")
        .clone()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ConfigMap, Node};
    use kube_client::Config;

    use super::*;

    fn factory() -> InformerFactory {
        // Never contacted: nothing here starts an informer.
        let config = Config::new("http://127.0.0.1:9".parse().unwrap());
        InformerFactory::new(Client::try_from(config).unwrap())
    }

    #[tokio::test]
    async fn one_informer_per_type_and_scope() {
        let factory = factory();
        let first = factory.informer::<ConfigMap>(Scope::namespace("a"));
        let again = factory.informer::<ConfigMap>(Scope::namespace("a"));
        assert_eq!(factory.len(), 1);
        assert!(!first.has_synced() && !again.has_synced());
        factory.informer::<ConfigMap>(Scope::namespace("b"));
        factory.informer::<ConfigMap>(Scope::namespace("a").labels("app=web"));
        factory.informer::<Node>(Scope::all());
        assert_eq!(factory.len(), 4);
        assert!(!factory.has_synced());
        let customized = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for _ in 0..2 {
            let calls = customized.clone();
            factory.informer_with::<Node>(Scope::all().labels("role=edge"), move |b| {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                b
            });
        }
        assert_eq!(
            customized.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "only the creating call customizes"
        );
    }

    /// Lets the spawned stop tasks run on the paused clock.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    fn users(factory: &InformerFactory) -> Vec<usize> {
        factory.informers().iter().map(|i| i.users).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn an_informer_is_stopped_once_unused_for_its_grace_period() {
        let grace = Duration::from_secs(30);
        let factory = factory();
        let scope = || Scope::namespace("a");
        let handle = factory.informer::<ConfigMap>(scope());
        let store = handle.store();
        let registration = handle
            .add_handler(crate::handler_fn::<ConfigMap>())
            .unwrap();
        assert_eq!(
            users(&factory),
            [3],
            "the handle, its store and its handler"
        );

        drop(handle);
        drop(store);
        tokio::time::sleep(grace * 2).await;
        settle().await;
        assert_eq!(factory.len(), 1, "a registered handler keeps it in use");
        assert_eq!(users(&factory), [1]);

        // Unused, then asked for again within the grace period: the same informer.
        registration.remove();
        settle().await;
        assert_eq!(users(&factory), [0]);
        tokio::time::sleep(grace / 2).await;
        let customized = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let called = customized.clone();
        let again = factory.informer_with::<ConfigMap>(scope(), move |b| {
            called.store(true, std::sync::atomic::Ordering::SeqCst);
            b
        });
        assert!(!customized.load(std::sync::atomic::Ordering::SeqCst));
        tokio::time::sleep(grace).await;
        settle().await;
        assert_eq!(factory.len(), 1, "the earlier stop was called off");

        // Unused for the whole grace period: stopped and forgotten.
        drop(again);
        tokio::time::sleep(grace - Duration::from_secs(1)).await;
        settle().await;
        assert_eq!(factory.len(), 1, "not before the grace period ends");
        tokio::time::sleep(Duration::from_secs(2)).await;
        settle().await;
        assert!(factory.is_empty());
        assert!(factory.lifecycle().pending.is_empty());
        let rebuilt = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let called = rebuilt.clone();
        let _new = factory.informer_with::<ConfigMap>(scope(), move |b| {
            called.store(true, std::sync::atomic::Ordering::SeqCst);
            b
        });
        assert!(
            rebuilt.load(std::sync::atomic::Ordering::SeqCst),
            "a new one"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_factory_told_to_keep_unused_informers_keeps_them() {
        let config = Config::new("http://127.0.0.1:9".parse().unwrap());
        let factory = InformerFactory::with_defaults(
            Client::try_from(config).unwrap(),
            FactoryDefaults::default().keep_unused(),
        );
        drop(factory.informer::<ConfigMap>(Scope::all()));
        tokio::time::sleep(Duration::from_secs(3600)).await;
        settle().await;
        assert_eq!(factory.len(), 1);
        assert_eq!(users(&factory), [0]);
    }
}
