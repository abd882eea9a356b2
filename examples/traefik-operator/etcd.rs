//! How the operator reaches the etcd Traefik reads: the flags (endpoints, root key, TLS,
//! user and password, transaction size) and why a setting is unusable, found before etcd
//! is contacted. [`TraefikKv::connect_with`](super::kv::TraefikKv::connect_with) builds
//! the connection from them.

use std::{
    fmt,
    path::{Path, PathBuf},
};

use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};

/// The smallest `--etcd-max-txn-ops` accepted: a sync of a route with `k` keys sends at most
/// `2k + 3` operations in one transaction (11 for today's 4 keys), and etcd's own lowest
/// sensible setting is far above that.
pub const MIN_TXN_OPS: u32 = 16;

/// A password that `Debug` never prints.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(String);

impl Password {
    /// Wraps `password`.
    pub fn new(password: impl Into<String>) -> Self {
        Self(password.into())
    }

    /// The password itself, for the etcd client only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Password(<redacted>)")
    }
}

impl From<String> for Password {
    fn from(password: String) -> Self {
        Self(password)
    }
}

/// How to reach and authenticate to the etcd that Traefik's KV provider reads. Every flag
/// can also be given by the environment variable shown; TLS is on as soon as a CA file is
/// given (or an endpoint is `https://`).
#[derive(Debug, Clone, clap::Args)]
pub struct EtcdOptions {
    /// etcd endpoints of Traefik's KV provider, comma-separated (`host:port` or URLs; with
    /// TLS, `host:port` means `https://host:port`).
    #[arg(
        long = "etcd-endpoints",
        env = "ETCD_ENDPOINTS",
        value_delimiter = ',',
        default_value = "127.0.0.1:2379"
    )]
    pub endpoints: Vec<String>,

    /// The root key Traefik reads (its `--providers.etcd.rootkey`).
    #[arg(
        long = "etcd-root-key",
        env = "ETCD_ROOT_KEY",
        default_value = "traefik"
    )]
    pub root_key: String,

    /// PEM file of the CA that signed etcd's serving certificate; turns TLS on (Traefik's
    /// `--providers.etcd.tls.ca`).
    #[arg(long = "etcd-ca-file", env = "ETCD_CA_FILE")]
    pub ca_file: Option<PathBuf>,

    /// PEM client certificate for etcd's `--client-cert-auth` (needs `--etcd-key-file`).
    #[arg(long = "etcd-cert-file", env = "ETCD_CERT_FILE")]
    pub cert_file: Option<PathBuf>,

    /// PEM private key of `--etcd-cert-file`.
    #[arg(long = "etcd-key-file", env = "ETCD_KEY_FILE")]
    pub key_file: Option<PathBuf>,

    /// The name etcd's certificate must carry, when it is not the endpoints' host.
    #[arg(long = "etcd-tls-server-name", env = "ETCD_TLS_SERVER_NAME")]
    pub tls_server_name: Option<String>,

    /// etcd user (etcd's auth enabled); it needs readwrite on the root key's prefix and on
    /// the ownership records' (`--etcd-owner-prefix`).
    #[arg(long = "etcd-username", env = "ETCD_USERNAME")]
    pub username: Option<String>,

    /// The etcd user's password (prefer the environment variable, from a Secret).
    #[arg(long = "etcd-password", env = "ETCD_PASSWORD", hide_env_values = true)]
    pub password: Option<Password>,

    /// The most operations in one etcd transaction (etcd's `--max-txn-ops`).
    #[arg(
        long = "etcd-max-txn-ops",
        env = "ETCD_MAX_TXN_OPS",
        default_value_t = 128,
        value_parser = clap::value_parser!(u32).range(i64::from(MIN_TXN_OPS)..)
    )]
    pub max_txn_ops: u32,
}

impl EtcdOptions {
    /// Plaintext, unauthenticated etcd at `endpoints` under `root_key`.
    pub fn plaintext(endpoints: Vec<String>, root_key: impl Into<String>) -> Self {
        Self {
            endpoints,
            root_key: root_key.into(),
            ca_file: None,
            cert_file: None,
            key_file: None,
            tls_server_name: None,
            username: None,
            password: None,
            max_txn_ops: 128,
        }
    }

    pub(crate) fn wants_tls(&self) -> bool {
        self.ca_file.is_some()
            || self.cert_file.is_some()
            || self.key_file.is_some()
            || self.tls_server_name.is_some()
            || self
                .endpoints
                .iter()
                .any(|e| e.to_ascii_lowercase().starts_with("https://"))
    }
}

