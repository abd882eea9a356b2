//! The credentials of one control plane: a CA, the API server's serving
//! certificate, an admin client certificate and the service-account key.

use std::{
    net::{IpAddr, Ipv4Addr},
    path::{Path, PathBuf},
};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

use crate::{Error, Result};

/// Paths of the files written by [`Credentials::generate`].
#[derive(Debug, Clone)]
pub(crate) struct Credentials {
    pub(crate) ca_cert: PathBuf,
    pub(crate) ca_key: PathBuf,
    pub(crate) serving_cert: PathBuf,
    pub(crate) serving_key: PathBuf,
    pub(crate) admin_cert: PathBuf,
    pub(crate) admin_key: PathBuf,
    pub(crate) service_account_key: PathBuf,
    pub(crate) service_account_pub: PathBuf,
}

fn distinguished_name(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    if let Some(org) = organization {
        dn.push(DnType::OrganizationName, org);
    }
    dn
}

impl Credentials {
    /// Generates fresh keys and certificates into `dir`.
    pub(crate) fn generate(dir: &Path) -> Result<Self> {
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name = distinguished_name("kube-testenv-ca", None);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let ca_pem = ca_key.serialize_pem();
        let issuer = Issuer::new(ca_params, ca_key);

        // The names a client inside or outside a cluster may use for the API server.
        let mut serving = CertificateParams::new(vec![
            "localhost".to_owned(),
            "kubernetes".to_owned(),
            "kubernetes.default".to_owned(),
            "kubernetes.default.svc".to_owned(),
            "kubernetes.default.svc.cluster.local".to_owned(),
        ])?;
        serving
            .subject_alt_names
            .push(rcgen::SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        serving
            .subject_alt_names
            .push(rcgen::SanType::IpAddress(IpAddr::V4(Ipv4Addr::new(
                10, 0, 0, 1,
            ))));
        serving.distinguished_name = distinguished_name("kube-apiserver", None);
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_key = KeyPair::generate()?;
        let serving_cert = serving.signed_by(&serving_key, &issuer)?;

        // `system:masters` is bound to cluster-admin by the API server's bootstrap policy.
        let mut admin = CertificateParams::new(Vec::<String>::new())?;
        admin.distinguished_name = distinguished_name("kube-testenv-admin", Some("system:masters"));
        admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin_key = KeyPair::generate()?;
        let admin_cert = admin.signed_by(&admin_key, &issuer)?;

        let service_account = KeyPair::generate()?;

        let creds = Self {
            ca_cert: dir.join("ca.crt"),
            ca_key: dir.join("ca.key"),
            serving_cert: dir.join("apiserver.crt"),
            serving_key: dir.join("apiserver.key"),
            admin_cert: dir.join("admin.crt"),
            admin_key: dir.join("admin.key"),
            service_account_key: dir.join("sa.key"),
            service_account_pub: dir.join("sa.pub"),
        };
        write(&creds.ca_cert, &ca_cert.pem())?;
        write(&creds.ca_key, &ca_pem)?;
        write(&creds.serving_cert, &serving_cert.pem())?;
        write(&creds.serving_key, &serving_key.serialize_pem())?;
        write(&creds.admin_cert, &admin_cert.pem())?;
        write(&creds.admin_key, &admin_key.serialize_pem())?;
        write(&creds.service_account_key, &service_account.serialize_pem())?;
        write(
            &creds.service_account_pub,
            &service_account.public_key_pem(),
        )?;
        Ok(creds)
    }
}

/// The files written by [`EtcdCredentials::generate`]: a CA of their own, etcd's serving
/// certificate for `127.0.0.1` and `localhost`, and one client certificate.
#[derive(Debug, Clone)]
pub(crate) struct EtcdCredentials {
    pub(crate) ca_cert: PathBuf,
    pub(crate) server_cert: PathBuf,
    pub(crate) server_key: PathBuf,
    pub(crate) client_cert: PathBuf,
    pub(crate) client_key: PathBuf,
}

impl EtcdCredentials {
    /// Generates fresh keys and certificates into `dir`; the client certificate's common
    /// name is `client_name`.
    pub(crate) fn generate(dir: &Path, client_name: &str) -> Result<Self> {
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name = distinguished_name("kube-testenv-etcd-ca", None);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);

        let mut server = CertificateParams::new(vec!["localhost".to_owned()])?;
        server
            .subject_alt_names
            .push(rcgen::SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        server.distinguished_name = distinguished_name("kube-testenv-etcd", None);
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_key = KeyPair::generate()?;
        let server_cert = server.signed_by(&server_key, &issuer)?;

        let mut client = CertificateParams::new(Vec::<String>::new())?;
        client.distinguished_name = distinguished_name(client_name, None);
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_key = KeyPair::generate()?;
        let client_cert = client.signed_by(&client_key, &issuer)?;

        let creds = Self {
            ca_cert: dir.join("etcd-ca.crt"),
            server_cert: dir.join("etcd-server.crt"),
            server_key: dir.join("etcd-server.key"),
            client_cert: dir.join("etcd-client.crt"),
            client_key: dir.join("etcd-client.key"),
        };
        write(&creds.ca_cert, &ca_cert.pem())?;
        write(&creds.server_cert, &server_cert.pem())?;
        write(&creds.server_key, &server_key.serialize_pem())?;
        write(&creds.client_cert, &client_cert.pem())?;
        write(&creds.client_key, &client_key.serialize_pem())?;
        Ok(creds)
    }
}

fn write(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents).map_err(Error::io("writing", path))
}
