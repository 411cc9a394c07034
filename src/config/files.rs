//! Secrets read from files, the Kubernetes way (a Secret mounted as a
//! volume): `admin.token_file`, `database.url_file` and
//! `[dispatchers.NAME.header_files]`, read once while the settings load.
//!
//! A file's content is the value byte for byte, except one trailing line
//! break (`echo` and most editors add one; no token, URL or header value
//! ends with one). Setting both a value and its file is refused, as is a
//! file that cannot be read or is empty: each error names the key and the
//! path, never the content.

use std::path::Path;

use super::ConfigError;

/// The secret in `path`, for the setting `key`.
pub(super) fn read_secret(key: &str, path: &Path) -> Result<String, ConfigError> {
    let bytes = std::fs::read(path)
        .map_err(|e| ConfigError::key(key, format!("cannot read {}: {e}", path.display())))?;
    let mut text = String::from_utf8(bytes)
        .map_err(|_| ConfigError::key(key, format!("{} is not UTF-8 text", path.display())))?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    if text.is_empty() {
        return Err(ConfigError::key(
            key,
            format!("{} is empty", path.display()),
        ));
    }
    Ok(text)
}

/// `value_key` and `file_key` both set: one of them must go.
pub(super) fn both_set(value_key: &str, file_key: &str) -> ConfigError {
    ConfigError::key(file_key, format!("set {value_key} or {file_key}, not both"))
}
