//! Every read of every kind of store against a model: random objects written by random
//! watch events, deletes and relists, then read by key, whole, by index, by namespace and
//! by random label selectors. Each read must return exactly what the model (the objects
//! as written, fully decoded) holds, whatever the store kept them as.

use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::{
    api::core::v1::ConfigMap,
    apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry},
};
use kube_core::ObjectMeta;
use rand::{Rng, SeedableRng, rngs::StdRng, seq::IndexedRandom};

use crate::codec::JsonCodec;

use super::{Arrival, Operator, Requirement, Selector, WorkingSet, Writer, label_index};
use crate::{
    key::ObjectKey,
    list_watch::{
        RawFormat, RawObject,
        test_encoder::{Msg, config_maps},
    },
};

const NAMESPACES: [&str; 3] = ["a", "b", "c"];
const LABEL_KEYS: [&str; 4] = ["app", "tier", "canary", "zone"];
const LABEL_VALUES: [&str; 4] = ["web", "db", "x", ""];

/// The kinds of store under test, each with a name for failure messages.
fn stores() -> Vec<(&'static str, Writer<ConfigMap>)> {
    vec![
        ("decoded", Writer::new()),
        ("compact", Writer::compact()),
        // Small enough that reads and writes evict all the time.
        (
            "compact, 3 objects hot",
            Writer::compact_with(WorkingSet::budget(3 * 2_000)),
        ),
        (
            "compact, no working set",
            Writer::compact_with(WorkingSet::off()),
        ),
        (
            "codec",
            Writer::with_codec(Arc::new(JsonCodec), WorkingSet::budget(8_000)),
        ),
    ]
}

struct World {
    rng: StdRng,
    version: u64,
}

impl World {
    fn object(&mut self) -> Arc<ConfigMap> {
        let namespace = *NAMESPACES.choose(&mut self.rng).unwrap();
        let name = format!("o{}", self.rng.random_range(0..24));
        self.version += 1;
        let mut labels = BTreeMap::new();
        for key in LABEL_KEYS {
            if self.rng.random_bool(0.6) {
                labels.insert(key.to_owned(), self.value());
            }
        }
        // Field sets from a small pool, so that stores meet each more than once.
        let managed_fields = self.rng.random_bool(0.7).then(|| {
            (0..self.rng.random_range(1..3))
                .map(|i| ManagedFieldsEntry {
                    manager: Some(format!("m{i}")),
                    operation: Some("Apply".to_owned()),
                    fields_type: Some("FieldsV1".to_owned()),
                    fields_v1: self.rng.random_bool(0.9).then(|| {
                        let key = *LABEL_KEYS.choose(&mut self.rng).unwrap();
                        FieldsV1(serde_json::json!({
                            "f:metadata": { "f:labels": { ".": {}, format!("f:{key}"): {} } }
                        }))
                    }),
                    ..Default::default()
                })
                .collect()
        });
        let data = (0..self.rng.random_range(0..4))
            .map(|i| (format!("k{i}"), "v".repeat(self.rng.random_range(0..40))))
            .collect();
        Arc::new(ConfigMap {
            metadata: ObjectMeta {
                namespace: Some(namespace.to_owned()),
                name: Some(name),
                resource_version: Some(self.version.to_string()),
                labels: (!labels.is_empty() || self.rng.random_bool(0.5)).then_some(labels),
                managed_fields,
                ..Default::default()
            },
            data: Some(data),
            ..Default::default()
        })
    }

    /// The object's bytes as the server would have sent them, two times in three: in
    /// protobuf where it has one (empty maps do not survive protobuf), else in JSON.
    fn raw(&mut self, obj: &ConfigMap) -> Option<RawObject> {
        if self.rng.random_bool(1.0 / 3.0) {
            return None;
        }
        let empty_map = |map: Option<&BTreeMap<String, String>>| map.is_some_and(|m| m.is_empty());
        if self.rng.random_bool(0.5)
            || empty_map(obj.metadata.labels.as_ref())
            || empty_map(obj.data.as_ref())
        {
            return Some(RawObject::new(
                serde_json::to_vec(obj).unwrap().into(),
                RawFormat::Json,
            ));
        }
        let format = RawFormat::Protobuf {
            resource: config_maps(),
            typed: false,
        };
        let bytes = protobuf(obj);
        let decoded: ConfigMap = format.decode(&bytes).unwrap();
        assert_eq!(&decoded, obj, "the test's protobuf writer");
        Some(RawObject::new(bytes.into(), format))
    }

