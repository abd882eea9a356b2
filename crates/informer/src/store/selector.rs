//! Label selectors: parsing (`app=web,tier in (a,b),!canary`) and matching.
//! The full documentation is on [`Selector`].

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    str::FromStr,
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// A label selector that failed to parse: where, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid label selector {input:?} at byte {position}: {message}")]
pub struct SelectorError {
    /// The selector text.
    pub input: String,
    /// Byte offset of the problem.
    pub position: usize,
    /// What is wrong.
    pub message: String,
}

/// The operator of one requirement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Operator {
    /// `key=value` / `key==value`
    Equals(String),
    /// `key!=value`
    NotEquals(String),
    /// `key in (..)`
    In(BTreeSet<String>),
    /// `key notin (..)`
    NotIn(BTreeSet<String>),
    /// `key`
    Exists,
    /// `!key`
    DoesNotExist,
}

/// One requirement of a [`Selector`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requirement {
    /// The label key.
    pub key: String,
    /// What the label must satisfy.
    pub operator: Operator,
}

impl Requirement {
    /// Whether `labels` satisfy this requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.matches_value(labels.get(&self.key).map(String::as_str))
    }

    /// Whether a label whose value is `value` (`None`: absent) satisfies this requirement.
    pub(super) fn matches_value(&self, value: Option<&str>) -> bool {
        match &self.operator {
            Operator::Equals(v) => value == Some(v.as_str()),
            Operator::NotEquals(v) => value != Some(v.as_str()),
            Operator::In(set) => value.is_some_and(|x| set.contains(x)),
            Operator::NotIn(set) => !value.is_some_and(|x| set.contains(x)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
        }
    }
}

/// A parsed label selector; all requirements must hold (AND).
///
/// ```
/// use std::collections::BTreeMap;
/// use kube_informer::Selector;
///
/// let sel: Selector = "app=web, tier in (front,back), !canary".parse().unwrap();
/// let labels: BTreeMap<String, String> =
///     [("app".into(), "web".into()), ("tier".into(), "front".into())].into();
/// assert!(sel.matches(&labels));
/// assert_eq!(sel.to_string(), "app=web,tier in (back,front),!canary");
///
/// let err = "app in (web".parse::<Selector>().unwrap_err();
/// assert!(err.to_string().contains("expected ')'"), "{err}");
/// ```
///
/// Label selectors: parsing (`app=web,tier in (a,b),!canary`) and matching.
///
/// The grammar is Kubernetes': comma-separated requirements, each one of
///
/// | requirement | matches when the label `key` ... |
/// |---|---|
/// | `key=value`, `key==value` | exists and equals `value` |
/// | `key!=value` | is absent or differs from `value` |
/// | `key in (v1,v2)` | exists and is one of the values |
/// | `key notin (v1,v2)` | is absent or none of the values |
/// | `key` | exists |
/// | `!key` | is absent |
///
/// Keys are `[prefix/]name` (prefix a DNS subdomain, name up to 63 characters of
/// `[A-Za-z0-9-_.]` starting and ending alphanumeric); values are empty or follow the name
/// rule. The empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

impl Selector {
    /// The selector that matches everything.
    pub fn everything() -> Self {
        Self::default()
    }

    /// Parses a selector string.
    ///
    /// # Errors
    ///
    /// [`SelectorError`] with the byte offset and a description of the problem.
    pub fn parse(input: &str) -> Result<Self, SelectorError> {
        Parser { input, pos: 0 }.selector()
    }

    /// Builds a selector from a Kubernetes `LabelSelector` (`matchLabels` and
    /// `matchExpressions`).
    ///
    /// # Errors
    ///
    /// [`SelectorError`] for an unknown operator, or values that the operator does not allow.
    pub fn from_label_selector(selector: &LabelSelector) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        for (k, v) in selector.match_labels.iter().flatten() {
            requirements.push(Requirement {
                key: k.clone(),
                operator: Operator::Equals(v.clone()),
            });
        }
        for expr in selector.match_expressions.iter().flatten() {
            let values: BTreeSet<String> = expr.values.iter().flatten().cloned().collect();
            let err = |message: &str| SelectorError {
                input: format!("{} {} {:?}", expr.key, expr.operator, values),
                position: 0,
                message: message.to_owned(),
            };
            let operator = match expr.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(err("operator needs at least one value"));
                }
                "In" => Operator::In(values),
                "NotIn" => Operator::NotIn(values),
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(err("operator takes no values"));
                }
                "Exists" => Operator::Exists,
                "DoesNotExist" => Operator::DoesNotExist,
                other => return Err(err(&format!("unknown operator {other:?}"))),
            };
            requirements.push(Requirement {
                key: expr.key.clone(),
                operator,
            });
        }
        Ok(Self { requirements })
    }

    /// The requirements, in order.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// True for the selector that matches everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Whether the labels that `label` looks up (by key) satisfy every requirement: how a
    /// store matches the labels it keeps beside an object's bytes, without decoding it.
    pub(crate) fn matches_by<'a>(&self, label: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.requirements
            .iter()
            .all(|r| r.matches_value(label(&r.key)))
    }
}