/// Why [`EtcdOptions`] cannot be used. Found before etcd is contacted; endpoints are
/// named by their position in `--etcd-endpoints`, never by address.
#[derive(Debug, thiserror::Error)]
pub enum EtcdConfigError {
    /// `--etcd-endpoints` is empty.
    #[error("no etcd endpoints configured (--etcd-endpoints)")]
    NoEndpoints,
    /// An endpoint is neither `host:port` nor an `http(s)://` URL.
    #[error("etcd endpoint #{index} (of --etcd-endpoints) is not host:port or an http(s) URL")]
    BadEndpoint {
        /// Its position in `--etcd-endpoints`, from 0.
        index: usize,
    },
    /// An `http://` endpoint while TLS is configured.
    #[error(
        "etcd endpoint #{index} (of --etcd-endpoints) is http:// but TLS is configured; use \
         https:// or host:port"
    )]
    PlainEndpointWithTls {
        /// Its position in `--etcd-endpoints`, from 0.
        index: usize,
    },
    /// One flag of a pair is missing.
    #[error("{given} needs {missing}")]
    Incomplete {
        /// The flag given.
        given: &'static str,
        /// The flag it needs.
        missing: &'static str,
    },
    /// TLS without a CA to verify etcd's certificate with.
    #[error(
        "TLS to etcd needs --etcd-ca-file (the CA of etcd's serving certificate); the operator \
         trusts no system CA"
    )]
    TlsWithoutCa,
    /// A file cannot be read.
    #[error("cannot read the etcd {what} {path}: {source}")]
    Read {
        /// `CA file`, `client certificate` or `client key`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// A file holds no usable PEM.
    #[error("the etcd {what} {path} holds no valid PEM {expected}: {reason}")]
    Pem {
        /// `CA file`, `client certificate` or `client key`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What it should hold.
        expected: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// `--etcd-max-txn-ops` too small for one sync.
    #[error("--etcd-max-txn-ops {value} is below {MIN_TXN_OPS}, what one route's sync may need")]
    MaxTxnOps {
        /// The value given.
        value: u32,
    },
}

fn read_file(what: &'static str, path: &Path) -> Result<Vec<u8>, EtcdConfigError> {
    std::fs::read(path).map_err(|source| EtcdConfigError::Read {
        what,
        path: path.to_owned(),
        source,
    })
}

/// Checks that `path` holds at least one PEM certificate, and returns the file.
pub(crate) fn read_certificates(
    what: &'static str,
    path: &Path,
) -> Result<Vec<u8>, EtcdConfigError> {
    let pem = read_file(what, path)?;
    let bad = |reason: String| EtcdConfigError::Pem {
        what,
        path: path.to_owned(),
        expected: "certificate",
        reason,
    };
    let mut found = 0;
    for cert in CertificateDer::pem_slice_iter(&pem) {
        cert.map_err(|e| bad(e.to_string()))?;
        found += 1;
    }
    if found == 0 {
        return Err(bad("no CERTIFICATE block".into()));
    }
    Ok(pem)
}

/// Checks that `path` holds a PEM private key, and returns the file.
pub(crate) fn read_private_key(path: &Path) -> Result<Vec<u8>, EtcdConfigError> {
    let what = "client key";
    let pem = read_file(what, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| EtcdConfigError::Pem {
        what,
        path: path.to_owned(),
        expected: "private key",
        reason: e.to_string(),
    })?;
    Ok(pem)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        etcd: EtcdOptions,
    }

    #[test]
    fn every_etcd_flag_has_an_environment_variable_and_the_password_stays_hidden() {
        use clap::{CommandFactory, Parser};
        let command = Flags::command();
        for arg in command.get_arguments() {
            let long = arg.get_long().unwrap();
            let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
            assert_eq!(
                env.as_deref(),
                Some(long.replace('-', "_").to_uppercase().as_str()),
                "--{long}"
            );
            assert_eq!(
                arg.is_hide_env_values_set(),
                long == "etcd-password",
                "--{long}"
            );
        }
        let flags = Flags::try_parse_from([
            "x",
            "--etcd-endpoints=a:2379,b:2379",
            "--etcd-ca-file=/ca.crt",
            "--etcd-username=operator",
            "--etcd-password=s3cret-pw",
        ])
        .unwrap();
        assert_eq!(flags.etcd.endpoints, ["a:2379", "b:2379"]);
        assert_eq!(
            flags.etcd.password.as_ref().map(Password::expose),
            Some("s3cret-pw")
        );
        assert!(Flags::try_parse_from(["x", "--etcd-max-txn-ops=8"]).is_err());
    }
}
