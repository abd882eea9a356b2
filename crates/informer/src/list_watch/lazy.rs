//! Objects whose metadata is read on arrival and whose body when asked for. The full
//! documentation is on [`LazyObject`].

use std::{any::type_name, borrow::Cow, collections::BTreeMap, fmt, marker::PhantomData};

use bytes::Bytes;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube_core::Resource;
use serde::{
    Deserialize, Deserializer, Serialize, Serializer,
    de::{self, DeserializeOwned, Visitor},
    ser,
};
use serde_json::value::RawValue;

use super::{
    LAZY_OBJECT_TOKEN,
    protobuf::{deserializer::from_message, schema::Resource as ProtobufResource},
    raw::{RawFormat, RawObject},
};
use crate::{error::Error, key::ObjectKey};

/// An object of kind `K` whose metadata is decoded when it arrives and whose body (spec,
/// status, `managedFields`) only when [`decode`](Self::decode) asks for it.
///
/// An informer of `LazyObject<Pod>` instead of `Pod` lists, watches, caches and indexes
/// the same Pods, but what arrives is read only as far as the metadata: keys, labels,
/// annotations, owners, finalizers, generation and resourceVersion are there at once, through
/// [`Resource::meta`], for index functions, handlers, predicates and
/// [`add_key_handler`](crate::InformerHandle::add_key_handler). A controller that queues keys and reads a few
/// fields of the objects it reconciles never builds the rest, so syncing costs the
/// metadata's decoding instead of every object's, and a handler that does need the whole
/// object calls [`decode`](Self::decode) (or [`decode_as`](Self::decode_as) for the fields
/// it reads).
///
/// The bytes are the server's, kept as they came: protobuf for built-in kinds read by
/// [`ApiListWatch`](crate::list_watch::ApiListWatch), JSON otherwise (`LazyObject` reads from
/// serde_json, whose text it keeps, and from the protobuf the API server sends). The
/// metadata is all of `metadata` but `managedFields`, the largest part of most objects'
/// metadata, which stays in the bytes: `meta().managed_fields` is `None` and
/// [`decode`](Self::decode) returns them.
///
/// What is deferred can fail late: the metadata must decode for an object to arrive at all
/// (else it is [undecodable](crate::list_watch::Undecodable), as for `K`), but a body that does not
/// decode as `K` is an error of [`decode`](Self::decode), not of the list or watch.
///
/// ```
/// use k8s_openapi::api::core::v1::Pod;
/// use kube_client::{Api, Client};
/// use kube_informer::{list_watch::LazyObject, SharedInformer, handler_fn, store::label_index};
///
/// # async fn f(client: Client) -> Result<(), kube_informer::Error> {
/// let informer = SharedInformer::builder(Api::<LazyObject<Pod>>::all(client))
///     .index_fn("app", label_index("app"))
///     .build();
/// informer.add_handler(handler_fn().on_add(|pod: &std::sync::Arc<LazyObject<Pod>>, _| {
///     // The metadata is decoded; the spec waits until something asks for it.
///     println!("{:?} {:?}", pod.metadata.name, pod.metadata.labels);
/// }))?;
/// let informer = informer.spawn(Default::default());
/// informer.wait_synced_or_fatal().await?;
/// if let Some(pod) = informer.store().get_by_key("default/web") {
///     let pod: Pod = pod.decode()?;
///     println!("{:?}", pod.spec.map(|s| s.containers.len()));
/// }
/// # Ok(()) }
/// ```
pub struct LazyObject<K> {
    /// The object's metadata, but its `managedFields`.
    pub metadata: ObjectMeta,
    raw: RawObject,
    kind: PhantomData<fn() -> K>,
}

/// An object's `metadata` but its `managedFields`: what a [`LazyObject`] reads on arrival.
/// Its own type, so that the decoders skip `managedFields` where they lie.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Metadata {
    annotations: Option<BTreeMap<String, String>>,
    creation_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
    generate_name: Option<String>,
    generation: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    name: Option<String>,
    namespace: Option<String>,
    owner_references: Option<Vec<OwnerReference>>,
    resource_version: Option<String>,
    self_link: Option<String>,
    uid: Option<String>,
}

