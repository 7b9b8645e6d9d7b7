//! The web config file as the endpoint enforces it: the file and the files it names
//! (certificate, key, client CA) read as one [`Snapshot`] and built into a [`WebConfig`] (the
//! settings `config::web` validates, with TLS and basic auth made ready), then followed while
//! the endpoint serves ([`WebConfigFile`]).

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use hyper::header::{HeaderName, HeaderValue};
use rustls::{sign::CertifiedKey, ServerConfig};

use super::{basic_auth::BasicAuth, tls};
use crate::config::web::{named_files, Pem, WebConfigError, WebSettings};

/// How often the web config file and the files it names are compared with what was last read.
const RELOAD_CHECK: Duration = Duration::from_secs(1);

/// The files a config is made from and their bytes (or why they could not be read): the web
/// config file first when it is followed, then the files its bytes name, read after it. A
/// config is built from the bytes its snapshot holds, never from a file read again meanwhile:
/// a named file that changes after it was read differs at the next check and is read again.
#[derive(Clone, PartialEq, Eq)]
struct Snapshot(Vec<(PathBuf, Result<Vec<u8>, String>)>);

impl Snapshot {
    fn read(path: &Path) -> Result<Vec<u8>, String> {
        std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The files web config text names, resolved against `base_dir`, as they are now.
    fn named(text: &[u8], base_dir: &Path) -> Self {
        let files = named_files(text, base_dir).into_iter();
        Self(files.map(|p| (p.clone(), Self::read(&p))).collect())
    }

    /// The web config file at `path` as `bytes`, and the files those bytes name.
    fn of(path: &Path, bytes: Result<Vec<u8>, String>) -> Self {
        let base_dir = path.parent().unwrap_or(Path::new("."));
        let named = bytes
            .as_deref()
            .map_or(Self(Vec::new()), |b| Self::named(b, base_dir));
        Self([vec![(path.to_path_buf(), bytes)], named.0].concat())
    }

    /// The settings of the web config file this snapshot starts with (read from `path`).
    fn settings(&self, path: &Path) -> Result<WebSettings, WebConfigError> {
        let text = self.0.first().and_then(|(_, b)| b.as_deref().ok());
        let text = String::from_utf8_lossy(text.unwrap_or_default());
        let base_dir = path.parent().unwrap_or(Path::new("."));
        WebSettings::parse(&text, &path.display().to_string(), base_dir)
    }

    /// The PEM data of `pem` as read.
    fn pem(&self, pem: &Pem) -> Result<Vec<u8>, String> {
        let path = match pem {
            Pem::Inline(text) => return Ok(text.as_bytes().to_vec()),
            Pem::File(path) => path,
        };
        match self.0.iter().find(|(p, _)| p == path) {
            Some((_, bytes)) => bytes.clone(),
            None => Err(format!("{}: not read", path.display())),
        }
    }
}

/// The validated file: what the endpoint enforces.
#[derive(Debug)]
pub struct WebConfig {
    /// TLS server configuration; `None` serves plain HTTP.
    pub tls: Option<Arc<ServerConfig>>,
    pub basic_auth: Option<Arc<BasicAuth>>,
    /// Headers added to every response.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Whether HTTP/2 is offered (default true).
    pub http2: bool,
    /// The certificate and key TLS serves (with `tls`).
    pub(super) served_cert: Option<Arc<CertifiedKey>>,
}

impl WebConfig {
    /// Parses and validates web config text, with the files it names as they are now;
    /// `origin` names it in errors and relative paths are resolved against `base_dir`.
    pub fn parse(text: &str, origin: &str, base_dir: &Path) -> Result<Self, WebConfigError> {
        let settings = WebSettings::parse(text, origin, base_dir)?;
        let files = Snapshot::named(text.as_bytes(), base_dir);
        Self::build(settings, origin, &files, None)
    }

