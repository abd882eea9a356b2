//! Reads into a caller's projection (`get_as` and its kin). A controller that reads a few
//! fields of an object should pay for those fields alone: from the server's bytes the
//! deserializer skips the rest where it lies, rather than decoding the whole object to copy
//! a part out.

use serde::{Serialize, de::DeserializeOwned};

use super::{Recent, Store, slot::Taken};
use crate::{
    error::{BoxError, Error},
    key::ObjectKey,
};

impl<K> Store<K> {
    /// The object under `key`, read as `T`: a projection that declares only the fields a
    /// caller needs, as serde reads JSON into a struct with fewer fields.
    ///
    /// In a compact store of the server's bytes (an informer's default) only those fields
    /// are decoded, and nothing is allocated for the rest: protobuf fields are skipped
    /// where they lie (their lengths are on the wire), JSON is scanned past.
    /// A controller that reads a Pod's labels pays for the labels, not for the whole Pod
    /// and its `managedFields`. In a store of decoded objects, or one encoded by a
    /// [`Codec`], the object is decoded as `K` and re-read as `T` through its JSON, which
    /// costs more than [`get_by_key`](Self::get_by_key): there, read the shared object.
    ///
    /// [`Codec`]: crate::codec::Codec
    ///
    /// `T` sees the object as its JSON, with `apiVersion` and `kind` when the server sent
    /// them (watch events carry them, list items do not).
    ///
    /// ```
    /// use std::{collections::BTreeMap, sync::Arc};
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube_informer::testing::{FakeListWatch, StoreWriter};
    ///
    /// #[derive(serde::Deserialize)]
    /// struct Labels {
    ///     metadata: Meta,
    /// }
    /// #[derive(serde::Deserialize)]
    /// struct Meta {
    ///     #[serde(default)]
    ///     labels: BTreeMap<String, String>,
    /// }
    ///
    /// let writer = StoreWriter::<ConfigMap>::compact();
    /// let mut cm = FakeListWatch::<ConfigMap>::object(Some("ns"), "a");
    /// cm.metadata.labels = Some([("app".to_owned(), "web".to_owned())].into());
    /// writer.insert(Arc::new(cm)).unwrap();
    ///
    /// let labels = writer.store().get_as::<Labels>("ns/a").unwrap().unwrap();
    /// assert_eq!(labels.metadata.labels["app"], "web");
    /// assert!(writer.store().get_as::<Labels>("ns/b").unwrap().is_none());
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Projection`] when the object does not read as `T` (a field of `T` that the
    /// object holds in another shape, or a required one it lacks); `Ok(None)` when nothing
    /// is stored under `key`.
    pub fn get_as<T: DeserializeOwned>(&self, key: impl AsRef<str>) -> Result<Option<T>, Error>
    where
        K: Serialize,
    {
        let taken = {
            let st = self.read();
            let Some((key, slot)) = st.objects.get_key_value(key.as_ref()) else {
                return Ok(None);
            };
            (key.clone(), slot.take())
        };
        self.project(taken).map(Some)
    }

    /// Every object, read as `T` (see [`get_as`](Self::get_as)), in no particular order.
    ///
    /// # Errors
    ///
    /// [`Error::Projection`] for the first object that does not read as `T`.
    pub fn list_as<T: DeserializeOwned>(&self) -> Result<Vec<T>, Error>
    where
        K: Serialize,
    {
        self.snapshot()
            .into_iter()
            .map(|taken| self.project(taken))
            .collect()
    }

    /// The objects whose index `index` contains `value`, read as `T` (see
    /// [`get_as`](Self::get_as)).
    ///
    /// # Errors
    ///
    /// [`Error::IndexNotFound`] when no index is named `index`; [`Error::Projection`] for
    /// the first object that does not read as `T`.
    pub fn by_index_as<T: DeserializeOwned>(
        &self,
        index: &str,
        value: &str,
    ) -> Result<Vec<T>, Error>
    where
        K: Serialize,
    {
        self.index_slots(index, value)?
            .into_iter()
            .map(|taken| self.project(taken))
            .collect()
    }

    /// The object of a taken slot read as `T`: straight from the server's bytes when the
    /// slot holds them, else through the decoded object's JSON.
    fn project<T: DeserializeOwned>(&self, (key, taken): (ObjectKey, Taken<K>)) -> Result<T, Error>
    where
        K: Serialize,
    {
        let wire = match &taken {
            Taken::Encoded { body, .. } => body.wire(),
            Taken::Decoded(_) => None,
        };
        let read = match wire {
            Some((format, bytes)) => format.decode::<T>(bytes),
            None => match self.resolve(&key, taken, Recent::Pass) {
                Some(object) => serde_json::to_value(&*object)
                    .and_then(serde_json::from_value)
                    .map_err(BoxError::from),
                None => Err("the stored object does not decode".into()),
            },
        };
        read.map_err(|source| Error::Projection {
            key: key.to_string(),
            target: std::any::type_name::<T>(),
            source,
        })
    }
}