/// The object as far as a [`LazyObject`] reads it on arrival.
#[derive(Deserialize)]
struct Head {
    metadata: Option<Metadata>,
}

impl From<Metadata> for ObjectMeta {
    fn from(m: Metadata) -> Self {
        ObjectMeta {
            annotations: m.annotations,
            creation_timestamp: m.creation_timestamp,
            deletion_grace_period_seconds: m.deletion_grace_period_seconds,
            deletion_timestamp: m.deletion_timestamp,
            finalizers: m.finalizers,
            generate_name: m.generate_name,
            generation: m.generation,
            labels: m.labels,
            managed_fields: None,
            name: m.name,
            namespace: m.namespace,
            owner_references: m.owner_references,
            resource_version: m.resource_version,
            self_link: m.self_link,
            uid: m.uid,
        }
    }
}

impl<K> LazyObject<K> {
    fn new(head: Head, raw: RawObject) -> Self {
        Self {
            metadata: head.metadata.map(ObjectMeta::from).unwrap_or_default(),
            raw,
            kind: PhantomData,
        }
    }

    /// The bytes the object arrived in.
    pub fn raw(&self) -> &RawObject {
        &self.raw
    }

    /// The object, read from its bytes as `T`: a projection of the fields a caller needs,
    /// which costs those fields (as [`Store::get_as`](crate::Store::get_as) does), or
    /// `serde_json::Value`. Reads the bytes as they came: an edit of
    /// [`metadata`](Self::metadata) is not in it.
    ///
    /// # Errors
    ///
    /// [`Error::Projection`] when the object does not read as `T`: `T` declares a field
    /// the object has in another shape, or requires one it lacks.
    pub fn decode_as<T: DeserializeOwned>(&self) -> Result<T, Error> {
        self.raw
            .format()
            .decode(self.raw.as_bytes())
            .map_err(|source| Error::Projection {
                key: self.key().to_string(),
                target: type_name::<T>(),
                source,
            })
    }

    fn key(&self) -> ObjectKey {
        let name = self.metadata.name.as_deref().unwrap_or_default();
        ObjectKey::new(self.metadata.namespace.as_deref(), name)
    }

    /// The bytes' metadata replaced by [`metadata`](Self::metadata), `managedFields` kept
    /// from the bytes unless `metadata` sets its own: what [`decode`](Self::decode)
    /// returns and `Serialize` writes.
    fn with_metadata(&self, bytes_metadata: &mut ObjectMeta) {
        let managed_fields = bytes_metadata.managed_fields.take();
        *bytes_metadata = self.metadata.clone();
        if bytes_metadata.managed_fields.is_none() {
            bytes_metadata.managed_fields = managed_fields;
        }
    }
}

impl<K: Resource + DeserializeOwned> LazyObject<K> {
    /// The whole object, decoded from its bytes now. Its metadata is
    /// [`metadata`](Self::metadata) (with the bytes' `managedFields`), so an edit made
    /// to it, by a transform for instance, is in the object.
    ///
    /// # Errors
    ///
    /// [`Error::Projection`] when the bytes do not decode as `K`.
    pub fn decode(&self) -> Result<K, Error> {
        let mut object: K = self.decode_as()?;
        self.with_metadata(object.meta_mut());
        Ok(object)
    }
}

impl<K> Clone for LazyObject<K> {
    fn clone(&self) -> Self {
        Self {
            metadata: self.metadata.clone(),
            raw: self.raw.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> fmt::Debug for LazyObject<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LazyObject")
            .field("kind", &type_name::<K>())
            .field("metadata", &self.metadata)
            .field("raw", &self.raw)
            .finish()
    }
}

impl<K: Resource> Resource for LazyObject<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }

    fn api_version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::api_version(dt)
    }

    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl<'de, K> Deserialize<'de> for LazyObject<K>
