//! TLS to one dispatcher: its own trust roots (`ca_file`), a client
//! certificate for mTLS (`client_cert_file` + `client_key_file`) and a
//! minimum protocol version (`min_tls_version`).
//!
//! The files are read and checked when the dispatcher is built (every
//! command builds the registry right after loading the settings), so a
//! wrong path or a file that is not PEM stops start-up naming the key
//! (exit code 2). reqwest's `rustls` feature compiles in aws-lc-rs and
//! reqwest picks it explicitly when no process-wide provider is installed,
//! so building a client never depends on rustls guessing a provider
//! (`ring` is compiled in too).

use std::path::Path;

use crate::config::{DispatcherSettings, TlsVersion};

/// A TLS setting that cannot be used: the key and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsError {
    /// The key under `dispatchers.NAME.`, e.g. `ca_file`.
    pub key: &'static str,
    pub message: String,
}

impl TlsError {
    fn new(key: &'static str, message: impl Into<String>) -> Self {
        Self {
            key,
            message: message.into(),
        }
    }
}

fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path)
        .map_err(|e| TlsError::new(key, format!("cannot read {}: {e}", path.display())))
}

/// `builder` with the dispatcher's TLS settings applied.
pub fn configure(
    builder: reqwest::ClientBuilder,
    settings: &DispatcherSettings,
) -> Result<reqwest::ClientBuilder, TlsError> {
    let mut builder = builder;
    if let Some(path) = &settings.ca_file {
        let pem = read("ca_file", path)?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
            TlsError::new(
                "ca_file",
                format!("{}: not PEM certificates: {e}", path.display()),
            )
        })?;
        if certs.is_empty() {
            return Err(TlsError::new(
                "ca_file",
                format!("{}: no PEM certificate in it", path.display()),
            ));
        }
        // The file's CAs are the only roots this dispatcher trusts: a
        // private CA pins the receiver, the system's roots do not apply.
        builder = builder.tls_certs_only(certs);
    }
    match (&settings.client_cert_file, &settings.client_key_file) {
        (None, None) => {}
        (Some(_), None) => {
            return Err(TlsError::new(
                "client_key_file",
                "must be set together with client_cert_file",
            ))
        }
        (None, Some(_)) => {
            return Err(TlsError::new(
                "client_cert_file",
                "must be set together with client_key_file",
            ))
        }
        (Some(cert_path), Some(key_path)) => {
            let cert = read("client_cert_file", cert_path)?;
            let key = read("client_key_file", key_path)?;
            if !contains_pem(&cert, "CERTIFICATE") {
                return Err(TlsError::new(
                    "client_cert_file",
                    format!("{}: no PEM certificate in it", cert_path.display()),
                ));
            }
            if !contains_pem(&key, "PRIVATE KEY") {
                return Err(TlsError::new(
                    "client_key_file",
                    format!(
                        "{}: no PEM private key in it (PKCS#8, PKCS#1 or SEC1)",
                        key_path.display()
                    ),
                ));
            }
            let mut pem = cert;
            pem.push(b'\n');
            pem.extend_from_slice(&key);
            let identity = reqwest::Identity::from_pem(&pem).map_err(|e| {
                TlsError::new(
                    "client_key_file",
                    format!(
                        "{} with {}: not a PEM certificate and key: {e}",
                        cert_path.display(),
                        key_path.display()
                    ),
                )
            })?;
            builder = builder.identity(identity);
        }
    }
    if let Some(version) = settings.min_tls_version {
        builder = builder.tls_version_min(match version {
            TlsVersion::V1_2 => reqwest::tls::Version::TLS_1_2,
            TlsVersion::V1_3 => reqwest::tls::Version::TLS_1_3,
        });
    }
    Ok(builder)
}

/// Whether `pem` has a `-----BEGIN …{label}-----` line.
fn contains_pem(pem: &[u8], label: &str) -> bool {
    String::from_utf8_lossy(pem)
        .lines()
        .any(|l| l.starts_with("-----BEGIN ") && l.trim_end().ends_with(&format!("{label}-----")))
}

/// Why a client with the dispatcher's TLS settings could not be built,
/// under the key most likely at fault: a key that the client refuses
/// (e.g. not matching the certificate) is reported under
/// `client_key_file`. `None` when the dispatcher has no TLS settings.
pub fn build_error(settings: &DispatcherSettings, e: &reqwest::Error) -> Option<TlsError> {
    if !uses_tls_settings(settings) {
        return None;
    }
    let key = if settings.client_cert_file.is_some() {
        "client_key_file"
    } else if settings.ca_file.is_some() {
        "ca_file"
    } else {
        "min_tls_version"
    };
    Some(TlsError::new(
        key,
        format!("cannot build the TLS client: {}", deepest(e)),
    ))
}

fn uses_tls_settings(s: &DispatcherSettings) -> bool {
    s.ca_file.is_some()
        || s.client_cert_file.is_some()
        || s.client_key_file.is_some()
        || s.min_tls_version.is_some()
}

fn deepest(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text = c.to_string();
        cause = c.source();
    }
    text
}
