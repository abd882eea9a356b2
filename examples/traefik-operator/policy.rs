//! What a namespace may route: the policy the operator enforces before it writes a route,
//! because every route it writes is reachable from outside.
//!
//! - **Hosts.** A rule must limit the hosts it matches with `Host(...)`: a rule such as
//!   ``PathPrefix(`/`)`` matches every host, and Traefik's default priority (the rule's
//!   length) lets a longer rule shadow another team's. Every host the rule can match must
//!   be one the namespace may claim ([`HostPolicy`]; by default only
//!   `<name>.<namespace>[.<domain>]`). A host another namespace already holds is refused
//!   (see [`ownership`](super::ownership)).
//! - **Entrypoints**: only those listed.
//! - **Backends**: an address in a denied range (loopback, link-local, which holds cloud
//!   metadata services, unless allowed by flag) or one of etcd's own endpoints is refused.
//!   Host names are not resolved here (Traefik resolves them), so a name that resolves to a
//!   denied address is not caught; deny such names at the network layer.
//!
//! Each refusal is a [`PolicyError`] whose message goes into the object's status.

use std::{
    collections::BTreeSet,
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    str::FromStr,
};

/// Which hosts a namespace may put in its rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum HostPolicy {
    /// Only `<name>.<namespace>[.<domain>]`, the object's own host.
    #[default]
    OwnName,
    /// Any host under `<namespace>.<domain>` (needs `--domain`).
    Namespace,
    /// Any host no other namespace holds.
    Any,
}

/// An IP range, `10.0.0.0/8` or `fe80::/10` (a bare address is a range of one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether `addr` is in the range (an IPv4-mapped IPv6 address counts as IPv4).
    pub fn contains(&self, addr: IpAddr) -> bool {
        let addr = canonical(addr);
        match (self.network, addr) {
            (IpAddr::V4(net), IpAddr::V4(a)) => prefix_eq(&net.octets(), &a.octets(), self.prefix),
            (IpAddr::V6(net), IpAddr::V6(a)) => prefix_eq(&net.octets(), &a.octets(), self.prefix),
            _ => false,
        }
    }
}

fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(addr, IpAddr::V4),
        v4 => v4,
    }
}

fn prefix_eq(a: &[u8], b: &[u8], prefix: u8) -> bool {
    let (whole, rest) = (usize::from(prefix / 8), prefix % 8);
    a[..whole] == b[..whole] && (rest == 0 || (a[whole] ^ b[whole]) & (0xff_u8 << (8 - rest)) == 0)
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("{text:?} is not an IP range like 10.0.0.0/8: {why}");
        let (addr, prefix) = text.trim().split_once('/').unwrap_or((text.trim(), ""));
        let network: IpAddr = addr.parse().map_err(|_| bad("bad address"))?;
        let network = canonical(network);
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            "" => max,
            p => p
                .parse()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| bad("bad prefix"))?,
        };
        Ok(Self { network, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// The ranges denied by default: loopback, link-local (cloud metadata services live at
/// 169.254.169.254 and fd00:ec2::254), "this host".
pub const DEFAULT_DENIED_BACKENDS: &str =
    "127.0.0.0/8,::1/128,169.254.0.0/16,fe80::/10,fd00:ec2::254/128,0.0.0.0/8,::/128";

/// Why a route is refused. Shown in the object's status; retried only when the object
/// changes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The entrypoint is not in `--allowed-entrypoints`.
    #[error("entrypoint {entrypoint:?} is not allowed (allowed: {allowed})")]
    Entrypoint {
        /// The entrypoint asked for.
        entrypoint: String,
        /// The allowed ones, comma-separated.
        allowed: String,
    },
    /// The rule does not parse.
    #[error("the rule cannot be read: {0}")]
    Rule(String),
    /// The rule can match hosts other than those listed in `Host(...)`.
    #[error(
        "the rule must limit the hosts it matches with Host(...) (e.g. Host(`{example}`) && \
         PathPrefix(`/api`)); HostRegexp, negations and host-less alternatives are refused"
    )]
    Unbounded {
        /// The host this object may always use.
        example: String,
    },
    /// A host outside what the namespace may claim.
    #[error("host {host:?} is not allowed in namespace {namespace:?} (allowed: {allowed})")]
    Host {
        /// The host.
        host: String,
        /// The namespace.
        namespace: String,
        /// What it may claim.
        allowed: String,
    },
    /// The backend's address is in a denied range.
    #[error("backend address {address} is in the denied range {range}")]
    BackendDenied {
        /// The address (never the URL's path or query).
        address: String,
        /// The range.
        range: Cidr,
    },
    /// The backend is one of etcd's endpoints.
    #[error("the backend is the etcd this operator writes to")]
    BackendIsEtcd,
}

