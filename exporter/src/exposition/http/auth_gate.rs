//! Basic auth of every request (with `--web.config.file`), and the headers it configures; and
//! since bcrypt costs tens of milliseconds of CPU by design, who runs it, and when ([`Security`]).
//!
//! The health and readiness checks (`GET`/`HEAD` of `/-/healthy` and `/-/ready`) answer
//! without credentials, over TLS when it is configured: they say only whether the process is
//! alive and ready, and probes (the kubelet's, a load balancer's) then need no password in
//! their own configuration, where anyone who can read it would find it. An invalid file fails
//! them closed like every other request.

use std::{
    collections::HashMap,
    future::Future,
    net::IpAddr,
    sync::{Arc, Mutex},
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{
    body::Incoming,
    header::{self, HeaderValue},
    Request, Response, StatusCode,
};
use tokio::sync::Semaphore;

use super::{
    admission::{peer_group, Activity, Queued},
    routes::{handle, text, AppState},
};
use crate::exposition::web_config::{AuthPrecheck, BasicAuth, WebConfig, WebConfigFile};

/// bcrypt checks running at once: each costs tens of milliseconds of CPU by design, so
/// guessing passwords must not take more than this many cores.
const MAX_CONCURRENT_PASSWORD_CHECKS: usize = 2;

/// What `--web.config.file` asks of every request, shared by the connections, and who runs
/// bcrypt, and when. Checks are capped at [`MAX_CONCURRENT_PASSWORD_CHECKS`] and each peer (an
/// IPv6 /64 counts as one, [`peer_group`]) gets one lane: its requests are checked one after
/// another, so however many guesses one peer sends, they hold one slot at most and a login
/// from another address waits for at most one check in progress. Verified credentials are
/// looked up before the lane and again after it: the same peer's login checked meanwhile is
/// not checked again.
///
/// The lane and the slot are held by the check itself, not by the request: a request whose
/// client hangs up (or whose connection is evicted) mid-check frees neither before bcrypt is
/// done, so hanging up cannot start more checks than the caps allow.
pub(super) struct Security {
    pub(super) web: Option<Arc<WebConfigFile>>,
    slots: Arc<Semaphore>,
    lanes: Mutex<Lanes>,
}

/// The peers' lanes, held weakly: a lane lives as long as a request holds it, and dead entries
/// are swept once the table has doubled since the last sweep, so a request dropped at any
/// point leaves nothing behind for long: the table holds at most twice the lanes alive at the
/// last sweep, or [`LANES_SWEEP_MIN`].
struct Lanes {
    by_peer: HashMap<IpAddr, std::sync::Weak<tokio::sync::Mutex<()>>>,
    sweep_at: usize,
}

/// The fewest entries of [`Lanes`] before a sweep.
const LANES_SWEEP_MIN: usize = 64;

impl Security {
    pub(super) fn new(web: Option<Arc<WebConfigFile>>) -> Self {
        Self {
            web,
            slots: Arc::new(Semaphore::new(MAX_CONCURRENT_PASSWORD_CHECKS)),
            lanes: Mutex::new(Lanes {
                by_peer: HashMap::new(),
                sweep_at: LANES_SWEEP_MIN,
            }),
        }
    }

    /// Checks a request's credentials against `file` as it is in force: the config checked
    /// against and whether they are allowed; `None` while the file is invalid. A password
    /// check can wait for its turn; if the file changed meanwhile (a rotated password), the
    /// request is checked again against what is in force now.
    async fn authorize(
        &self,
        file: &WebConfigFile,
        peer: IpAddr,
        header: Option<&[u8]>,
        activity: &Activity,
    ) -> Option<(Arc<WebConfig>, bool)> {
        for _ in 0..3 {
            let web = file.current().ok()?;
            let allowed = match &web.basic_auth {
                None => true,
                Some(auth) => self.allowed(peer, auth, header, activity).await,
            };
            if Arc::ptr_eq(&file.current().ok()?, &web) {
                return Some((web, allowed));
            }
        }
        // Changed at every check: refuse rather than check forever.
        Some((file.current().ok()?, false))
    }

    /// The lane of `peer`'s group, made if no request holds it.
    fn lane(&self, peer: IpAddr) -> Arc<tokio::sync::Mutex<()>> {
        let mut lanes = self
            .lanes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let group = peer_group(peer);
        if let Some(lane) = lanes.by_peer.get(&group).and_then(std::sync::Weak::upgrade) {
            return lane;
        }
        if lanes.by_peer.len() >= lanes.sweep_at {
            lanes.by_peer.retain(|_, lane| lane.strong_count() > 0);
            lanes.sweep_at = (lanes.by_peer.len() * 2).max(LANES_SWEEP_MIN);
        }
        let lane = Arc::new(tokio::sync::Mutex::new(()));
        lanes.by_peer.insert(group, Arc::downgrade(&lane));
        lane
    }

    async fn allowed(
        &self,
        peer: IpAddr,
        auth: &Arc<BasicAuth>,
        header: Option<&[u8]>,
        activity: &Activity,
    ) -> bool {
        // A credential verified before, or none at all, is answered at once: it never waits
        // in a lane behind guesses from its own address (a shared NAT, say).
        match auth.precheck(header) {
            AuthPrecheck::Verify { .. } => {}
            checked => return checked == AuthPrecheck::Allowed,
        }
        let lane = self.lane(peer);
        let turn = waiting(
            activity,
            lane.clone().try_lock_owned().ok(),
            lane.lock_owned(),
        )
        .await;
        let (user, password) = match auth.precheck(header) {
            AuthPrecheck::Verify { user, password } => (user, password),
            // Verified meanwhile (the same login, checked in the lane before this one).
            checked => return checked == AuthPrecheck::Allowed,
        };
        let slots = &self.slots;
        let slot = slots.clone().try_acquire_owned().ok().map(Ok);
        let Ok(slot) = waiting(activity, slot, slots.clone().acquire_owned()).await else {
            return false;
        };
        let auth = auth.clone();
        tokio::task::spawn_blocking(move || {
            let _held = (turn, slot);
            auth.verify(&user, &password)
        })
        .await
        .unwrap_or(false)
    }
}

/// `ready`, or else what `wait` resolves to, the request counted as waiting meanwhile (waiting
/// for the peer's lane or for a check slot): an uncontended turn never makes its connection
/// look evictable.
async fn waiting<T>(activity: &Activity, ready: Option<T>, wait: impl Future<Output = T>) -> T {
    match ready {
        Some(ready) => ready,
        None => {
            let _queued = Queued::start(activity);
            wait.await
        }
    }
}

/// The answer while the web config file is invalid (logged when it changed; refused until it
/// is fixed).
fn invalid_file() -> Response<Full<Bytes>> {
    text(
        StatusCode::INTERNAL_SERVER_ERROR,
        "The web config file is invalid; see the exporter's log.\n",
    )
}

/// Whether `req` is a health or readiness check, which needs no credentials.
fn is_health_check<B>(req: &Request<B>) -> bool {
    matches!(*req.method(), hyper::Method::GET | hyper::Method::HEAD)
        && matches!(req.uri().path(), "/-/healthy" | "/-/ready")
}

/// Serves one request after basic auth, adding the configured headers.
pub(super) async fn handle_secured(
    state: Arc<AppState>,
    security: &Security,
    peer: IpAddr,
    activity: &Activity,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let Some(file) = &security.web else {
        return handle(state, req).await;
    };
    if is_health_check(&req) {
        // Without credentials, but not past an invalid file: that fails closed here too, so
        // a liveness probe restarts the process, which then says what is wrong with it.
        let Ok(web) = file.current() else {
            return invalid_file();
        };
        let mut resp = handle(state, req).await;
        for (name, value) in &web.headers {
            resp.headers_mut().insert(name.clone(), value.clone());
        }
        return resp;
    }
    let header = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    let Some((web, allowed)) = security.authorize(file, peer, header, activity).await else {
        return invalid_file();
    };
    let mut resp = if allowed {
        handle(state, req).await
    } else {
        let mut r = text(StatusCode::UNAUTHORIZED, "Unauthorized\n");
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"sysscope\""),
        );
        r
    };
    for (name, value) in &web.headers {
        resp.headers_mut().insert(name.clone(), value.clone());
    }
    resp
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn only_health_and_readiness_reads_skip_auth() {
        let req =
            |method: &str, uri: &str| Request::builder().method(method).uri(uri).body(()).unwrap();
        for (method, uri) in [
            ("GET", "/-/healthy"),
            ("HEAD", "/-/healthy"),
            ("GET", "/-/ready"),
            ("GET", "/-/ready?x=1"),
        ] {
            assert!(is_health_check(&req(method, uri)), "{method} {uri}");
        }
        for (method, uri) in [
            ("GET", "/metrics"),
            ("POST", "/-/reload"),
            ("POST", "/-/ready"),
            ("GET", "/-/readyz"),
            ("GET", "/-/ready/"),
            ("GET", "/"),
            ("GET", "/api/v1/slow_calls"),
        ] {
            assert!(!is_health_check(&req(method, uri)), "{method} {uri}");
        }
    }

    fn two_thread_runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn a_verified_credential_is_answered_without_waiting_behind_its_address_guesses() {
        use base64::Engine as _;
        let hash = bcrypt::hash("right", 4).unwrap();
        let auth = WebConfig::parse(
            &format!("basic_auth_users:\n  ops: '{hash}'\n"),
            "web.yml",
            std::path::Path::new("."),
        )
        .unwrap()
        .basic_auth
        .unwrap();
        let header = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("ops:right")
        );
        assert!(auth.check(Some(header.as_bytes())), "verified once");
        two_thread_runtime().block_on(async {
            let checks = Security::new(None);
            let peer: IpAddr = "192.0.2.1".parse().unwrap();
            // A guess from the same address (a shared NAT) holds the address's turn.
            let lane = checks.lane(peer);
            let _guess = lane.lock().await;
            let activity = Activity::new();
            let answered = tokio::time::timeout(
                Duration::from_secs(5),
                checks.allowed(peer, &auth, Some(header.as_bytes()), &activity),
            )
            .await;
            assert_eq!(
                answered,
                Ok(true),
                "a verified credential waited behind its address's guesses"
            );
        });
    }

    #[test]
    fn a_check_whose_request_is_dropped_holds_its_slot_until_bcrypt_is_done_and_leaves_no_lane() {
        let runtime = two_thread_runtime();
        runtime.block_on(async {
            let checks = Arc::new(Security::new(None));
            // Cost 11: a check takes long enough (about a second, unoptimized) to drop the
            // request during it and look, even on a loaded machine.
            let hash = bcrypt::hash("right", 11).unwrap();
            let auth = Arc::new(
                WebConfig::parse(
                    &format!("basic_auth_users:\n  ops: '{hash}'\n"),
                    "web.yml",
                    std::path::Path::new("."),
                )
                .unwrap()
                .basic_auth
                .unwrap(),
            );
            use base64::Engine as _;
            let header = format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode("ops:wrong")
            );
            let peer: IpAddr = "192.0.2.1".parse().unwrap();
            let request = {
                let (checks, auth) = (checks.clone(), auth.clone());
                tokio::spawn(async move {
                    let activity = Activity::new();
                    checks
                        .allowed(peer, &auth, Some(header.as_bytes()), &activity)
                        .await
                })
            };
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while checks.slots.available_permits() == MAX_CONCURRENT_PASSWORD_CHECKS {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the check never started"
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            // The client hangs up mid-check.
            request.abort();
            assert!(request.await.unwrap_err().is_cancelled());
            assert_eq!(
                checks.slots.available_permits(),
                MAX_CONCURRENT_PASSWORD_CHECKS - 1,
                "the slot was freed while bcrypt still ran"
            );
            assert!(
                checks.lane(peer).try_lock().is_err(),
                "the lane was free while its check still ran"
            );
            while checks.slots.available_permits() < MAX_CONCURRENT_PASSWORD_CHECKS {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the slot never came back"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });

        // Lanes of peers gone are swept: many peers one after another leave a bounded table.
        let checks = Security::new(None);
        for i in 0..10_000u32 {
            drop(checks.lane(IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i))));
        }
        let left = checks.lanes.lock().unwrap().by_peer.len();
        assert!(left <= LANES_SWEEP_MIN, "{left} lanes of gone peers kept");
    }

    #[test]
    fn a_password_check_that_waited_through_a_rotation_is_checked_again() {
        let users = |password: &str| {
            let hash = bcrypt::hash(password, 4).unwrap();
            format!("basic_auth_users:\n  ops: '{hash}'\n")
        };
        use base64::Engine as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("web.yml");
        std::fs::write(&path, users("old")).unwrap();
        let file = Arc::new(WebConfigFile::load(&path).unwrap());
        let security = Arc::new(Security::new(Some(file.clone())));
        let peer: IpAddr = "192.0.2.1".parse().unwrap();
        let header = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("ops:old")
        );
        let runtime = two_thread_runtime();
        runtime.block_on(async {
            let allowed = |security: Arc<Security>, file: Arc<WebConfigFile>| {
                let header = header.clone();
                async move {
                    let activity = Activity::new();
                    security
                        .authorize(&file, peer, Some(header.as_bytes()), &activity)
                        .await
                        .map(|(_, allowed)| allowed)
                }
            };
            // (The credential is not checked first: a verified one is answered from the cache
            // without waiting, so it could not wait through anything.)
            // The peer's lane is busy (another check of its in progress): the request waits,
            // and the password is rotated meanwhile.
            let lane = security.lane(peer);
            let busy = lane.lock().await;
            let waiting = tokio::spawn(allowed(security.clone(), file.clone()));
            // The request holds the lane (ours, its own) once it has read the config in force
            // and waits for its turn: only then is the rotation "meanwhile".
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while Arc::strong_count(&lane) < 2 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the request never queued"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            std::fs::write(&path, users("new")).unwrap();
            file.check();
            file.check();
            drop(busy);
            assert_eq!(
                waiting.await.unwrap(),
                Some(false),
                "a request that waited through a rotation was let in with the old password"
            );
        });
    }
}
