//! `basic_auth_users`: credentials checked against bcrypt hashes. A verified credential is
//! remembered (a SHA-256 of user, password and hash) so that a scrape does not pay bcrypt each
//! time; an unknown user is checked against the costliest user's hash (and refused) so that
//! it costs what a wrong password costs. Who may run bcrypt, and when, is the HTTP endpoint's auth gate.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Mutex,
};

use base64::Engine;

/// Password hashes of `basic_auth_users`, checked with bcrypt.
pub struct BasicAuth {
    users: BTreeMap<String, String>,
    /// Checked for unknown users (who are refused whatever it says), so a wrong user costs
    /// what a wrong password costs.
    costliest: String,
    /// SHA-256 of (user, password, hash) of recent successful checks, and the user: bcrypt
    /// costs tens of milliseconds by design, too much to pay on every scrape.
    pub(super) cache: Mutex<HashMap<[u8; 32], String>>,
}

impl std::fmt::Debug for BasicAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BasicAuth")
            .field("users", &self.users.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// Successful checks remembered at most (the cache is cleared when full).
const AUTH_CACHE_MAX: usize = 1024;

/// The outcome of the cheap part of a check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AuthPrecheck {
    /// A recently verified credential.
    Allowed,
    /// No or malformed `Authorization` header.
    Denied,
    /// Needs a bcrypt verification ([`BasicAuth::verify`]).
    Verify { user: String, password: Vec<u8> },
}

impl BasicAuth {
    pub(super) fn new(users: BTreeMap<String, String>) -> Self {
        let cost = |h: &&String| h.parse::<bcrypt::HashParts>().map_or(0, |p| p.get_cost());
        let costliest = users.values().max_by_key(cost).cloned().unwrap_or_default();
        Self {
            users,
            costliest,
            cache: Mutex::new(HashMap::new()),
        }
    }

    fn cache_key(user: &str, password: &[u8], hash: &str) -> [u8; 32] {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        for part in [user.as_bytes(), b"\0", password, b"\0", hash.as_bytes()] {
            ctx.update(part);
        }
        let mut out = [0u8; 32];
        out.copy_from_slice(ctx.finish().as_ref());
        out
    }

    /// Parses an `Authorization` header and answers from the cache when it can. Cheap.
    pub(crate) fn precheck(&self, header: Option<&[u8]>) -> AuthPrecheck {
        let Some((user, password)) = header.and_then(parse_basic) else {
            return AuthPrecheck::Denied;
        };
        if let Some(hash) = self.users.get(&user) {
            let key = Self::cache_key(&user, &password, hash);
            if self.cache.lock().is_ok_and(|c| c.contains_key(&key)) {
                return AuthPrecheck::Allowed;
            }
        }
        AuthPrecheck::Verify { user, password }
    }

    /// The bcrypt check. Blocking and deliberately slow: call from a blocking thread.
    pub(crate) fn verify(&self, user: &str, password: &[u8]) -> bool {
        let (hash, known) = match self.users.get(user) {
            Some(h) => (h.as_str(), true),
            None => (self.costliest.as_str(), false),
        };
        let ok = bcrypt::verify(password, hash).unwrap_or(false) && known;
        if ok {
            if let Ok(mut cache) = self.cache.lock() {
                if cache.len() >= AUTH_CACHE_MAX {
                    cache.clear();
                }
                cache.insert(Self::cache_key(user, password, hash), user.to_string());
            }
        }
        ok
    }

    /// Keeps the credentials `earlier` verified of the users whose hash is unchanged (`self`
    /// being the users after a change): a rotated password or a removed user is checked
    /// afresh, and the others do not pay a bcrypt check again after each change. (An entry
    /// binds user, password and hash, so another user's could never match; they are left out
    /// rather than kept until the cache fills.)
    pub(super) fn keep_verified(&self, earlier: &BasicAuth) {
        let Ok(verified) = earlier.cache.lock() else {
            return;
        };
        if let Ok(mut cache) = self.cache.lock() {
            let kept = verified
                .iter()
                .filter(|(_, user)| {
                    let hash = self.users.get(*user);
                    hash.is_some() && hash == earlier.users.get(*user)
                })
                .take(AUTH_CACHE_MAX.saturating_sub(cache.len()));
            for (key, user) in kept {
                cache.insert(*key, user.clone());
            }
        }
    }
}

/// `Basic <base64(user:password)>` -> (user, password).
pub fn parse_basic(header: &[u8]) -> Option<(String, Vec<u8>)> {
    let header = std::str::from_utf8(header).ok()?.trim();
    let (scheme, rest) = header.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(rest.trim())
        .ok()?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    let user = String::from_utf8(decoded[..colon].to_vec()).ok()?;
    Some((user, decoded[colon + 1..].to_vec()))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::exposition::web_config::{
        tests::{basic_header, err},
        WebConfig,
    };

    impl BasicAuth {
        /// Both steps at once (blocking).
        pub(crate) fn check(&self, header: Option<&[u8]>) -> bool {
            match self.precheck(header) {
                AuthPrecheck::Allowed => true,
                AuthPrecheck::Denied => false,
                AuthPrecheck::Verify { user, password } => self.verify(&user, &password),
            }
        }
    }

    #[test]
    fn basic_auth_hashes_are_validated_and_checked() {
        let e = err("basic_auth_users:\n  alice: plaintext\n");
        assert!(
            e.contains("basic_auth_users.alice") && e.contains("bcrypt"),
            "{e}"
        );
        let e = err("basic_auth_users:\n  \"a:b\": x\n");
        assert!(e.contains("basic_auth_users.a:b"), "{e}");

        // Cost 4, the minimum, keeps the test fast.
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        let c = WebConfig::parse(
            &format!("basic_auth_users:\n  alice: '{hash}'\n"),
            "x",
            Path::new("."),
        )
        .unwrap();
        let auth = c.basic_auth.unwrap();
        let header = basic_header;
        assert!(auth.check(Some(header("alice", "s3cret").as_bytes())));
        // The second check of the same credentials comes from the cache.
        assert_eq!(
            auth.precheck(Some(header("alice", "s3cret").as_bytes())),
            AuthPrecheck::Allowed
        );
        assert!(!auth.check(Some(header("alice", "wrong").as_bytes())));
        assert!(!auth.check(Some(header("bob", "s3cret").as_bytes())));
        assert!(!auth.check(None));
        assert!(!auth.check(Some(b"Bearer abc")));
        assert!(!auth.check(Some(b"Basic !!!not-base64")));
        assert!(!auth.check(Some(b"Basic")));
        // A password containing ':' is fine: only the first ':' separates the user.
        let hash2 = bcrypt::hash("a:b", 4).unwrap();
        let c = WebConfig::parse(
            &format!("basic_auth_users:\n  carol: '{hash2}'\n"),
            "x",
            Path::new("."),
        )
        .unwrap();
        assert!(c
            .basic_auth
            .unwrap()
            .check(Some(header("carol", "a:b").as_bytes())));
    }

    #[test]
    fn basic_header_parsing() {
        assert_eq!(
            parse_basic(b"basic YTpi"),
            Some(("a".to_string(), b"b".to_vec()))
        );
        assert_eq!(parse_basic(b"Basic Og=="), Some((String::new(), vec![])));
        assert_eq!(parse_basic(b"Basic YWI="), None, "no colon");
        assert_eq!(parse_basic(b"\xff\xfe"), None);
    }
}