/// The policy, from the flags.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// Hosts are `<name>.<namespace>.<domain>` (`<name>.<namespace>` when empty).
    pub domain: String,
    /// Which hosts a namespace may claim.
    pub hosts: HostPolicy,
    /// The entrypoints routes may use; empty allows any.
    pub entrypoints: Vec<String>,
    /// Backend ranges refused...
    pub denied_backends: Vec<Cidr>,
    /// ...unless in one of these.
    pub allowed_backends: Vec<Cidr>,
    /// `host:port` of etcd's endpoints, never a backend.
    pub etcd_endpoints: Vec<String>,
}

/// A route the policy allows: its rule, and the hosts that rule can match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    /// The rule to write.
    pub rule: String,
    /// Every host it can match, lower-case.
    pub hosts: BTreeSet<String>,
}

impl Policy {
    /// The host the object `namespace/name` may always use.
    pub fn own_host(&self, namespace: &str, name: &str) -> String {
        let host = format!("{name}.{namespace}");
        if self.domain.is_empty() {
            host
        } else {
            format!("{host}.{}", self.domain)
        }
    }

    /// Checks an entrypoint.
    ///
    /// # Errors
    ///
    /// [`PolicyError::Entrypoint`].
    pub fn check_entrypoint(&self, entrypoint: &str) -> Result<(), PolicyError> {
        if self.entrypoints.is_empty() || self.entrypoints.iter().any(|e| e == entrypoint) {
            return Ok(());
        }
        Err(PolicyError::Entrypoint {
            entrypoint: entrypoint.to_owned(),
            allowed: self.entrypoints.join(","),
        })
    }

    /// The rule for `namespace/name` (`rule`, or ``Host(`<own host>`)``), if its hosts are
    /// all the namespace may claim.
    ///
    /// # Errors
    ///
    /// [`PolicyError::Rule`], [`PolicyError::Unbounded`] or [`PolicyError::Host`].
    pub fn check_rule(
        &self,
        namespace: &str,
        name: &str,
        rule: Option<&str>,
    ) -> Result<Allowed, PolicyError> {
        let own = self.own_host(namespace, name);
        let rule = rule.map_or_else(|| format!("Host(`{own}`)"), str::to_owned);
        let hosts = parse(&rule)
            .map_err(PolicyError::Rule)?
            .hosts()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| PolicyError::Unbounded {
                example: own.clone(),
            })?;
        for host in &hosts {
            if !self.may_claim(namespace, &own, host) {
                return Err(PolicyError::Host {
                    host: host.clone(),
                    namespace: namespace.to_owned(),
                    allowed: self.describe(namespace, &own),
                });
            }
        }
        Ok(Allowed { rule, hosts })
    }

    fn may_claim(&self, namespace: &str, own: &str, host: &str) -> bool {
        match self.hosts {
            HostPolicy::OwnName => host == own,
            HostPolicy::Namespace => {
                let zone = format!("{namespace}.{}", self.domain);
                host == zone || host.ends_with(&format!(".{zone}"))
            }
            HostPolicy::Any => true,
        }
    }

    fn describe(&self, namespace: &str, own: &str) -> String {
        match self.hosts {
            HostPolicy::OwnName => own.to_owned(),
            HostPolicy::Namespace => format!("{namespace}.{0} and *.{namespace}.{0}", self.domain),
            HostPolicy::Any => "any host".to_owned(),
        }
    }

    /// Checks a backend URL's address (the caller has checked it is an http(s) URL).
    ///
    /// # Errors
    ///
    /// [`PolicyError::BackendDenied`] or [`PolicyError::BackendIsEtcd`].
    pub fn check_backend(&self, url: &url::Url) -> Result<(), PolicyError> {
        let port = url.port_or_known_default().unwrap_or_default();
        let address = match url.host() {
            Some(url::Host::Ipv4(v4)) => Some(IpAddr::V4(v4)),
            Some(url::Host::Ipv6(v6)) => Some(IpAddr::V6(v6)),
            Some(url::Host::Domain(name)) => {
                let name = name.trim_end_matches('.').to_ascii_lowercase();
                (name == "localhost" || name.ends_with(".localhost"))
                    .then_some(IpAddr::V4(Ipv4Addr::LOCALHOST))
            }
            None => None,
        };
        let host = url.host_str().unwrap_or_default();
        let here = [
            format!("{host}:{port}"),
            format!("{}:{port}", host.trim_matches(['[', ']'])),
        ];
        let is_etcd = self.etcd_endpoints.iter().any(|endpoint| {
            let endpoint = endpoint.rsplit("://").next().unwrap_or(endpoint);
            let endpoint = endpoint.trim_end_matches('/');
            here.iter().any(|h| h == endpoint)
                || (address.is_some_and(|a| a.is_loopback())
                    && endpoint_is_loopback_port(endpoint, port))
        });
        if is_etcd {
            return Err(PolicyError::BackendIsEtcd);
        }
        let Some(address) = address else {
            return Ok(());
        };
        if self.allowed_backends.iter().any(|r| r.contains(address)) {
            return Ok(());
        }
        match self.denied_backends.iter().find(|r| r.contains(address)) {
            Some(range) => Err(PolicyError::BackendDenied {
                address: canonical(address).to_string(),
                range: *range,
            }),
            None => Ok(()),
        }
    }
}