    /// The config of `settings` with the files as `files` read them. A certificate and key
    /// files that do not load as a pair leave `serving`, the pair in use, served (`tls`).
    fn build(
        settings: WebSettings,
        origin: &str,
        files: &Snapshot,
        serving: Option<&Arc<CertifiedKey>>,
    ) -> Result<Self, WebConfigError> {
        let (tls, served_cert) = match &settings.tls {
            None => (None, None),
            Some(tls) => {
                let read = |pem: &Pem| files.pem(pem);
                let (tls, served) = tls::server_config(tls, &read, settings.http2, serving)
                    .map_err(|(key, problem)| WebConfigError::Invalid {
                        path: origin.to_string(),
                        key: format!("tls_server_config.{key}"),
                        problem,
                    })?;
                (Some(tls), Some(served))
            }
        };
        let users = settings.users;
        Ok(Self {
            tls,
            basic_auth: (!users.is_empty()).then(|| Arc::new(BasicAuth::new(users))),
            headers: settings.headers,
            http2: settings.http2,
            served_cert,
        })
    }
}

/// The web config file as the endpoint enforces it: read at start, then followed by
/// [`WebConfigFile::follow`], which compares the file and the files it names with what was
/// last read once a second ([`RELOAD_CHECK`]), off the request path, as exporter-toolkit
/// re-reads its file on every request. A change is applied once the files read the same at
/// two checks in a row, and what is parsed is the bytes compared, so a file caught half
/// written (a writer that truncates, then writes) is not applied unless it stays so; an empty
/// file, which is what such a writer leaves while it stalls, is refused.
///
/// A change that makes the file invalid fails closed: [`WebConfigFile::current`] is an error
/// (every request is refused) until the file is valid again, because the change may be the
/// revocation of a leaked password, which keeping the previous users would undo; only a
/// certificate and key that do not load as a pair (a key written before its certificate)
/// leave the previous pair in use until they do. What the listener was started with stays:
/// turning TLS on or off needs a restart (serving plain HTTP when the file asks for TLS would
/// send credentials in clear), and a change of `http2` is logged and applied at the next
/// start. Connections already open keep the TLS session they negotiated.
pub struct WebConfigFile {
    path: PathBuf,
    started_tls: bool,
    started_http2: bool,
    state: Mutex<FileState>,
}

struct FileState {
    /// What the config in force (or the refusal) was made from.
    applied: Snapshot,
    /// A change seen at the last check, applied if the next check reads it again.
    pending: Option<Snapshot>,
    current: Result<Arc<WebConfig>, String>,
    /// The last valid config: new TLS connections use its certificate while the file is
    /// invalid, so that clients get the refusal as an HTTP status, not a failed handshake.
    last_valid: Arc<WebConfig>,
    /// Changes applied (valid or refused), for tests.
    changes: u64,
}

impl WebConfigFile {
    /// Reads and validates the file; an error here stops the start-up.
    pub fn load(path: &Path) -> Result<Self, WebConfigError> {
        // The bytes parsed are the bytes remembered: a change made meanwhile is seen as one.
        let bytes = std::fs::read(path).map_err(|source| WebConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let applied = Snapshot::of(path, Ok(bytes));
        let origin = path.display().to_string();
        let config = WebConfig::build(applied.settings(path)?, &origin, &applied, None)?;
        let config = Arc::new(config);
        Ok(Self {
            path: path.to_path_buf(),
            started_tls: config.tls.is_some(),
            started_http2: config.http2,
            state: Mutex::new(FileState {
                applied,
                pending: None,
                current: Ok(config.clone()),
                last_valid: config,
                changes: 0,
            }),
        })
    }

    /// Whether the listener offers HTTP/2: as started.
    pub fn http2(&self) -> bool {
        self.started_http2
    }

    /// What a request is checked against now; the reason while the file is invalid.
    pub fn current(&self) -> Result<Arc<WebConfig>, String> {
        self.lock().current.clone()
    }

    /// The TLS configuration of a new connection (`None`: plain HTTP): the current file's, or
    /// the last valid one's while the file is invalid (the current one, when it is valid).
    pub fn tls(&self) -> Option<Arc<ServerConfig>> {
        self.lock().last_valid.tls.clone()
    }

    /// Checks the files every [`RELOAD_CHECK`] on a thread of its own until `self` is dropped
    /// elsewhere. Reading and validating a file (bcrypt, certificates) never runs on a thread
    /// that serves requests, never waits behind them in the blocking pool, and never under
    /// the lock requests take.
    pub fn follow(self: &Arc<Self>) -> std::io::Result<()> {
        let file = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("web-config".into())
            .spawn(move || loop {
                std::thread::sleep(RELOAD_CHECK);
                let Some(file) = file.upgrade() else {
                    return;
                };
                let checked =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| file.check()));
                if checked.is_err() {
                    // Fail closed: a file nobody follows any more would keep revoked users.
                    tracing::error!("checking the web config file failed; refusing requests");
                    file.check_failed();
                }
            })
            .map(drop)
    }