where
    K: Resource,
    K::DynamicType: Default,
{
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_newtype_struct(LAZY_OBJECT_TOKEN, LazyVisitor(PhantomData))
    }
}

struct LazyVisitor<K>(PhantomData<fn() -> K>);

impl<'de, K> Visitor<'de> for LazyVisitor<K>
where
    K: Resource,
    K::DynamicType: Default,
{
    type Value = LazyObject<K>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a {} object", K::kind(&K::DynamicType::default()))
    }

    /// The protobuf deserializer's answer: the message's bytes.
    fn visit_bytes<E: de::Error>(self, bytes: &[u8]) -> Result<Self::Value, E> {
        let dt = K::DynamicType::default();
        let resource = ProtobufResource::find(&K::group(&dt), &K::version(&dt), &K::plural(&dt))
            .ok_or_else(|| {
                E::custom(format!(
                    "protobuf for {}, a kind the protobuf table does not have",
                    K::kind(&dt)
                ))
            })?;
        let head: Head = from_message(bytes, resource.item, None).map_err(E::custom)?;
        let format = RawFormat::Protobuf {
            resource,
            typed: true,
        };
        Ok(LazyObject::new(
            head,
            RawObject::new(Bytes::copy_from_slice(bytes), format),
        ))
    }

    /// Any other deserializer's: the object, kept as serde_json's text of it.
    fn visit_newtype_struct<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        let text = Box::<RawValue>::deserialize(deserializer)?;
        let head: Head = serde_json::from_str(text.get()).map_err(de::Error::custom)?;
        let text: Box<str> = text.into();
        Ok(LazyObject::new(
            head,
            RawObject::new(Bytes::from(text.into_boxed_bytes()), RawFormat::Json),
        ))
    }
}