impl FromStr for Selector {
    type Err = SelectorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = |s: &BTreeSet<String>| s.iter().map(String::as_str).collect::<Vec<_>>().join(",");
        match &self.operator {
            Operator::Equals(v) => write!(f, "{}={v}", self.key),
            Operator::NotEquals(v) => write!(f, "{}!={v}", self.key),
            Operator::In(s) => write!(f, "{} in ({})", self.key, set(s)),
            Operator::NotIn(s) => write!(f, "{} notin ({})", self.key, set(s)),
            Operator::Exists => f.write_str(&self.key),
            Operator::DoesNotExist => write!(f, "!{}", self.key),
        }
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

struct Parser<'a> {
    input: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn err(&self, position: usize, message: impl Into<String>) -> SelectorError {
        SelectorError {
            input: self.input.to_owned(),
            position,
            message: message.into(),
        }
    }

    fn rest(&self) -> &str {
        &self.input[self.pos..]
    }

    fn skip_ws(&mut self) {
        let trimmed = self.rest().trim_start();
        self.pos = self.input.len() - trimmed.len();
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    fn eat(&mut self, token: &str) -> bool {
        if self.rest().starts_with(token) {
            self.pos += token.len();
            true
        } else {
            false
        }
    }

    /// A run of characters allowed in keys and values.
    fn token(&mut self) -> (usize, &str) {
        let start = self.pos;
        let len = self
            .rest()
            .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')))
            .unwrap_or(self.rest().len());
        self.pos += len;
        (start, &self.input[start..self.pos])
    }

    fn selector(mut self) -> Result<Selector, SelectorError> {
        let mut requirements = Vec::new();
        self.skip_ws();
        if self.peek().is_none() {
            return Ok(Selector::everything());
        }
        loop {
            requirements.push(self.requirement()?);
            self.skip_ws();
            match self.peek() {
                None => break,
                Some(',') => self.pos += 1,
                Some(c) => {
                    return Err(self.err(
                        self.pos,
                        format!("expected ',' or end of selector, found {c:?}"),
                    ));
                }
            }
        }
        Ok(Selector { requirements })
    }

    fn key(&mut self) -> Result<String, SelectorError> {
        self.skip_ws();
        let (start, key) = self.token();
        if key.is_empty() {
            let found = self
                .peek()
                .map_or("end of selector".to_owned(), |c| format!("{c:?}"));
            return Err(self.err(start, format!("expected a label key, found {found}")));
        }
        let key = key.to_owned();
        validate_key(&key).map_err(|m| self.err(start, m))?;
        Ok(key)
    }

    fn value(&mut self) -> Result<String, SelectorError> {
        self.skip_ws();
        let (start, value) = self.token();
        let value = value.to_owned();
        validate_value(&value).map_err(|m| self.err(start, m))?;
        Ok(value)
    }

    fn requirement(&mut self) -> Result<Requirement, SelectorError> {
        self.skip_ws();
        if self.eat("!") {
            let key = self.key()?;
            return Ok(Requirement {
                key,
                operator: Operator::DoesNotExist,
            });
        }
        let key = self.key()?;
        self.skip_ws();
        let op_at = self.pos;
        let operator = if self.peek().is_none() || self.peek() == Some(',') {
            Operator::Exists
        } else if self.eat("==") || self.eat("=") {
            Operator::Equals(self.value()?)
        } else if self.eat("!=") {
            Operator::NotEquals(self.value()?)
        } else {
            let (_, word) = self.token();
            let word = word.to_owned();
            let values = match word.as_str() {
                "in" | "notin" => self.value_set()?,
                "" => {
                    let c = self.peek().unwrap_or(' ');
                    return Err(self.err(
                        op_at,
                        format!("expected '=', '==', '!=', 'in' or 'notin' after key {key:?}, found {c:?}"),
                    ));
                }
                other => {
                    return Err(self.err(
                        op_at,
                        format!("unknown operator {other:?} after key {key:?} (expected '=', '==', '!=', 'in' or 'notin')"),
                    ));
                }
            };
            if word == "in" {
                Operator::In(values)
            } else {
                Operator::NotIn(values)
            }
        };
        Ok(Requirement { key, operator })
    }

    fn value_set(&mut self) -> Result<BTreeSet<String>, SelectorError> {
        self.skip_ws();
        if !self.eat("(") {
            return Err(self.err(self.pos, "expected '(' after 'in'/'notin'"));
        }
        let open = self.pos - 1;
        let mut values = BTreeSet::new();
        loop {
            let value = self.value()?;
            self.skip_ws();
            values.insert(value);
            if self.eat(",") {
                continue;
            }
            if self.eat(")") {
                break;
            }
            return Err(self.err(
                self.pos,
                "expected ',' or ')' in value set (expected ')' to close it)",
            ));
        }
        if values.len() == 1 && values.contains("") {
            return Err(self.err(open, "'in'/'notin' needs at least one value"));
        }
        Ok(values)
    }
}

fn validate_name(name: &str, what: &str) -> Result<(), String> {
    if name.len() > 63 {
        return Err(format!("{what} {name:?} is longer than 63 characters"));
    }
    let first = name.chars().next();
    let last = name.chars().last();
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !alnum(first) || !alnum(last) {
        return Err(format!(
            "{what} {name:?} must start and end with a letter or digit"
        ));
    }
    if name.contains('/') {
        return Err(format!("{what} {name:?} contains '/'"));
    }
    Ok(())
}

fn validate_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        let ok = !prefix.is_empty()
            && prefix.len() <= 253
            && prefix.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            });
        if !ok {
            return Err(format!("key prefix {prefix:?} is not a DNS subdomain"));
        }
    }
    validate_name(name, "key name")
}