    /// After a check that could not finish: requests are refused until the files are checked
    /// again from scratch (at the next two checks, even if they do not change).
    fn check_failed(&self) {
        let mut state = self.lock();
        state.current = Err("the web config file could not be checked".into());
        // A snapshot no read of the files equals: the next two checks apply them again.
        state.applied.0.clear();
    }

    /// One check: reads the files, and applies a change that two checks in a row read alike.
    pub(crate) fn check(&self) {
        // The file as it is now, and the files it names now (a new certificate or CA is
        // followed from the change that names it, whether that change is applied or refused),
        // read before the lock requests take.
        let seen = Snapshot::of(&self.path, Snapshot::read(&self.path));
        {
            let mut state = self.lock();
            if seen == state.applied {
                state.pending = None;
                return;
            }
            if state.pending.as_ref() != Some(&seen) {
                // First sight of this change: it may be a file still being written.
                state.pending = Some(seen);
                return;
            }
        }
        // The exact bytes compared are parsed, so what is in force is what was compared.
        let applied = seen;
        let loaded = match &applied.0[0].1 {
            Err(_) => Err(format!(
                "cannot read web config file {}",
                self.path.display()
            )),
            // Empty is valid at start (no TLS, no users), but while running it is what a
            // writer that truncates the file and stalls leaves behind: refused, not applied.
            Ok(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => Err(format!(
                "web config file {} is empty: refused while running (to serve without TLS and \
                 users, restart sysscope with it empty)",
                self.path.display()
            )),
            Ok(_) => self.applicable(&applied),
        };
        match &loaded {
            Ok(_) => tracing::info!(path = %self.path.display(), "web config file reloaded"),
            Err(reason) => tracing::error!(
                error = %reason,
                "web config file changed and cannot be applied: every request is refused \
                 (500) until it is fixed"
            ),
        }
        let mut state = self.lock();
        state.applied = applied;
        state.pending = None;
        state.changes += 1;
        match loaded {
            Ok(config) => {
                if let (Some(now), Some(before)) =
                    (&config.basic_auth, &state.last_valid.basic_auth)
                {
                    now.keep_verified(before);
                }
                let config = Arc::new(config);
                state.last_valid = config.clone();
                state.current = Ok(config);
            }
            Err(reason) => state.current = Err(reason),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FileState> {
        // Every update of the state is a few assignments made together: a panic elsewhere
        // cannot leave it half written.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The config `files` make, if the running listener can enforce it.
    fn applicable(&self, files: &Snapshot) -> Result<WebConfig, String> {
        let path = self.path.display();
        let mut settings = files.settings(&self.path).map_err(|e| e.to_string())?;
        if settings.tls.is_some() != self.started_tls {
            let (now, started, wanted) = match self.started_tls {
                false => ("now configures", "plain HTTP", "TLS"),
                true => ("no longer configures", "TLS", "plain HTTP"),
            };
            return Err(format!(
                "web config file {path}: tls_server_config {now} TLS, but the endpoint was \
                 started serving {started}: restart sysscope to serve {wanted}"
            ));
        }
        // Users gone from a file that had them is also what a writer stalled after
        // `basic_auth_users:` leaves: serving everyone without credentials waits for a restart.
        let serving = {
            let state = self.lock();
            if settings.users.is_empty() && state.last_valid.basic_auth.is_some() {
                return Err(format!(
                    "web config file {path}: basic_auth_users no longer lists any user, but \
                     the endpoint requires credentials: restart sysscope to serve without them"
                ));
            }
            state.last_valid.served_cert.clone()
        };
        if settings.http2 != self.started_http2 {
            tracing::warn!(
                path = %path,
                http2 = settings.http2,
                "http_server_config.http2 changed: it takes effect at the next start"
            );
            // The listener serves what it was started with, so new handshakes must offer
            // exactly that: a client that negotiated `h2` with an HTTP/1-only server fails.
            settings.http2 = self.started_http2;
        }
        WebConfig::build(settings, &path.to_string(), files, serving.as_ref())
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exposition::web_config::{
        basic_auth::AuthPrecheck,
        tests::{basic_header, ops_with, serves, settle, write_cert},
        tls::alpn,
    };

    #[test]
    fn a_changed_file_applies_without_restart_and_an_invalid_one_fails_closed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("web.yml");
        let users = ops_with;
        std::fs::write(&path, users("old")).unwrap();
        let file = WebConfigFile::load(&path).unwrap();
        let allows = |password: &str| {
            let auth = file.current().unwrap().basic_auth.clone().unwrap();
            auth.verify("ops", password.as_bytes())
        };
        assert!(allows("old"));

        std::fs::write(&path, users("new")).unwrap();
        file.check();
        assert!(
            allows("old"),
            "a change seen once may be a file still being written"
        );
        file.check();
        assert!(allows("new"));
        assert!(
            !allows("old"),
            "a rotated password must stop working at once"
        );

        // Caught half written (truncated), then complete: the empty file is never applied.
        std::fs::write(&path, "").unwrap();
        file.check();
        std::fs::write(&path, users("newer")).unwrap();
        file.check();
        assert!(allows("new"));
        file.check();
        assert!(allows("newer"));

        // Truncated and left so (a writer that stalls): refused, not applied as "no users".
        std::fs::write(&path, "").unwrap();
        settle(&file);
        let e = file.current().unwrap_err();
        assert!(e.contains("empty"), "{e}");

        std::fs::write(&path, "basic_auth_users: [\n").unwrap();
        settle(&file);
        let e = file.current().unwrap_err();
        assert!(e.contains("web.yml"), "{e}");
        // Still refused at the next checks, and not applied again: the previous users are
        // not taken back.
        let changes = file.lock().changes;
        settle(&file);
        assert!(file.current().is_err());
        assert_eq!(file.lock().changes, changes);

        std::fs::write(&path, users("fixed")).unwrap();
        settle(&file);
        assert!(allows("fixed"));
        assert!(!allows("newer"));
    }

    #[test]
    fn turning_tls_on_or_off_needs_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        write_cert(dir.path(), "s");
        let tls = "tls_server_config:\n  cert_file: s.crt\n  key_file: s.key\n";
        let path = dir.path().join("web.yml");

        std::fs::write(&path, "").unwrap();
        let plain = WebConfigFile::load(&path).unwrap();
        assert!(plain.tls().is_none());
        std::fs::write(&path, tls).unwrap();
        settle(&plain);
        let e = plain.current().unwrap_err();
        assert!(e.contains("restart"), "{e}");
        assert!(plain.tls().is_none(), "a plain listener stays plain");

        // With a client CA (the usual mutual-TLS set-up), turning TLS off is refused once,
        // not again at every check although the refused file names no CA.
        std::fs::copy(dir.path().join("s.crt"), dir.path().join("ca.crt")).unwrap();
        let mutual = format!(
            "{tls}  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n"
        );
        std::fs::write(&path, &mutual).unwrap();
        let secured = WebConfigFile::load(&path).unwrap();
        assert!(secured.tls().is_some());
        std::fs::write(&path, "").unwrap();
        settle(&secured);
        assert!(secured.current().is_err());
        assert_eq!(secured.lock().changes, 1);
        settle(&secured);
        assert_eq!(
            secured.lock().changes,
            1,
            "a refused change was applied again"
        );
        // New connections still handshake (with the last valid certificate) to be refused
        // with a status, not a broken handshake.
        assert!(secured.tls().is_some());
        std::fs::write(&path, format!("{mutual}basic_auth_users: {{}}\n")).unwrap();
        settle(&secured);
        assert!(secured.current().is_ok());
        assert_eq!(secured.lock().changes, 2);
    }

    #[test]
    fn a_changed_http2_setting_keeps_the_protocols_the_listener_serves() {
        let dir = tempfile::tempdir().unwrap();
        write_cert(dir.path(), "s");
        let path = dir.path().join("web.yml");
        let tls = "tls_server_config:\n  cert_file: s.crt\n  key_file: s.key\n";
        std::fs::write(&path, format!("{tls}http_server_config:\n  http2: false\n")).unwrap();
        let file = WebConfigFile::load(&path).unwrap();
        assert_eq!(file.tls().unwrap().alpn_protocols, alpn(false));

        // http2 back to its default (true), and a header so that the change is applied.
        std::fs::write(
            &path,
            format!("{tls}http_server_config:\n  headers:\n    X-Frame-Options: deny\n"),
        )
        .unwrap();
        settle(&file);
        let config = file.current().unwrap();
        assert_eq!(config.headers.len(), 1, "the change was not applied");
        assert!(!config.http2);
        assert_eq!(
            file.tls().unwrap().alpn_protocols,
            alpn(false),
            "new handshakes would offer h2 to an HTTP/1-only listener"
        );
    }

    #[test]
    fn a_certificate_pair_that_does_not_load_keeps_the_previous_pair_until_it_does() {
        let dir = tempfile::tempdir().unwrap();
        write_cert(dir.path(), "old");
        let path = dir.path().join("web.yml");
        std::fs::write(
            &path,
            "tls_server_config:\n  cert_file: old.crt\n  key_file: old.key\n",
        )
        .unwrap();
        let file = WebConfigFile::load(&path).unwrap();

        // The file names a certificate its writer has not written yet, and adds a header: the
        // header applies, the previous pair stays in use.
        std::fs::write(
            &path,
            "tls_server_config:\n  cert_file: new.crt\n  key_file: new.key\n\
             http_server_config:\n  headers:\n    X-Frame-Options: deny\n",
        )
        .unwrap();
        settle(&file);
        let config = file
            .current()
            .expect("a pair that does not load refused the change");
        assert_eq!(
            config.headers.len(),
            1,
            "the rest of the change was not applied"
        );
        assert!(serves(&config, dir.path(), "old"));

        // Written, but the key first: still no pair, still the very pair in use.
        let in_use = config.served_cert.clone().unwrap();
        let old_crt = dir.path().join("old.crt");
        write_cert(dir.path(), "new");
        let new_crt = std::fs::read(dir.path().join("new.crt")).unwrap();
        std::fs::copy(&old_crt, dir.path().join("new.crt")).unwrap();
        settle(&file);
        let config = file.current().unwrap();
        assert!(Arc::ptr_eq(config.served_cert.as_ref().unwrap(), &in_use));

        // The certificate follows: the new pair is served.
        std::fs::write(dir.path().join("new.crt"), new_crt).unwrap();
        settle(&file);
        assert!(
            serves(&file.current().unwrap(), dir.path(), "new"),
            "the new pair was not taken once it loaded"
        );
    }

    #[test]
    fn a_change_is_parsed_from_the_files_as_compared_not_as_read_again() {
        let dir = tempfile::tempdir().unwrap();
        write_cert(dir.path(), "a");
        write_cert(dir.path(), "b");
        let text = "tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n";
        let web = dir.path().join("web.yml");
        std::fs::write(&web, text).unwrap();
        // The follower compared a.crt and a.key holding b's pair; on disk they hold a's now.
        let mut compared = Snapshot::of(&web, Ok(text.as_bytes().to_vec()));
        for (i, name) in ["b.crt", "b.key"].iter().enumerate() {
            compared.0[i + 1].1 = Ok(std::fs::read(dir.path().join(name)).unwrap());
        }
        let settings = WebSettings::parse(text, "web.yml", dir.path()).unwrap();
        let config = WebConfig::build(settings, "web.yml", &compared, None).unwrap();
        assert!(
            serves(&config, dir.path(), "b"),
            "the files were read again"
        );
        // At start, the files as they are.
        let config = WebConfig::parse(text, "web.yml", dir.path()).unwrap();
        assert!(serves(&config, dir.path(), "a"));
    }

    #[test]
    fn a_change_refused_for_a_missing_client_ca_applies_once_the_file_is_written() {
        let dir = tempfile::tempdir().unwrap();
        write_cert(dir.path(), "s");
        let path = dir.path().join("web.yml");
        let tls = "tls_server_config:\n  cert_file: s.crt\n  key_file: s.key\n";
        std::fs::write(&path, tls).unwrap();
        let file = WebConfigFile::load(&path).unwrap();

        // The file names a client CA its writer has not written yet: refused (a CA is who may
        // connect, so none is assumed), and tried again when the CA appears.
        std::fs::write(
            &path,
            format!(
                "{tls}  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n"
            ),
        )
        .unwrap();
        settle(&file);
        let e = file.current().unwrap_err();
        assert!(e.contains("ca.crt"), "{e}");
        settle(&file);
        assert!(file.current().is_err());

        write_cert(dir.path(), "ca");
        settle(&file);
        assert!(
            file.current().is_ok(),
            "the refusal was not tried again when the named CA appeared"
        );
    }

    #[test]
    fn users_removed_while_running_are_refused_until_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("web.yml");
        std::fs::write(&path, ops_with("pw")).unwrap();
        let file = WebConfigFile::load(&path).unwrap();
        // What a writer that stalled after the key leaves: a valid file with no users.
        std::fs::write(&path, "basic_auth_users:\n").unwrap();
        settle(&file);
        let e = file.current().unwrap_err();
        assert!(e.contains("restart"), "{e}");
        std::fs::write(&path, ops_with("pw2")).unwrap();
        settle(&file);
        assert!(file.current().is_ok());
        // At start, a file without users is what the operator asked for.
        std::fs::write(&path, "basic_auth_users:\n").unwrap();
        assert!(WebConfigFile::load(&path)
            .unwrap()
            .current()
            .unwrap()
            .basic_auth
            .is_none());
    }

    #[test]
    fn verified_users_stay_verified_across_a_change_unless_their_hash_changed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("web.yml");
        let hash = |password: &str| bcrypt::hash(password, 4).unwrap();
        let (ops, dev) = (hash("ops-pw"), hash("dev-pw"));
        std::fs::write(
            &path,
            format!("basic_auth_users:\n  ops: '{ops}'\n  dev: '{dev}'\n"),
        )
        .unwrap();
        let file = WebConfigFile::load(&path).unwrap();
        let header = basic_header;
        let precheck = |user: &str, password: &str| {
            let auth = file.current().unwrap().basic_auth.clone().unwrap();
            auth.precheck(Some(header(user, password).as_bytes()))
        };
        let auth = file.current().unwrap().basic_auth.clone().unwrap();
        assert!(auth.check(Some(header("ops", "ops-pw").as_bytes())));
        assert!(auth.check(Some(header("dev", "dev-pw").as_bytes())));
        // dev's password rotates and a user joins; ops is untouched.
        let dev2 = hash("dev-pw2");
        let new = hash("new-pw");
        std::fs::write(
            &path,
            format!("basic_auth_users:\n  ops: '{ops}'\n  dev: '{dev2}'\n  new: '{new}'\n"),
        )
        .unwrap();
        settle(&file);
        assert_eq!(file.lock().changes, 1);
        assert_eq!(precheck("ops", "ops-pw"), AuthPrecheck::Allowed);
        assert!(matches!(
            precheck("dev", "dev-pw"),
            AuthPrecheck::Verify { .. }
        ));
        let auth = file.current().unwrap().basic_auth.clone().unwrap();
        // Only ops's entry came along: dev's old one could never match again.
        assert_eq!(auth.cache.lock().unwrap().len(), 1);
        assert!(!auth.check(Some(header("dev", "dev-pw").as_bytes())));
        assert!(auth.check(Some(header("dev", "dev-pw2").as_bytes())));
        // A user removed and added back with another hash is not taken as verified either.
        std::fs::write(&path, format!("basic_auth_users:\n  dev: '{dev2}'\n")).unwrap();
        settle(&file);
        std::fs::write(
            &path,
            format!(
                "basic_auth_users:\n  dev: '{dev2}'\n  ops: '{}'\n",
                hash("ops-pw")
            ),
        )
        .unwrap();
        settle(&file);
        assert_eq!(file.lock().changes, 3);
        assert!(matches!(
            precheck("ops", "ops-pw"),
            AuthPrecheck::Verify { .. }
        ));
        assert_eq!(precheck("dev", "dev-pw2"), AuthPrecheck::Allowed);
    }

    #[test]
    fn a_check_that_failed_is_made_again_although_nothing_changed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("web.yml");
        std::fs::write(&path, ops_with("pw")).unwrap();
        let file = WebConfigFile::load(&path).unwrap();
        // What the follower does when a check panics.
        file.check_failed();
        assert!(file.current().is_err());
        settle(&file);
        assert!(
            file.current().is_ok(),
            "refused for good after one failed check"
        );
    }