    fn value(&mut self) -> String {
        (*LABEL_VALUES.choose(&mut self.rng).unwrap()).to_owned()
    }

    fn selector(&mut self) -> Selector {
        let mut requirements = Vec::new();
        for _ in 0..self.rng.random_range(0..3) {
            let key = (*LABEL_KEYS.choose(&mut self.rng).unwrap()).to_owned();
            // Sets of values hold no empty one: the selector grammar has no way to write it.
            let set_value = |world: &mut Self| match world.value() {
                v if v.is_empty() => "web".to_owned(),
                v => v,
            };
            let operator = match self.rng.random_range(0..6) {
                0 => Operator::Equals(self.value()),
                1 => Operator::NotEquals(self.value()),
                2 => Operator::In([set_value(self), set_value(self)].into()),
                3 => Operator::NotIn([set_value(self)].into()),
                4 => Operator::Exists,
                _ => Operator::DoesNotExist,
            };
            requirements.push(Requirement { key, operator }.to_string());
        }
        requirements.join(",").parse().unwrap()
    }
}

/// `obj` in protobuf, as a list item: the fields [`World::object`] sets.
fn protobuf(obj: &ConfigMap) -> Vec<u8> {
    let meta = &obj.metadata;
    let mut metadata = Msg::new()
        .str(1, meta.name.as_deref().unwrap())
        .str(3, meta.namespace.as_deref().unwrap())
        .str(6, meta.resource_version.as_deref().unwrap());
    for (key, value) in meta.labels.iter().flatten() {
        metadata = metadata.entry(11, key, Some(value.as_bytes()));
    }
    for entry in meta.managed_fields.iter().flatten() {
        let mut encoded = Msg::new()
            .str(1, entry.manager.as_deref().unwrap())
            .str(2, entry.operation.as_deref().unwrap())
            .str(6, entry.fields_type.as_deref().unwrap());
        if let Some(set) = &entry.fields_v1 {
            encoded = encoded.msg(
                7,
                &Msg::new().bytes(1, &serde_json::to_vec(&set.0).unwrap()),
            );
        }
        metadata = metadata.msg(17, &encoded);
    }
    let mut config_map = Msg::new().msg(1, &metadata);
    for (key, value) in obj.data.iter().flatten() {
        config_map = config_map.entry(2, key, Some(value.as_bytes()));
    }
    config_map.0
}

fn sorted(mut objects: Vec<Arc<ConfigMap>>) -> Vec<Arc<ConfigMap>> {
    objects.sort_by_key(|o| ObjectKey::from_object(&**o).unwrap());
    objects
}

fn labels(obj: &ConfigMap) -> BTreeMap<String, String> {
    obj.metadata.labels.clone().unwrap_or_default()
}