/// `url` without its query, fragment and credentials, for logs and statuses: a backend's
/// query string may hold a token.
pub fn redact_url(url: &str) -> String {
    let cut = url.find(['?', '#']).unwrap_or(url.len());
    let url = &url[..cut];
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let authority_end = rest.find('/').unwrap_or(rest.len());
            let (authority, path) = rest.split_at(authority_end);
            let host = authority.rsplit('@').next().unwrap_or(authority);
            format!("{scheme}://{host}{path}")
        }
        None => url.to_owned(),
    }
}

/// Whether `endpoint` (`host:port`) is a loopback address or `localhost` on `port`: every
/// spelling of the local host reaches the same etcd.
fn endpoint_is_loopback_port(endpoint: &str, port: u16) -> bool {
    let Some((host, endpoint_port)) = endpoint.rsplit_once(':') else {
        return false;
    };
    let host = host.trim_matches(['[', ']']);
    let loopback = host == "localhost"
        || host
            .parse::<IpAddr>()
            .is_ok_and(|a| canonical(a).is_loopback())
        || host.parse::<Ipv6Addr>().is_ok_and(|a| a.is_loopback());
    loopback && endpoint_port.parse() == Ok(port)
}

/// A Traefik rule, as far as hosts are concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expr {
    Matcher { name: String, args: Vec<String> },
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
}

impl Expr {
    /// The hosts every request this expression matches must have, or `None` when it can
    /// match any host. Sound, not complete: `None` may be a rule Traefik would limit.
    fn hosts(&self) -> Option<BTreeSet<String>> {
        match self {
            Expr::Matcher { name, args } if name.eq_ignore_ascii_case("host") => Some(
                args.iter()
                    .map(|a| a.trim_end_matches('.').to_ascii_lowercase())
                    .collect(),
            ),
            Expr::Matcher { .. } | Expr::Not(_) => None,
            Expr::And(a, b) => match (a.hosts(), b.hosts()) {
                (Some(a), Some(b)) => Some(a.intersection(&b).cloned().collect()),
                (Some(one), None) | (None, Some(one)) => Some(one),
                (None, None) => None,
            },
            Expr::Or(a, b) => {
                let (a, b) = (a.hosts()?, b.hosts()?);
                Some(a.union(&b).cloned().collect())
            }
        }
    }
}

/// Traefik's HTTP matchers (v3, and v2's multi-argument forms).
const MATCHERS: &[&str] = &[
    "Host",
    "HostRegexp",
    "Path",
    "PathPrefix",
    "PathRegexp",
    "Method",
    "Header",
    "HeaderRegexp",
    "Query",
    "QueryRegexp",
    "ClientIP",
];

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    And,
    Or,
    Not,
    Open,
    Close,
    Comma,
    Ident(String),
    Text(String),
}

