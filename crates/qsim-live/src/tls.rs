//! TLS to the upstream (`https://` base URLs, e.g. a Databricks workspace):
//! rustls on ring through hyper-rustls, trusting the system's root
//! certificates plus, optionally, the CA certificates of a PEM file (a
//! private CA). The same connector also speaks plain http.

use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use std::path::Path;
use std::sync::Arc;

pub type Connector = HttpsConnector<HttpConnector>;

/// The certificates of a PEM file (at least one), or why not.
pub fn read_ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: not PEM certificates: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{}: no PEM certificate (-----BEGIN CERTIFICATE-----) in it",
            path.display()
        ));
    }
    Ok(certs)
}

/// The upstream connector. `tls`: load roots (only when the upstream is
/// https; reading the system's store takes a few ms).
pub fn connector(tls: bool, ca_file: Option<&Path>) -> Result<Connector, String> {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.enforce_http(false);
    let mut roots = rustls::RootCertStore::empty();
    if tls {
        let native = rustls_native_certs::load_native_certs();
        let (ok, _bad) = roots.add_parsable_certificates(native.certs);
        if ok == 0 && ca_file.is_none() {
            tracing::warn!("no system root certificates found: https upstreams will fail to verify (set proxy.upstream_ca_file)");
        }
        if let Some(p) = ca_file {
            for c in read_ca_file(p)? {
                roots
                    .add(c)
                    .map_err(|e| format!("{}: unusable CA certificate: {e}", p.display()))?;
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(HttpsConnectorBuilder::new()
        .with_tls_config(cfg)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http))
}
