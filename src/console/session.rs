//! Console sessions: a random 256-bit id from the OS in an `HttpOnly`,
//! `SameSite=Strict` cookie, and on the server the session's expiry and its
//! CSRF token. Kept in memory: a restart (or another replica) signs
//! everyone out, which for a port-forwarded operator page is the safe side.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The cookie's name.
pub const COOKIE: &str = "outbox_console";

/// Sessions held at once; beyond, the one closest to expiry is dropped.
const MAX_SESSIONS: usize = 1024;

/// A signed-in session as a handler sees it.
#[derive(Debug, Clone)]
pub struct Session {
    /// Carried by every form that changes something, checked on every POST.
    pub csrf: String,
}

struct Entry {
    csrf: String,
    expires: Instant,
}

/// The server-side session map. Keyed by the SHA-256 of the session id, so
/// neither the map's lookup time nor a dump of it gives an id away.
pub struct Sessions {
    ttl: Duration,
    map: Mutex<HashMap<[u8; 32], Entry>>,
}

/// 32 bytes from the OS's random source, as hex.
fn random_hex() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(hex::encode(bytes))
}

fn key(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

impl Sessions {
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            map: Mutex::new(HashMap::new()),
        }
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// A new session: its id (for the cookie) and the session.
    pub fn create(&self) -> Result<(String, Session), getrandom::Error> {
        let id = random_hex()?;
        let csrf = random_hex()?;
        let now = Instant::now();
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, e| e.expires > now);
        if map.len() >= MAX_SESSIONS {
            if let Some(k) = map.iter().min_by_key(|(_, e)| e.expires).map(|(k, _)| *k) {
                map.remove(&k);
            }
        }
        map.insert(
            key(&id),
            Entry {
                csrf: csrf.clone(),
                expires: now + self.ttl,
            },
        );
        Ok((id, Session { csrf }))
    }

    /// The session of this id, when it exists and has not expired.
    pub fn get(&self, id: &str) -> Option<Session> {
        let k = key(id);
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(&k) {
            Some(e) if e.expires > Instant::now() => Some(Session {
                csrf: e.csrf.clone(),
            }),
            Some(_) => {
                map.remove(&k);
                None
            }
            None => None,
        }
    }

    /// Signs the session out.
    pub fn remove(&self, id: &str) {
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key(id));
    }
}

impl Session {
    /// Whether a form's `csrf` field is this session's token (constant
    /// time; an empty field never matches).
    pub fn csrf_matches(&self, presented: &str) -> bool {
        let same: bool = presented.as_bytes().ct_eq(self.csrf.as_bytes()).into();
        same && !presented.is_empty()
    }
}

/// The session id in a `Cookie` header, if any.
pub fn cookie_value(header: &str) -> Option<&str> {
    header
        .split(';')
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
}

/// `Set-Cookie` for a new session: `HttpOnly` (no script reads it),
/// `SameSite=Strict` (no other site's page sends it), `Path=/admin`, gone
/// after `ttl`; `Secure` when the console is reached over HTTPS.
pub fn set_cookie(id: &str, ttl: Duration, secure: bool) -> String {
    format!(
        "{COOKIE}={id}; Path=/admin; Max-Age={}; HttpOnly; SameSite=Strict{}",
        ttl.as_secs(),
        if secure { "; Secure" } else { "" }
    )
}

/// `Set-Cookie` that removes the session cookie (sign-out).
pub fn clear_cookie(secure: bool) -> String {
    format!(
        "{COOKIE}=; Path=/admin; Max-Age=0; HttpOnly; SameSite=Strict{}",
        if secure { "; Secure" } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_found_by_its_id_until_it_expires_or_is_removed() {
        let sessions = Sessions::new(Duration::from_secs(60));
        let (id, s) = sessions.create().unwrap();
        assert_eq!(id.len(), 64, "256 bits as hex");
        assert_eq!(sessions.get(&id).unwrap().csrf, s.csrf);
        assert!(sessions.get(&id[..63]).is_none());
        assert!(sessions.get("").is_none());
        sessions.remove(&id);
        assert!(sessions.get(&id).is_none());

        let expired = Sessions::new(Duration::ZERO);
        let (id, _) = expired.create().unwrap();
        assert!(expired.get(&id).is_none());
    }

    #[test]
    fn ids_and_csrf_tokens_differ_every_time() {
        let sessions = Sessions::new(Duration::from_secs(60));
        let (a, sa) = sessions.create().unwrap();
        let (b, sb) = sessions.create().unwrap();
        assert_ne!(a, b);
        assert_ne!(sa.csrf, sb.csrf);
        assert_ne!(a, sa.csrf);
    }

    #[test]
    fn the_csrf_token_must_match_exactly() {
        let s = Session {
            csrf: "abc123".into(),
        };
        assert!(s.csrf_matches("abc123"));
        for wrong in ["", "abc12", "abc1234", "ABC123"] {
            assert!(!s.csrf_matches(wrong), "{wrong}");
        }
        let empty = Session {
            csrf: String::new(),
        };
        assert!(!empty.csrf_matches(""));
    }

    #[test]
    fn the_cookie_is_http_only_strict_and_expires() {
        let c = set_cookie("ff", Duration::from_secs(3600), false);
        assert_eq!(
            c,
            "outbox_console=ff; Path=/admin; Max-Age=3600; HttpOnly; SameSite=Strict"
        );
        assert!(set_cookie("ff", Duration::from_secs(1), true).ends_with("; Secure"));
        assert!(clear_cookie(false).contains("Max-Age=0"));
        assert_eq!(cookie_value("a=1; outbox_console=xyz; b=2"), Some("xyz"));
        assert_eq!(cookie_value("outbox_console="), None);
        assert_eq!(cookie_value("other=1"), None);
    }
}
