//! Label selectors parsed from text (`app=web,tier in (a,b),!canary`), as an informer's
//! or a lister's selector is.
//!
//! Input: the selector's text (bytes that are not UTF-8 are replaced).
//!
//! Checked, beyond not panicking: a parsed selector prints as text that parses back to
//! it, and prints the same again; every key and value it holds is one Kubernetes allows;
//! it matches exactly the label sets Kubernetes' rules say it matches, and so does the
//! same selector built as a `LabelSelector`; a refusal points at a place in the text; what
//! parsing holds at once is proportional to the text.

#![no_main]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube_informer::{
    Selector,
    store::{Operator, Requirement},
};
use kube_informer_fuzz::{assert_bounded, peak_allocation};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (parsed, peak) = peak_allocation(|| Selector::parse(&text));
    assert_bounded("parsing", peak, text.len(), 64);
    let selector = match parsed {
        Ok(selector) => selector,
        Err(error) => {
            assert_eq!(error.input, text, "the refusal quotes the text");
            assert!(
                text.is_char_boundary(error.position),
                "the refusal points into the text: {error}"
            );
            return;
        }
    };

    let printed = selector.to_string();
    let again = Selector::parse(&printed)
        .unwrap_or_else(|e| panic!("{text:?} printed as {printed:?}, which does not parse: {e}"));
    assert_eq!(again, selector, "{text:?} printed as {printed:?}");
    assert_eq!(again.to_string(), printed, "printed twice");

    for requirement in selector.requirements() {
        assert!(valid_key(&requirement.key), "key {:?}", requirement.key);
        let values: Vec<&String> = match &requirement.operator {
            Operator::Equals(v) | Operator::NotEquals(v) => vec![v],
            Operator::In(set) | Operator::NotIn(set) => {
                assert!(!set.is_empty(), "a set without values");
                set.iter().collect()
            }
            Operator::Exists | Operator::DoesNotExist => Vec::new(),
        };
        for value in values {
            assert!(
                valid_value(value),
                "value {value:?} of {:?}",
                requirement.key
            );
        }
    }

    let built = Selector::from_label_selector(&as_label_selector(&selector))
        .expect("a parsed selector is a valid LabelSelector");
    for labels in label_sets(&selector) {
        let expected = selector.requirements().iter().all(|r| holds(r, &labels));
        assert_eq!(
            selector.matches(&labels),
            expected,
            "{printed:?} on {labels:?}"
        );
        assert_eq!(built.matches(&labels), expected, "built, on {labels:?}");
    }
});

/// A name: at most 63 characters, alphanumeric at both ends, `-_.` and alphanumerics within.
fn valid_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// `[prefix/]name`, the prefix a DNS subdomain: lowercase labels of `a-z0-9-`, no label
/// starting or ending with `-`, 253 characters at most.
fn valid_key(key: &str) -> bool {
    match key.split_once('/') {
        None => valid_name(key),
        Some((prefix, name)) => {
            prefix.len() <= 253
                && prefix.split('.').all(|label| {
                    !label.is_empty()
                        && !label.starts_with('-')
                        && !label.ends_with('-')
                        && label
                            .bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                })
                && valid_name(name)
        }
    }
}

fn valid_value(value: &str) -> bool {
    value.is_empty() || valid_name(value)
}

/// Whether `labels` satisfy `requirement`, by Kubernetes' rules: `!=` and `notin` hold for
/// an absent label, `=` and `in` do not.
fn holds(requirement: &Requirement, labels: &BTreeMap<String, String>) -> bool {
    let value = labels.get(&requirement.key);
    match &requirement.operator {
        Operator::Equals(v) => value == Some(v),
        Operator::NotEquals(v) => value != Some(v),
        Operator::In(set) => value.is_some_and(|v| set.contains(v)),
        Operator::NotIn(set) => value.is_none_or(|v| !set.contains(v)),
        Operator::Exists => value.is_some(),
        Operator::DoesNotExist => value.is_none(),
    }
}

/// `selector` as a `LabelSelector`'s expressions.
fn as_label_selector(selector: &Selector) -> LabelSelector {
    let expressions = selector
        .requirements()
        .iter()
        .map(|r| {
            let (operator, values) = match &r.operator {
                Operator::Equals(v) => ("In", Some(vec![v.clone()])),
                Operator::NotEquals(v) => ("NotIn", Some(vec![v.clone()])),
                Operator::In(set) => ("In", Some(set.iter().cloned().collect())),
                Operator::NotIn(set) => ("NotIn", Some(set.iter().cloned().collect())),
                Operator::Exists => ("Exists", None),
                Operator::DoesNotExist => ("DoesNotExist", None),
            };
            LabelSelectorRequirement {
                key: r.key.clone(),
                operator: operator.to_owned(),
                values,
            }
        })
        .collect();
    LabelSelector {
        match_expressions: Some(expressions),
        match_labels: None,
    }
}

/// Label sets that tell requirements apart: none; each key with each value the selector
/// names and one it does not; every key with its first value.
fn label_sets(selector: &Selector) -> Vec<BTreeMap<String, String>> {
    let candidates = |r: &Requirement| -> Vec<String> {
        let mut values = match &r.operator {
            Operator::Equals(v) | Operator::NotEquals(v) => vec![v.clone()],
            Operator::In(set) | Operator::NotIn(set) => set.iter().cloned().collect(),
            Operator::Exists | Operator::DoesNotExist => Vec::new(),
        };
        values.push("not-named-by-the-selector".to_owned());
        values
    };
    let mut sets = vec![BTreeMap::new()];
    let mut all = BTreeMap::new();
    for requirement in selector.requirements().iter().take(16) {
        let values = candidates(requirement);
        for value in values.iter().take(8) {
            sets.push(BTreeMap::from([(requirement.key.clone(), value.clone())]));
        }
        all.insert(requirement.key.clone(), values[0].clone());
    }
    sets.push(all);
    sets
}
