//! The admin token: the API's bearer header and the console's sign-in
//! form compare what they are given with it the same way.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::Secret;

/// Whether an `Authorization` header value carries `token` with the
/// `Bearer` scheme, the scheme's case ignored (RFC 7235). The two tokens are
/// compared as SHA-256 digests, which always have the same length, in
/// constant time: neither the token's length nor a matching prefix shows in
/// the time an answer takes.
pub(crate) fn bearer_matches(authorization: Option<&str>, token: &Secret) -> bool {
    let presented = authorization
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, credentials)| credentials.trim_start_matches(' '))
        .unwrap_or("");
    token_matches(presented, token)
}

/// Whether `presented` is `token`: compared as SHA-256 digests in constant
/// time (the bearer header here, the console's sign-in form too). An empty
/// token never matches.
pub(crate) fn token_matches(presented: &str, token: &Secret) -> bool {
    let presented_digest = Sha256::digest(presented.as_bytes());
    let token_digest = Sha256::digest(token.expose().as_bytes());
    let same: bool = presented_digest[..].ct_eq(&token_digest[..]).into();
    same && !presented.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        let token = Secret::new(TOKEN);
        for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
            let header = format!("{scheme} {TOKEN}");
            assert!(bearer_matches(Some(&header), &token), "{header}");
        }
        assert!(bearer_matches(Some(&format!("Bearer   {TOKEN}")), &token));
    }

    #[test]
    fn anything_but_the_exact_token_is_refused() {
        let token = Secret::new(TOKEN);
        let refused = [
            None,
            Some(String::new()),
            Some("Bearer".to_owned()),
            Some("Bearer ".to_owned()),
            Some(TOKEN.to_owned()),
            Some(format!("Basic {TOKEN}")),
            Some(format!("Bearerx {TOKEN}")),
            Some(format!("Bearer {}", &TOKEN[..31])),
            Some(format!("Bearer {TOKEN}0")),
            Some(format!("Bearer {}", TOKEN.to_uppercase())),
        ];
        for header in refused {
            assert!(!bearer_matches(header.as_deref(), &token), "{header:?}");
        }
        // An empty configured token never opens the API.
        assert!(!bearer_matches(Some("Bearer "), &Secret::new("")));
    }
}