fn tokens(rule: &str) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let mut chars = rule.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match c {
            c if c.is_whitespace() => {}
            '(' => out.push(Token::Open),
            ')' => out.push(Token::Close),
            ',' => out.push(Token::Comma),
            '!' => out.push(Token::Not),
            '&' | '|' => {
                if chars.next().map(|(_, n)| n) != Some(c) {
                    return Err(format!("a lone {c:?} at {at}; use && or ||"));
                }
                out.push(if c == '&' { Token::And } else { Token::Or });
            }
            '`' | '"' => {
                let mut text = String::new();
                loop {
                    match chars.next() {
                        None => return Err(format!("the string opened at {at} is not closed")),
                        Some((_, q)) if q == c => break,
                        Some((_, '\\')) if c == '"' => match chars.next() {
                            Some((_, escaped)) => text.push(escaped),
                            None => return Err(format!("the string opened at {at} is not closed")),
                        },
                        Some((_, other)) => text.push(other),
                    }
                }
                out.push(Token::Text(text));
            }
            c if c.is_ascii_alphabetic() => {
                let mut name = c.to_string();
                while let Some((_, n)) = chars.next_if(|(_, n)| n.is_ascii_alphanumeric()) {
                    name.push(n);
                }
                out.push(Token::Ident(name));
            }
            other => return Err(format!("unexpected {other:?} at {at}")),
        }
    }
    Ok(out)
}

