//! OAuth2 client credentials for a dispatcher (`[dispatchers.NAME.oauth2]`):
//! one access token per dispatcher on a replica, shared by its requests,
//! refreshed at 80 % of its `expires_in` and fetched again after a 401
//! (once per token: concurrent 401s of one token fetch one new token). The
//! client secret is read from its file, again when the file changes; it
//! appears in no log line, error or metric.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

use serde::Deserialize;
use tokio::sync::Mutex;

use crate::config::OAuth2Settings;

/// When a token without `expires_in` is fetched again.
const DEFAULT_LIFETIME: Duration = Duration::from_secs(300);
/// How much of a token's life is used before it is refreshed.
const REFRESH_AT: f64 = 0.8;
/// The longest token endpoint answer read.
const MAX_TOKEN_ANSWER: usize = 64 * 1024;

/// A token and when to refresh it.
#[derive(Clone)]
struct Token {
    value: String,
    refresh_at: Instant,
}

/// The client secret as last read, and the file's modification time then.
struct SecretFile {
    path: PathBuf,
    read: Option<(Option<SystemTime>, String)>,
}

impl SecretFile {
    fn get(&mut self) -> Result<String, String> {
        let modified = std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .ok();
        if let Some((at, secret)) = &self.read {
            if *at == modified && modified.is_some() {
                return Ok(secret.clone());
            }
        }
        let text = std::fs::read_to_string(&self.path).map_err(|e| {
            format!(
                "cannot read oauth2.client_secret_file {}: {e}",
                self.path.display()
            )
        })?;
        let secret = text.trim_end_matches(['\r', '\n']).to_owned();
        if secret.is_empty() {
            return Err(format!(
                "oauth2.client_secret_file {} is empty",
                self.path.display()
            ));
        }
        self.read = Some((modified, secret.clone()));
        Ok(secret)
    }
}

#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    #[serde(default)]
    expires_in: Option<f64>,
}

/// A dispatcher's access tokens.
pub struct TokenSource {
    settings: OAuth2Settings,
    client: reqwest::Client,
    timeout: Duration,
    state: Mutex<(Option<Token>, SecretFile)>,
    fetched: OnceLock<prometheus::IntCounter>,
    failed: OnceLock<prometheus::IntCounter>,
}

impl TokenSource {
    /// `client`: the dispatcher's own (its TLS roots and proxy).
    pub fn new(
        settings: &OAuth2Settings,
        client: reqwest::Client,
        timeout: Duration,
    ) -> Result<Self, String> {
        let url = reqwest::Url::parse(&settings.token_url).map_err(|e| {
            format!(
                "{:?} is not a URL: {e}",
                crate::config::secret_free_url(&settings.token_url)
            )
        })?;
        if url.scheme() != "http" && url.scheme() != "https" {
            return Err(format!("scheme {:?} is not http or https", url.scheme()));
        }
        let mut file = SecretFile {
            path: settings.client_secret_file.clone(),
            read: None,
        };
        // Refused at start-up when unreadable, as every secret file.
        file.get()?;
        Ok(TokenSource {
            settings: settings.clone(),
            client,
            timeout,
            state: Mutex::new((None, file)),
            fetched: OnceLock::new(),
            failed: OnceLock::new(),
        })
    }

    /// Counts token fetches (`ok`, `failed`) from now on.
    pub fn count_in(&self, fetched: prometheus::IntCounter, failed: prometheus::IntCounter) {
        let _ = self.fetched.set(fetched);
        let _ = self.failed.set(failed);
    }

    /// A token to send: the shared one while it is fresh, else a new one.
    /// `rejected`: the token a receiver just answered 401 to; if it is still
    /// the shared one, a new one is fetched (else another request already
    /// did).
    pub async fn token(&self, rejected: Option<&str>) -> Result<String, String> {
        let mut state = self.state.lock().await;
        if let Some(t) = &state.0 {
            let stale = rejected == Some(t.value.as_str());
            if !stale && Instant::now() < t.refresh_at {
                return Ok(t.value.clone());
            }
        }
        let secret = state.1.get()?;
        match self.fetch(&secret).await {
            Ok(t) => {
                if let Some(c) = self.fetched.get() {
                    c.inc();
                }
                let value = t.value.clone();
                state.0 = Some(t);
                Ok(value)
            }
            Err(e) => {
                if let Some(c) = self.failed.get() {
                    c.inc();
                }
                Err(e)
            }
        }
    }

    async fn fetch(&self, secret: &str) -> Result<Token, String> {
        let s = &self.settings;
        let shown = crate::config::secret_free_url(&s.token_url);
        let mut form: Vec<(&str, &str)> = vec![
            ("grant_type", "client_credentials"),
            ("client_id", &s.client_id),
            ("client_secret", secret),
        ];
        if let Some(scope) = &s.scope {
            form.push(("scope", scope));
        }
        if let Some(audience) = &s.audience {
            form.push(("audience", audience));
        }
        let body = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form)
            .finish();
        let started = Instant::now();
        let resp = self
            .client
            .post(&s.token_url)
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .header(reqwest::header::ACCEPT, "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| {
                format!(
                    "oauth2 token endpoint {shown}: {}",
                    crate::dispatch::describe_error(&e, self.timeout)
                )
            })?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| format!("oauth2 token endpoint {shown}: {e}"))?;
        let bytes = &bytes[..bytes.len().min(MAX_TOKEN_ANSWER)];
        if !status.is_success() {
            let text = String::from_utf8_lossy(bytes).replace(secret, "***");
            let excerpt: String = text
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .chars()
                .take(200)
                .collect();
            return Err(format!(
                "oauth2 token endpoint {shown}: HTTP {}{}",
                status.as_u16(),
                if excerpt.is_empty() {
                    String::new()
                } else {
                    format!(": {excerpt}")
                }
            ));
        }
        let answer: TokenAnswer = serde_json::from_slice(bytes).map_err(|e| {
            format!("oauth2 token endpoint {shown}: the answer has no access_token ({e})")
        })?;
        let life = answer
            .expires_in
            .filter(|s| s.is_finite() && *s > 0.0)
            .map(Duration::from_secs_f64)
            .unwrap_or(DEFAULT_LIFETIME);
        Ok(Token {
            value: answer.access_token,
            refresh_at: started + life.mul_f64(REFRESH_AT),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::SecretFile;

    #[test]
    fn the_secret_is_read_again_when_its_file_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "first\n").unwrap();
        let mut f = SecretFile {
            path: path.clone(),
            read: None,
        };
        assert_eq!(f.get().unwrap(), "first");
        // A rotated Secret: a new file (a new modification time).
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&path, "second\n").unwrap();
        assert_eq!(f.get().unwrap(), "second");
        std::fs::write(&path, "\n").unwrap();
        assert!(f.get().unwrap_err().contains("is empty"));
        std::fs::remove_file(&path).unwrap();
        let e = f.get().unwrap_err();
        assert!(
            e.starts_with("cannot read oauth2.client_secret_file "),
            "{e}"
        );
    }
}
