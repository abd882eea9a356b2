//! Event filters: which updates of a watched object are worth a reconcile.

use std::sync::Arc;

use kube_core::Resource;

/// Decides whether an update (`old` to `new`) of a watched object enqueues a reconcile.
/// Adds and deletes always do. Cheap to clone.
///
/// The built-ins compare what a controller usually acts on; combine them with
/// [`or`](Self::or) and [`and`](Self::and):
///
/// ```
/// use k8s_openapi::api::apps::v1::Deployment;
/// use kube_informer::Predicate;
///
/// // Spec changes (the generation) or label changes, but not status writes.
/// let relevant = Predicate::<Deployment>::generation_changed().or(Predicate::labels_changed());
/// let mut old = Deployment::default();
/// old.metadata.generation = Some(1);
/// let mut new = old.clone();
/// new.status = Some(Default::default());
/// assert!(!relevant.accepts(&old, &new));
/// new.metadata.generation = Some(2);
/// assert!(relevant.accepts(&old, &new));
/// ```
pub struct Predicate<K> {
    test: Arc<UpdateTest<K>>,
}

/// The test of an update, old state then new.
type UpdateTest<K> = dyn Fn(&K, &K) -> bool + Send + Sync;

impl<K> Clone for Predicate<K> {
    fn clone(&self) -> Self {
        Self {
            test: self.test.clone(),
        }
    }
}

impl<K> std::fmt::Debug for Predicate<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Predicate").finish_non_exhaustive()
    }
}

impl<K: Resource + 'static> Predicate<K> {
    /// A predicate from a function of the old and new object.
    pub fn new(test: impl Fn(&K, &K) -> bool + Send + Sync + 'static) -> Self {
        Self {
            test: Arc::new(test),
        }
    }

    /// Every update (no filter).
    pub fn any() -> Self {
        Self::new(|_, _| true)
    }

    /// `metadata.generation` changed: the spec changed (status and metadata writes leave it
    /// alone). The start of a deletion (`metadata.deletionTimestamp` set) passes too,
    /// whether or not the server moved the generation, so a finalizer's cleanup is never
    /// filtered out. An object without a generation (most built-in kinds but workloads)
    /// passes every update.
    ///
    /// ```
    /// use k8s_openapi::{api::apps::v1::Deployment, apimachinery::pkg::apis::meta::v1::Time};
    /// use kube_informer::Predicate;
    ///
    /// let spec_changes = Predicate::<Deployment>::generation_changed();
    /// let mut old = Deployment::default();
    /// old.metadata.generation = Some(1);
    /// let mut deleting = old.clone();
    /// deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    /// assert!(spec_changes.accepts(&old, &deleting));
    /// ```
    pub fn generation_changed() -> Self {
        Self::new(|old, new| {
            let (old, new) = (old.meta(), new.meta());
            let generation = match (old.generation, new.generation) {
                (Some(old), Some(new)) => old != new,
                _ => true,
            };
            generation || old.deletion_timestamp != new.deletion_timestamp
        })
    }

    /// `metadata.labels` changed.
    pub fn labels_changed() -> Self {
        Self::new(|old, new| old.meta().labels != new.meta().labels)
    }

    /// `metadata.annotations` changed.
    pub fn annotations_changed() -> Self {
        Self::new(|old, new| old.meta().annotations != new.meta().annotations)
    }

    /// `metadata.resourceVersion` changed: every real write, but not a resync's replay.
    pub fn resource_version_changed() -> Self {
        Self::new(|old, new| old.meta().resource_version != new.meta().resource_version)
    }

    /// Passes when either passes.
    #[must_use]
    pub fn or(self, other: Self) -> Self {
        Self::new(move |old, new| (self.test)(old, new) || (other.test)(old, new))
    }

    /// Passes when both pass.
    #[must_use]
    pub fn and(self, other: Self) -> Self {
        Self::new(move |old, new| (self.test)(old, new) && (other.test)(old, new))
    }

    /// Whether the update from `old` to `new` passes.
    pub fn accepts(&self, old: &K, new: &K) -> bool {
        (self.test)(old, new)
    }
}