    #[test]
    fn a_changed_client_ca_file_reloads_the_config() {
        let dir = tempfile::tempdir().unwrap();
        let self_signed = |name: &str| {
            let key = rcgen::KeyPair::generate().unwrap();
            let cert = rcgen::CertificateParams::new(vec![name.into()])
                .unwrap()
                .self_signed(&key)
                .unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let (cert, key) = self_signed("localhost");
        std::fs::write(dir.path().join("s.crt"), cert).unwrap();
        std::fs::write(dir.path().join("s.key"), key).unwrap();
        std::fs::write(dir.path().join("ca.crt"), self_signed("first CA").0).unwrap();
        let path = dir.path().join("web.yml");
        std::fs::write(
            &path,
            "tls_server_config:\n  cert_file: s.crt\n  key_file: s.key\n  \
             client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n",
        )
        .unwrap();
        let file = WebConfigFile::load(&path).unwrap();
        let first = file.current().unwrap();
        settle(&file);
        assert!(Arc::ptr_eq(&first, &file.current().unwrap()), "unchanged");

        std::fs::write(dir.path().join("ca.crt"), self_signed("second CA").0).unwrap();
        settle(&file);
        let second = file.current().unwrap();
        assert!(
            !Arc::ptr_eq(&first, &second),
            "a new client CA was not read"
        );

        std::fs::write(dir.path().join("ca.crt"), "not a certificate").unwrap();
        settle(&file);
        let e = file.current().unwrap_err();
        assert!(e.contains("client_ca_file"), "{e}");
    }
}