fn validate_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    validate_name(value, "value")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect()
    }

    #[test]
    fn parses_every_operator() {
        let sel = Selector::parse("a=1,b==2,c!=3,d in (x, y),e notin (z),f,!g").unwrap();
        let ops: Vec<_> = sel
            .requirements()
            .iter()
            .map(|r| r.operator.clone())
            .collect();
        assert_eq!(
            ops,
            [
                Operator::Equals("1".into()),
                Operator::Equals("2".into()),
                Operator::NotEquals("3".into()),
                Operator::In(["x".to_owned(), "y".to_owned()].into()),
                Operator::NotIn(["z".to_owned()].into()),
                Operator::Exists,
                Operator::DoesNotExist,
            ]
        );
        assert_eq!(sel.to_string(), "a=1,b=2,c!=3,d in (x,y),e notin (z),f,!g");
        assert_eq!(Selector::parse(&sel.to_string()).unwrap(), sel);
        assert!(Selector::parse("").unwrap().is_empty());
        assert!(Selector::parse("  ").unwrap().matches(&labels(&[])));
        assert_eq!(
            Selector::parse("example.com/app = web , x=")
                .unwrap()
                .to_string(),
            "example.com/app=web,x="
        );
    }

    #[test]
    fn matching_semantics() {
        let l = labels(&[("app", "web"), ("tier", "front")]);
        let m = |s: &str| Selector::parse(s).unwrap().matches(&l);
        assert!(m("app=web"));
        assert!(!m("app=db"));
        assert!(m("app!=db"));
        assert!(m("missing!=x"), "!= matches an absent label");
        assert!(m("tier in (front,back)"));
        assert!(!m("missing in (front)"));
        assert!(m("missing notin (x)"));
        assert!(!m("tier notin (front)"));
        assert!(m("app") && !m("missing"));
        assert!(m("!missing") && !m("!app"));
        assert!(m("app=web,tier=front") && !m("app=web,tier=back"));
    }

    #[test]
    fn clear_errors() {
        let cases = [
            ("app in (web", "expected ')'"),
            ("app in web", "expected '('"),
            ("app in ()", "at least one value"),
            ("app == -bad", "start and end"),
            ("app gt 3", "unknown operator \"gt\""),
            ("app=web,", "expected a label key"),
            ("a=b c=d", "expected ',' or end"),
            ("Bad_Prefix/x=1", "DNS subdomain"),
            ("=x", "expected a label key"),
            ("app > 3", "expected '=', '==', '!='"),
        ];
        for (input, want) in cases {
            let err = Selector::parse(input).unwrap_err();
            assert!(err.to_string().contains(want), "{input:?}: {err}");
            assert_eq!(err.input, input);
        }
        let long = format!("a={}", "x".repeat(64));
        assert!(Selector::parse(&long).unwrap_err().message.contains("63"));
    }

    #[test]
    fn from_label_selector() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
        let ls = LabelSelector {
            match_labels: Some([("app".to_owned(), "web".to_owned())].into()),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "In".into(),
                values: Some(vec!["front".into()]),
            }]),
        };
        let sel = Selector::from_label_selector(&ls).unwrap();
        assert_eq!(sel.to_string(), "app=web,tier in (front)");
        let bad = LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "Gt".into(),
                values: None,
            }]),
            ..Default::default()
        };
        assert!(Selector::from_label_selector(&bad).is_err());
    }
}
