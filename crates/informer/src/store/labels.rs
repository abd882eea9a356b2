//! The labels a compact store keeps beside each object's bytes: read once, when the object
//! arrives decoded, so that a label selector is matched without decoding any object.
//!
//! Label pairs repeat across objects (every Pod of a ReplicaSet carries the same ones), so
//! each distinct `key=value` is kept once, shared by the objects that carry it.

use std::{collections::BTreeMap, hash::BuildHasher, sync::Arc};

use hashbrown::HashTable;

use super::{
    KeyHasher,
    selector::{Operator, Requirement, Selector},
};

/// One `key=value` pair, shared by every stored object that carries it.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Label {
    key: Box<str>,
    value: Box<str>,
}

/// An object's labels, sorted by key.
#[derive(Clone, Debug, Default)]
pub(super) struct Labels(Box<[Arc<Label>]>);

impl Labels {
    /// The `key=value` pairs, sorted by key.
    pub(super) fn pairs(&self) -> impl ExactSizeIterator<Item = (&str, &str)> {
        self.0.iter().map(|l| (&*l.key, &*l.value))
    }

    /// The value of label `key`, if the object has it.
    pub(super) fn get(&self, key: &str) -> Option<&str> {
        let at = self.0.binary_search_by(|l| (*l.key).cmp(key)).ok()?;
        Some(&self.0[at].value)
    }

    /// Whether the object carries `label` (the interned pair itself).
    fn has(&self, label: &Arc<Label>) -> bool {
        self.0.iter().any(|l| Arc::ptr_eq(l, label))
    }

    #[cfg(test)]
    pub(super) fn to_map(&self) -> BTreeMap<String, String> {
        self.0
            .iter()
            .map(|l| (l.key.to_string(), l.value.to_string()))
            .collect()
    }
}

/// The distinct labels of a store's objects. Lives with the store's writer: only writes
/// intern labels, and readers only read the [`Labels`] already in the slots.
#[derive(Default)]
pub(super) struct LabelInterner {
    hasher: KeyHasher,
    labels: HashTable<Arc<Label>>,
    /// The table's size at which the next sweep runs: twice its size after the last one,
    /// so the labels no object carries any more take at most as much as the live ones.
    sweep_at: usize,
}

impl LabelInterner {
    /// `labels` as a store keeps them, each pair shared with the objects that carry it.
    pub(super) fn intern(&mut self, labels: Option<&BTreeMap<String, String>>) -> Labels {
        let Some(labels) = labels.filter(|l| !l.is_empty()) else {
            return Labels::default();
        };
        // A BTreeMap iterates in key order, as `Labels::get` needs.
        self.intern_pairs(labels.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }

    /// Labels given as `key=value` pairs of distinct keys, as a store keeps them.
    pub(super) fn intern_pairs<'a>(
        &mut self,
        pairs: impl Iterator<Item = (&'a str, &'a str)>,
    ) -> Labels {
        if self.labels.len() >= self.sweep_at.max(64) {
            self.sweep();
        }
        let mut labels: Box<[Arc<Label>]> = pairs.map(|(k, v)| self.label(k, v)).collect();
        if !labels.is_sorted_by(|a, b| a.key <= b.key) {
            labels.sort_by(|a, b| a.key.cmp(&b.key));
        }
        Labels(labels)
    }

    fn label(&mut self, key: &str, value: &str) -> Arc<Label> {
        let hash = self.hasher.hash_one((key, value));
        let found = self
            .labels
            .find(hash, |l| *l.key == *key && *l.value == *value);
        if let Some(label) = found {
            return label.clone();
        }
        let label = Arc::new(Label {
            key: key.into(),
            value: value.into(),
        });
        let hasher = &self.hasher;
        self.labels.insert_unique(hash, label.clone(), |l| {
            hasher.hash_one((&*l.key, &*l.value))
        });
        label
    }

    fn find(&self, key: &str, value: &str) -> Option<&Arc<Label>> {
        let hash = self.hasher.hash_one((key, value));
        self.labels
            .find(hash, |l| *l.key == *key && *l.value == *value)
    }

    /// `selector` against the labels interned now: a requirement that a label equal one of
    /// some values becomes a comparison with the interned pairs, and one whose pairs no
    /// object carries matches nothing. Read under the same lock as the objects, so the
    /// pairs are the ones their labels point to.
    pub(super) fn matcher<'a>(&'a self, selector: &'a Selector) -> LabelMatcher<'a> {
        let needs = selector
            .requirements()
            .iter()
            .map(|r| {
                let pairs = |values: &mut dyn Iterator<Item = &'a String>| {
                    values
                        .filter_map(|v| self.find(&r.key, v))
                        .collect::<Vec<_>>()
                };
                match &r.operator {
                    Operator::Equals(v) => Need::OneOf(pairs(&mut std::iter::once(v))),
                    Operator::In(set) => Need::OneOf(pairs(&mut set.iter())),
                    _ => Need::Other(r),
                }
            })
            .collect();
        LabelMatcher { needs }
    }

    /// Drops the labels that no stored object carries any more (only the table holds them).
    fn sweep(&mut self) {
        self.labels.retain(|l| Arc::strong_count(l) > 1);
        self.sweep_at = self.labels.len() * 2;
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.labels.len()
    }
}

/// A selector resolved against a store's interned labels (see [`LabelInterner::matcher`]).
pub(super) struct LabelMatcher<'a> {
    needs: Vec<Need<'a>>,
}

enum Need<'a> {
    /// One of these pairs (none: nothing matches).
    OneOf(Vec<&'a Arc<Label>>),
    /// Any other requirement, checked against the value under its key.
    Other(&'a Requirement),
}

impl LabelMatcher<'_> {
    /// Whether an object whose labels are `labels` matches.
    pub(super) fn matches(&self, labels: &Labels) -> bool {
        self.needs.iter().all(|need| match need {
            Need::OneOf(pairs) => pairs.iter().any(|p| labels.has(p)),
            Need::Other(r) => r.matches_value(labels.get(&r.key)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn objects_with_the_same_label_share_it() {
        let mut interner = LabelInterner::default();
        let a = interner.intern(Some(&map(&[("app", "web"), ("tier", "front")])));
        let b = interner.intern(Some(&map(&[("app", "web"), ("tier", "back")])));
        assert_eq!(interner.len(), 3);
        assert!(Arc::ptr_eq(&a.0[0], &b.0[0]));
        assert_eq!(a.get("app"), Some("web"));
        assert_eq!(b.get("tier"), Some("back"));
        assert_eq!(a.get("zone"), None);
        assert_eq!(a.to_map(), map(&[("app", "web"), ("tier", "front")]));
        assert!(interner.intern(None).get("app").is_none());
        assert!(interner.intern(Some(&BTreeMap::new())).0.is_empty());
    }

    #[test]
    fn labels_no_object_carries_are_swept() {
        let mut interner = LabelInterner::default();
        let kept = interner.intern(Some(&map(&[("app", "kept")])));
        for i in 0..1000 {
            // Each dropped at once, as a replaced object's labels are.
            drop(interner.intern(Some(&map(&[("version", &i.to_string())]))));
        }
        assert!(
            interner.len() <= 130,
            "{} labels held for 1 live one",
            interner.len()
        );
        let again = interner.intern(Some(&map(&[("app", "kept")])));
        assert!(Arc::ptr_eq(&kept.0[0], &again.0[0]), "a live label is kept");
    }
}
