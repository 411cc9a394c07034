//! Standard Webhooks signatures (<https://www.standardwebhooks.com>), opt-in
//! per dispatcher with `signing_secret_file`: every POST carries
//! `webhook-id` (the same for every attempt and resend of a row),
//! `webhook-timestamp` (Unix seconds) and `webhook-signature`: `v1,` and
//! the base64 HMAC-SHA256 of `id.timestamp.body`, one per secret,
//! space-separated.
//!
//! The file holds one `whsec_…` secret a line (blank lines and `#`
//! comments ignored). It is read again when its content changes (looked at
//! once a second at most, by content: Kubernetes swaps a mounted Secret
//! through a symlink), so a rotation needs no restart: add the new secret,
//! let the receivers switch, remove the old one. A file that cannot be read
//! or holds no valid secret keeps the last good secrets, with a WARN and a
//! count; at start-up it stops the sidecar naming the key.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use aws_lc_rs::hmac;
use base64::Engine;

/// How often the file is looked at, at most.
const RECHECK: Duration = Duration::from_secs(1);

/// The secrets of one dispatcher, and where they come from.
pub struct Signer {
    path: PathBuf,
    /// `dispatchers.NAME.signing_secret_file`, for messages.
    key: String,
    keys: RwLock<Arc<Vec<hmac::Key>>>,
    state: Mutex<(Instant, String)>,
    /// Reloads that failed, counted here once the metrics are known.
    counter: std::sync::OnceLock<prometheus::IntCounter>,
}

/// Parses a secrets file: one `whsec_<base64>` a line.
pub fn parse_secrets(text: &str) -> Result<Vec<Vec<u8>>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some(b64) = line.strip_prefix("whsec_") else {
            return Err(format!("line {}: not a whsec_… secret", n + 1));
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| format!("line {}: the part after whsec_ is not base64: {e}", n + 1))?;
        if bytes.len() < 24 {
            return Err(format!(
                "line {}: the secret is {} bytes; the specification asks for 24 to 64",
                n + 1,
                bytes.len()
            ));
        }
        out.push(bytes);
    }
    if out.is_empty() {
        return Err("holds no secret".to_owned());
    }
    Ok(out)
}

/// The `webhook-signature` value for `id`, `timestamp` and `body`.
pub fn signature(keys: &[hmac::Key], id: &str, timestamp: u64, body: &[u8]) -> String {
    let mut content = Vec::with_capacity(id.len() + 24 + body.len());
    content.extend_from_slice(id.as_bytes());
    content.push(b'.');
    content.extend_from_slice(timestamp.to_string().as_bytes());
    content.push(b'.');
    content.extend_from_slice(body);
    keys.iter()
        .map(|k| {
            let tag = hmac::sign(k, &content);
            format!(
                "v1,{}",
                base64::engine::general_purpose::STANDARD.encode(tag.as_ref())
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn keys_of(secrets: &[Vec<u8>]) -> Vec<hmac::Key> {
    secrets
        .iter()
        .map(|s| hmac::Key::new(hmac::HMAC_SHA256, s))
        .collect()
}

impl Signer {
    /// Reads `path`; an error names `key` and what is wrong.
    pub fn load(key: &str, path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("{key}: cannot read {}: {e}", path.display()))?;
        let secrets =
            parse_secrets(&text).map_err(|e| format!("{key}: {}: {e}", path.display()))?;
        Ok(Signer {
            path: path.to_owned(),
            key: key.to_owned(),
            keys: RwLock::new(Arc::new(keys_of(&secrets))),
            state: Mutex::new((Instant::now(), text)),
            counter: std::sync::OnceLock::new(),
        })
    }

    /// The secrets to sign with now, the file looked at again when the
    /// last look is older than a second.
    pub fn keys(&self) -> Arc<Vec<hmac::Key>> {
        let due = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if state.0.elapsed() >= RECHECK {
                state.0 = Instant::now();
                true
            } else {
                false
            }
        };
        if due {
            self.reload();
        }
        self.keys.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn reload(&self) {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) => {
                self.failed(&format!("cannot read {}: {e}", self.path.display()));
                return;
            }
        };
        {
            let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if state.1 == text {
                return;
            }
        }
        match parse_secrets(&text) {
            Ok(secrets) => {
                *self.keys.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(keys_of(&secrets));
                self.state.lock().unwrap_or_else(|e| e.into_inner()).1 = text;
                tracing::info!(key = %self.key, secrets = secrets.len(), "signing secrets reloaded");
            }
            Err(e) => self.failed(&format!("{}: {e}", self.path.display())),
        }
    }

    fn failed(&self, why: &str) {
        if let Some(c) = self.counter.get() {
            c.inc();
        }
        tracing::warn!(key = %self.key, error = %why, "cannot reload the signing secrets; signing with the last good ones");
    }

    /// Counts failed reloads in `counter` from now on.
    pub fn count_failures_in(&self, counter: prometheus::IntCounter) {
        let _ = self.counter.set(counter);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks specification's reference
    /// libraries.
    #[test]
    fn signs_as_the_specification_s_example() {
        let secrets = parse_secrets("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n").unwrap();
        let keys = keys_of(&secrets);
        let sig = signature(
            &keys,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn a_bad_secret_is_refused_naming_its_line() {
        assert_eq!(parse_secrets("").unwrap_err(), "holds no secret");
        assert!(parse_secrets("# only a comment\n").is_err());
        assert!(parse_secrets("secret\n")
            .unwrap_err()
            .starts_with("line 1: not a whsec_"));
        assert!(
            parse_secrets("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\nwhsec_!!\n")
                .unwrap_err()
                .starts_with("line 2: the part after whsec_ is not base64")
        );
        assert_eq!(
            parse_secrets("whsec_c2hvcnQ=\n").unwrap_err(),
            "line 1: the secret is 5 bytes; the specification asks for 24 to 64"
        );
    }
}
