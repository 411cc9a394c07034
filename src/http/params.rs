//! Request parameters, the admin API's query strings and the console's
//! forms alike: every name checked against what the route takes.

use std::collections::BTreeMap;

/// How the request parameters are named in errors.
pub(crate) const QUERY: &str = "query parameter";
pub(crate) const FORM: &str = "form field";

/// Request parameters (a query string or a urlencoded form) checked against
/// the names a route takes. A name the route does not take, or a name given
/// twice, is refused rather than ignored: an ignored filter widens a bulk
/// action to every row.
#[derive(Debug)]
pub(crate) struct Params {
    noun: &'static str,
    values: BTreeMap<String, String>,
    /// Forms send every field, filled in or not: there an empty value is no
    /// value. In the API's query string an empty value is refused.
    empty_is_absent: bool,
}

impl Params {
    /// `raw` urlencoded; `noun` names the parameters in errors ([`QUERY`],
    /// [`FORM`]); `allowed` is every name the route takes.
    pub(crate) fn parse(
        raw: &[u8],
        noun: &'static str,
        allowed: &[&str],
        empty_is_absent: bool,
    ) -> Result<Self, String> {
        let mut values = BTreeMap::new();
        for (key, value) in url::form_urlencoded::parse(raw) {
            if !allowed.contains(&key.as_ref()) {
                return Err(if allowed.is_empty() {
                    format!("unknown {noun} `{key}`: this route takes none")
                } else {
                    format!(
                        "unknown {noun} `{key}`; expected one of: {}",
                        allowed.join(", ")
                    )
                });
            }
            if values
                .insert(key.clone().into_owned(), value.into_owned())
                .is_some()
            {
                return Err(format!("{noun} `{key}` is given twice; give it once"));
            }
        }
        Ok(Self {
            noun,
            values,
            empty_is_absent,
        })
    }

    /// The admin API's query string: an empty value is refused.
    pub(crate) fn query(raw: Option<&str>, allowed: &[&str]) -> Result<Self, String> {
        Self::parse(raw.unwrap_or("").as_bytes(), QUERY, allowed, false)
    }

    /// The value of `key`, if given.
    pub(crate) fn text(&self, key: &str) -> Result<Option<String>, String> {
        match self.values.get(key) {
            None => Ok(None),
            Some(v) if v.is_empty() && self.empty_is_absent => Ok(None),
            Some(v) if v.is_empty() => Err(format!(
                "{} `{key}` is empty: give a value or leave it out",
                self.noun
            )),
            Some(v) => Ok(Some(v.clone())),
        }
    }

    /// A boolean: exactly `true` or `false`, anything else refused.
    pub(crate) fn flag(&self, key: &str) -> Result<Option<bool>, String> {
        match self.values.get(key).map(String::as_str) {
            None => Ok(None),
            Some("") if self.empty_is_absent => Ok(None),
            Some("true") => Ok(Some(true)),
            Some("false") => Ok(Some(false)),
            Some(other) => Err(format!(
                "{} `{key}`: expected `true` or `false`, not {other:?}",
                self.noun
            )),
        }
    }

    /// A number; `what` says what it counts, for the error.
    pub(crate) fn number<T: std::str::FromStr>(
        &self,
        key: &str,
        what: &str,
    ) -> Result<Option<T>, String> {
        self.text(key)?
            .map(|v| {
                v.parse::<T>()
                    .map_err(|_| format!("{} `{key}`: expected {what}, not {v:?}", self.noun))
            })
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_or_repeated_parameter_is_refused_by_name() {
        let allowed = ["event_name", "dry_run"];
        let parse = |raw: &str| Params::query(Some(raw), &allowed);
        assert_eq!(
            parse("eventname=x").unwrap_err(),
            "unknown query parameter `eventname`; expected one of: event_name, dry_run"
        );
        assert_eq!(
            parse("dry_run=true&dry_run=false").unwrap_err(),
            "query parameter `dry_run` is given twice; give it once"
        );
        assert_eq!(
            Params::query(Some("label=x"), &[]).unwrap_err(),
            "unknown query parameter `label`: this route takes none"
        );
        assert!(Params::query(None, &[]).is_ok());
        assert!(Params::query(Some(""), &[]).is_ok());
        let p = parse("event_name=a%2Eb").unwrap();
        assert_eq!(p.text("event_name").unwrap().as_deref(), Some("a.b"));
        assert_eq!(
            parse("event_name=")
                .unwrap()
                .text("event_name")
                .unwrap_err(),
            "query parameter `event_name` is empty: give a value or leave it out"
        );
        let form = Params::parse(b"event_name=&csrf=x", FORM, &["event_name", "csrf"], true);
        assert_eq!(form.unwrap().text("event_name").unwrap(), None);
    }

    #[test]
    fn booleans_are_true_or_false_and_nothing_else() {
        let flag = |raw: &str| Params::query(Some(raw), &["dry_run"])?.flag("dry_run");
        assert_eq!(flag("dry_run=true"), Ok(Some(true)));
        assert_eq!(flag("dry_run=false"), Ok(Some(false)));
        assert_eq!(flag(""), Ok(None));
        for bad in ["yes", "True", "TRUE", "1", "0", "", "on", "true%20"] {
            assert_eq!(
                flag(&format!("dry_run={bad}")).unwrap_err(),
                format!(
                    "query parameter `dry_run`: expected `true` or `false`, not {:?}",
                    bad.replace("%20", " ")
                ),
                "{bad}"
            );
        }
        assert!(flag("dry_run").is_err(), "a bare key is an empty value");
    }
}