fn parse(rule: &str) -> Result<Expr, String> {
    let tokens = tokens(rule)?;
    let mut parser = Parser { tokens, at: 0 };
    let expr = parser.or()?;
    match parser.tokens.get(parser.at) {
        None => Ok(expr),
        Some(token) => Err(format!("unexpected {token:?} after a complete rule")),
    }
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

impl Parser {
    fn next_is(&mut self, token: &Token) -> bool {
        let matched = self.tokens.get(self.at) == Some(token);
        self.at += usize::from(matched);
        matched
    }

    fn or(&mut self) -> Result<Expr, String> {
        let mut expr = self.and()?;
        while self.next_is(&Token::Or) {
            expr = Expr::Or(Box::new(expr), Box::new(self.and()?));
        }
        Ok(expr)
    }

    fn and(&mut self) -> Result<Expr, String> {
        let mut expr = self.unary()?;
        while self.next_is(&Token::And) {
            expr = Expr::And(Box::new(expr), Box::new(self.unary()?));
        }
        Ok(expr)
    }

    fn unary(&mut self) -> Result<Expr, String> {
        if self.next_is(&Token::Not) {
            return Ok(Expr::Not(Box::new(self.unary()?)));
        }
        if self.next_is(&Token::Open) {
            let expr = self.or()?;
            return if self.next_is(&Token::Close) {
                Ok(expr)
            } else {
                Err("a '(' is not closed".into())
            };
        }
        let Some(Token::Ident(name)) = self.tokens.get(self.at).cloned() else {
            return Err("expected a matcher such as Host(`...`)".into());
        };
        self.at += 1;
        if !MATCHERS.iter().any(|m| m.eq_ignore_ascii_case(&name)) {
            return Err(format!("unknown matcher {name:?}"));
        }
        if !self.next_is(&Token::Open) {
            return Err(format!("{name} needs its arguments in (...)"));
        }
        let mut args = Vec::new();
        loop {
            match self.tokens.get(self.at).cloned() {
                Some(Token::Text(text)) => {
                    self.at += 1;
                    args.push(text);
                }
                _ => return Err(format!("{name}'s arguments must be quoted strings")),
            }
            if self.next_is(&Token::Close) {
                return Ok(Expr::Matcher { name, args });
            }
            if !self.next_is(&Token::Comma) {
                return Err(format!("{name}'s arguments are not closed with ')'"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            domain: "apps.example.com".into(),
            entrypoints: vec!["web".into(), "websecure".into()],
            denied_backends: DEFAULT_DENIED_BACKENDS
                .split(',')
                .map(|r| r.parse().unwrap())
                .collect(),
            etcd_endpoints: vec!["10.0.0.5:2379".into(), "https://127.0.0.1:2379".into()],
            ..Policy::default()
        }
    }

    #[test]
    fn only_rules_bounded_by_allowed_hosts_pass() {
        let p = policy();
        let own = "web.shop.apps.example.com";
        let ok = p.check_rule("shop", "web", None).unwrap();
        assert_eq!(ok.rule, format!("Host(`{own}`)"));
        for rule in [
            format!("Host(`{own}`) && PathPrefix(`/api`)"),
            format!("(Host(`{own}`) || Host(\"WEB.shop.apps.example.com.\")) && !Path(`/x`)"),
            format!("PathPrefix(`/a`) && host(`{own}`)"),
        ] {
            assert_eq!(
                p.check_rule("shop", "web", Some(&rule)).map(|a| a.hosts),
                Ok([own.to_owned()].into()),
                "{rule}"
            );
        }
        for rule in [
            "PathPrefix(`/`)".to_owned(),
            format!("Host(`{own}`) || PathPrefix(`/`)"),
            format!("!Host(`{own}`)"),
            "HostRegexp(`.+`)".to_owned(),
        ] {
            assert!(
                matches!(
                    p.check_rule("shop", "web", Some(&rule)),
                    Err(PolicyError::Unbounded { .. })
                ),
                "{rule}"
            );
        }
        let other = p.check_rule("shop", "web", Some("Host(`bank.example.com`)"));
        assert!(matches!(other, Err(PolicyError::Host { .. })), "{other:?}");
        for bad in [
            "Host(`a`",
            "Host(a)",
            "Nope(`a`)",
            "Host(`a`) & Path(`/`)",
            "Host(`a",
        ] {
            assert!(
                matches!(
                    p.check_rule("shop", "web", Some(bad)),
                    Err(PolicyError::Rule(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn wider_host_policies() {
        let mut p = policy();
        p.hosts = HostPolicy::Namespace;
        let rule = "Host(`api.shop.apps.example.com`) || Host(`shop.apps.example.com`)";
        assert!(p.check_rule("shop", "web", Some(rule)).is_ok());
        assert!(
            p.check_rule("shop", "web", Some("Host(`api.bank.apps.example.com`)"))
                .is_err()
        );
        assert!(
            p.check_rule("shop", "web", Some("Host(`evilshop.apps.example.com`)"))
                .is_err()
        );
        p.hosts = HostPolicy::Any;
        assert!(
            p.check_rule("shop", "web", Some("Host(`shop.example.org`)"))
                .is_ok()
        );
        assert!(
            p.check_rule("shop", "web", Some("PathPrefix(`/`)"))
                .is_err(),
            "still bounded"
        );
    }

    #[test]
    fn entrypoints_are_listed() {
        let p = policy();
        assert!(p.check_entrypoint("web").is_ok());
        assert_eq!(
            p.check_entrypoint("admin").unwrap_err().to_string(),
            "entrypoint \"admin\" is not allowed (allowed: web,websecure)"
        );
    }

    #[test]
    fn backends_in_denied_ranges_and_etcd_are_refused() {
        let mut p = policy();
        let check = |p: &Policy, url: &str| p.check_backend(&url::Url::parse(url).unwrap());
        assert!(check(&p, "http://web.shop.svc:8080/x?token=secret").is_ok());
        assert!(check(&p, "http://10.0.0.7:8080").is_ok());
        for denied in [
            "http://169.254.169.254/latest/meta-data?x=1",
            "http://127.0.0.1:9000",
            "http://2130706433/",
            "http://[::ffff:127.0.0.1]/",
            "http://localhost:8080",
            "http://[fe80::1]/",
        ] {
            let err = check(&p, denied).unwrap_err();
            assert!(
                matches!(err, PolicyError::BackendDenied { .. }),
                "{denied}: {err}"
            );
            assert!(!err.to_string().contains("x=1"), "{err}");
        }
        assert_eq!(
            check(&p, "http://10.0.0.5:2379"),
            Err(PolicyError::BackendIsEtcd)
        );
        // Allowing loopback does not allow etcd's own port, however it is spelled.
        p.allowed_backends = vec!["127.0.0.0/8".parse().unwrap()];
        assert!(check(&p, "http://127.0.0.1:9000").is_ok());
        assert_eq!(
            check(&p, "http://localhost:2379"),
            Err(PolicyError::BackendIsEtcd)
        );
        assert_eq!(
            check(&p, "http://127.0.0.1:2379/"),
            Err(PolicyError::BackendIsEtcd)
        );
    }

    #[test]
    fn urls_lose_their_queries_and_credentials_in_logs() {
        assert_eq!(
            redact_url("http://u:p@web:80/a/b?token=s#f"),
            "http://web:80/a/b"
        );
        assert_eq!(redact_url("https://web"), "https://web");
        assert_eq!(redact_url("web?x=1"), "web");
    }

    #[test]
    fn ranges_parse_and_match() {
        let r: Cidr = "10.1.0.0/16".parse().unwrap();
        assert!(r.contains("10.1.200.3".parse().unwrap()));
        assert!(!r.contains("10.2.0.1".parse().unwrap()));
        let one: Cidr = "fd00:ec2::254".parse().unwrap();
        assert_eq!(one.to_string(), "fd00:ec2::254/128");
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("nope".parse::<Cidr>().is_err());
        let v6: Cidr = "fe80::/10".parse().unwrap();
        assert!(v6.contains("fe80::1234".parse().unwrap()));
        assert!(!v6.contains("fec0::1".parse().unwrap()));
    }
}