/// Every read of `store` against `model`.
fn check_reads(
    name: &str,
    world: &mut World,
    store: &Writer<ConfigMap>,
    model: &BTreeMap<ObjectKey, Arc<ConfigMap>>,
) {
    let all: Vec<Arc<ConfigMap>> = model.values().cloned().collect();
    assert_eq!(sorted(store.list()), all, "{name}: list");
    assert_eq!(sorted(store.iter().collect()), all, "{name}: iter");
    assert_eq!(store.len(), model.len(), "{name}: len");
    for key in model.keys().take(8) {
        assert_eq!(
            store.get_by_key(key),
            model.get(key).cloned(),
            "{name}: get {key}"
        );
        // A second read may come from the working set: the same object.
        assert_eq!(
            store.get_by_key(key),
            model.get(key).cloned(),
            "{name}: get {key} again"
        );
    }
    assert!(store.get_by_key("a/absent").is_none());
    for _ in 0..4 {
        let selector = world.selector();
        let expected: Vec<_> = all
            .iter()
            .filter(|o| selector.matches(&labels(o)))
            .cloned()
            .collect();
        assert_eq!(
            sorted(store.list_selector(&selector)),
            expected,
            "{name}: list_selector {selector}"
        );
        let namespace = *NAMESPACES.choose(&mut world.rng).unwrap();
        let in_namespace: Vec<_> = expected
            .iter()
            .filter(|o| o.metadata.namespace.as_deref() == Some(namespace))
            .cloned()
            .collect();
        assert_eq!(
            sorted(store.list_namespace_selector(namespace, &selector)),
            in_namespace,
            "{name}: list_namespace_selector {namespace} {selector}"
        );
    }
    for value in LABEL_VALUES {
        let expected: Vec<_> = all
            .iter()
            .filter(|o| labels(o).get("app").map(String::as_str) == Some(value))
            .cloned()
            .collect();
        assert_eq!(
            sorted(store.by_index("app", value).unwrap()),
            expected,
            "{name}: by_index app={value}"
        );
    }
    let versions: BTreeMap<ObjectKey, String> = store.key_versions().into_iter().collect();
    let expected: BTreeMap<ObjectKey, String> = model
        .iter()
        .map(|(k, o)| (k.clone(), o.metadata.resource_version.clone().unwrap()))
        .collect();
    assert_eq!(versions, expected, "{name}: key_versions");
    store.check_invariants().unwrap();
}

fn run(seed: u64) {
    for (name, store) in stores() {
        store.add_indexer("app", label_index("app")).unwrap();
        let mut world = World {
            rng: StdRng::seed_from_u64(seed),
            version: 0,
        };
        let mut model = BTreeMap::new();
        let mut listed_once = false;
        for step in 0..300 {
            match world.rng.random_range(0..10) {
                0..=5 => {
                    let obj = world.object();
                    let key = ObjectKey::from_object(&*obj).unwrap();
                    let raw = world.raw(&obj);
                    let arrival = if world.rng.random_bool(0.8) {
                        Arrival::Watched
                    } else {
                        Arrival::Listed
                    };
                    let old = store.insert_keyed(key.clone(), obj.clone(), raw, arrival);
                    assert_eq!(old, model.insert(key, obj), "{name}: step {step}: old");
                }
                6 | 7 => {
                    let Some(key) = model.keys().nth(world.rng.random_range(0..=model.len()))
                    else {
                        continue;
                    };
                    let key = key.clone();
                    assert_eq!(store.remove(&key), model.remove(&key), "{name}: remove");
                }
                8 => {
                    // A relist: some objects kept as they are, some changed, some gone,
                    // some new; half of the time abandoned once part-way first.
                    let mut listed: BTreeMap<ObjectKey, Arc<ConfigMap>> = model
                        .iter()
                        .filter(|_| world.rng.random_bool(0.7))
                        .map(|(k, o)| (k.clone(), o.clone()))
                        .collect();
                    for _ in 0..world.rng.random_range(0..6) {
                        let obj = world.object();
                        listed.insert(ObjectKey::from_object(&*obj).unwrap(), obj);
                    }
                    if world.rng.random_bool(0.5) {
                        store.start_list();
                        for (key, obj) in listed.iter().take(3) {
                            let raw = world.raw(obj);
                            store.list_object(key.clone(), obj.clone(), raw);
                        }
                        if listed_once {
                            // A relist abandoned part-way changed nothing.
                            check_reads(name, &mut world, &store, &model);
                        }
                    }
                    store.start_list();
                    for (key, obj) in &listed {
                        let raw = world.raw(obj);
                        store.list_object(key.clone(), obj.clone(), raw);
                    }
                    store.finish_list();
                    listed_once = true;
                    model = listed;
                }
                _ => check_reads(name, &mut world, &store, &model),
            }
        }
        check_reads(name, &mut world, &store, &model);
    }
}

#[test]
fn every_read_of_every_store_returns_what_a_full_decode_would() {
    for seed in 0..12 {
        run(seed);
    }
}