/// Writes the object as [`decode`](LazyObject::decode) returns it, in the JSON shape of `K`.
impl<K> Serialize for LazyObject<K> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut object: serde_json::Value = self.decode_as().map_err(ser::Error::custom)?;
        if let Some(fields) = object.as_object_mut() {
            let mut metadata: ObjectMeta = fields
                .get("metadata")
                .map(|m| serde_json::from_value(m.clone()))
                .transpose()
                .map_err(ser::Error::custom)?
                .unwrap_or_default();
            self.with_metadata(&mut metadata);
            let metadata = serde_json::to_value(metadata).map_err(ser::Error::custom)?;
            fields.insert("metadata".to_owned(), metadata);
        }
        object.serialize(serializer)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ConfigMap, Pod};
    use serde_json::json;

    use super::*;
    use crate::list_watch::protobuf::test_encoder::{Msg, pods};

    /// A Pod in protobuf: metadata with a label and `managedFields`, one container.
    fn pod_message() -> Msg {
        let fields_v1 = Msg::new().bytes(1, br#"{"f:metadata":{"f:labels":{}}}"#);
        let managed = Msg::new()
            .str(1, "kubectl")
            .str(2, "Apply")
            .msg(7, &fields_v1);
        let label = Msg::new().str(1, "app").str(2, "web");
        let metadata = Msg::new()
            .str(1, "web-0")
            .str(3, "default")
            .str(6, "42")
            .msg(11, &label)
            .msg(17, &managed);
        let container = Msg::new().str(1, "nginx").str(2, "nginx:1.29");
        Msg::new()
            .msg(1, &metadata)
            .msg(2, &Msg::new().msg(2, &container))
    }

    fn lazy_from_protobuf(message: &Msg) -> LazyObject<Pod> {
        RawFormat::Protobuf {
            resource: pods(),
            typed: false,
        }
        .decode(&message.0)
        .expect("the Pod's metadata decodes")
    }

    #[test]
    fn protobuf_arrives_with_its_metadata_and_decodes_whole_on_demand() {
        let message = pod_message();
        let lazy = lazy_from_protobuf(&message);
        assert_eq!(lazy.metadata.name.as_deref(), Some("web-0"));
        assert_eq!(lazy.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(lazy.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(
            lazy.metadata.labels,
            Some(BTreeMap::from([("app".to_owned(), "web".to_owned())]))
        );
        assert_eq!(lazy.metadata.managed_fields, None);
        assert_eq!(lazy.raw().as_bytes(), &message.0[..]);

        let whole: Pod = RawFormat::Protobuf {
            resource: pods(),
            typed: false,
        }
        .decode(&message.0)
        .unwrap();
        assert_eq!(lazy.decode().unwrap(), whole);
        let managed = whole.metadata.managed_fields.as_deref().unwrap_or_default();
        assert_eq!(managed.len(), 1, "the test Pod has managedFields");
    }

    #[test]
    fn json_arrives_with_its_metadata_and_keeps_its_text() {
        let text = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "settings",
                "namespace": "default",
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "web-0", "uid": "u1"}],
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
            },
            "data": {"mode": "fast"},
        })
        .to_string();
        let lazy: LazyObject<ConfigMap> = serde_json::from_str(&text).unwrap();
        assert_eq!(lazy.raw().as_bytes(), text.as_bytes());
        assert_eq!(
            lazy.metadata.owner_references.as_ref().map(Vec::len),
            Some(1)
        );
        assert_eq!(lazy.metadata.managed_fields, None);
        let whole: ConfigMap = serde_json::from_str(&text).unwrap();
        assert_eq!(lazy.decode().unwrap(), whole);
        assert_eq!(
            serde_json::to_value(&lazy).unwrap(),
            serde_json::to_value(&whole).unwrap()
        );
    }

    #[test]
    fn a_body_that_does_not_decode_is_an_error_of_decode_naming_the_object() {
        // `data` of the wrong shape: the metadata reads, the ConfigMap does not.
        let text = r#"{"metadata":{"name":"bad","namespace":"ns"},"data":[1]}"#;
        let lazy: LazyObject<ConfigMap> = serde_json::from_str(text).unwrap();
        assert_eq!(lazy.metadata.name.as_deref(), Some("bad"));
        let error = lazy.decode().unwrap_err();
        assert!(
            matches!(&error, Error::Projection { key, .. } if key == "ns/bad"),
            "{error}"
        );
        assert!(serde_json::to_vec(&lazy).is_ok(), "the text itself is JSON");
    }

    #[test]
    fn metadata_that_does_not_decode_is_an_error_on_arrival() {
        let text = r#"{"metadata":{"name":7}}"#;
        assert!(serde_json::from_str::<LazyObject<ConfigMap>>(text).is_err());
        let bad_name = Msg::new().msg(1, &Msg::new().varint(1, 7));
        assert!(
            RawFormat::Protobuf {
                resource: pods(),
                typed: false
            }
            .decode::<LazyObject<Pod>>(&bad_name.0)
            .is_err()
        );
    }

    #[test]
    fn an_edit_of_the_metadata_is_in_the_decoded_and_the_serialized_object() {
        let mut lazy = lazy_from_protobuf(&pod_message());
        lazy.meta_mut()
            .labels
            .get_or_insert_default()
            .insert("edited".to_owned(), "yes".to_owned());
        let pod = lazy.decode().unwrap();
        assert_eq!(pod.metadata.labels, lazy.metadata.labels);
        assert_eq!(
            pod.metadata.managed_fields.as_ref().map(Vec::len),
            Some(1),
            "managedFields stay the bytes'"
        );
        let written = serde_json::to_value(&lazy).unwrap();
        assert_eq!(written["metadata"]["labels"]["edited"], "yes");
        assert_eq!(written["spec"]["containers"][0]["image"], "nginx:1.29");
        let read_back: Pod = serde_json::from_value(written).unwrap();
        assert_eq!(read_back, pod);
    }

    #[test]
    fn the_resource_is_the_kinds() {
        assert_eq!(LazyObject::<Pod>::kind(&()), "Pod");
        assert_eq!(
            LazyObject::<Pod>::url_path(&(), Some("ns")),
            Pod::url_path(&(), Some("ns"))
        );
    }
}
