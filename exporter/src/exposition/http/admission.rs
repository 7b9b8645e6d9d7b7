//! Which connections are served: at most [`MAX_CONNECTIONS`] at once, none silent for longer
//! than [`IDLE_TIMEOUT`], and at the cap a newcomer takes the place of an idle connection (or
//! one whose requests only wait for their password checks) of the peer holding the most.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::{Duration, Instant},
};

use tokio::sync::Notify;

/// Connections served at once; more are closed as soon as they are accepted.
pub const MAX_CONNECTIONS: usize = 512;
/// Time a connection may go without a request in progress: from the accept to the first
/// request's headers (protocol detection included), and between requests (HTTP/1 keep-alive
/// and HTTP/2 alike).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Requests of one connection: whether one is in progress, and when the last one ended.
#[derive(Debug)]
pub(super) struct Activity {
    in_flight: AtomicUsize,
    /// Of those, the requests waiting for their password check to start.
    queued: AtomicUsize,
    /// When the last request started or ended (or the connection was accepted).
    last: Mutex<Instant>,
}

impl Activity {
    pub(super) fn new() -> Self {
        Self {
            in_flight: AtomicUsize::new(0),
            queued: AtomicUsize::new(0),
            last: Mutex::new(Instant::now()),
        }
    }

    fn touch(&self) {
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }

    /// For how long no request has been in progress (`None` while one is), or, `waiting_idle`,
    /// none but requests still waiting for their peer's earlier password checks: closing such
    /// a connection costs no work in progress, and a client can send those faster than bcrypt
    /// answers them, so they must not fill the cap.
    fn idle_for(&self, waiting_idle: bool) -> Option<Duration> {
        // Requests in progress first: one that stops waiting between the two loads (its
        // `queued` drops, its `in_flight` stays) is then seen busy, never idle.
        let in_flight = self.in_flight.load(Ordering::SeqCst);
        let waiting = waiting_idle.then(|| self.queued.load(Ordering::SeqCst));
        let last = *self.last.lock().unwrap_or_else(PoisonError::into_inner);
        (in_flight <= waiting.unwrap_or(0)).then(|| last.elapsed())
    }
}

/// Marks a request as waiting for its password check (its turn in its peer's lane, then a
/// check slot) for as long as it lives.
pub(super) struct Queued<'a>(&'a Activity);

impl<'a> Queued<'a> {
    pub(super) fn start(activity: &'a Activity) -> Self {
        activity.queued.fetch_add(1, Ordering::SeqCst);
        Self(activity)
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Marks a request in progress on its connection for as long as it lives.
pub(super) struct InFlight(pub(super) Arc<Activity>);

impl InFlight {
    pub(super) fn start(activity: Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::SeqCst);
        activity.touch();
        Self(activity)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

struct Connection {
    peer: IpAddr,
    activity: Arc<Activity>,
    evict: Arc<Notify>,
}

/// The open connections, to pick one to close when the cap is reached.
#[derive(Default)]
pub(super) struct Connections {
    next_id: u64,
    open: HashMap<u64, Connection>,
}

impl Connections {
    /// Registers a new connection from `peer`. At the cap, a connection that is idle or only
    /// waits for password checks is evicted first: one of the peer (an IPv6 /64 counts as
    /// one, [`peer_group`]) with the most connections, the longest idle (or waiting) of those;
    /// `None` when every connection is busy. (The youngest go last: a connection in its TLS
    /// handshake, or whose first request just came, is as idle or waiting as any.)
    pub(super) fn admit(&mut self, peer: IpAddr) -> Option<(u64, Arc<Activity>, Arc<Notify>)> {
        if self.open.len() >= MAX_CONNECTIONS {
            let mut per_peer: HashMap<IpAddr, usize> = HashMap::new();
            for c in self.open.values() {
                *per_peer.entry(peer_group(c.peer)).or_default() += 1;
            }
            let victim = self
                .open
                .iter()
                .filter_map(|(id, c)| {
                    let idle = c.activity.idle_for(true)?;
                    Some((per_peer[&peer_group(c.peer)], idle, *id))
                })
                .max()
                .map(|(_, _, id)| id)?;
            if let Some(c) = self.open.remove(&victim) {
                tracing::debug!(peer = %c.peer, "connection cap reached; closing an idle or waiting connection");
                c.evict.notify_one();
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        let activity = Arc::new(Activity::new());
        let evict = Arc::new(Notify::new());
        self.open.insert(
            id,
            Connection {
                peer,
                activity: activity.clone(),
                evict: evict.clone(),
            },
        );
        Some((id, activity, evict))
    }

    /// Forgets a connection that closed.
    pub(super) fn close(&mut self, id: u64) {
        self.open.remove(&id);
    }
}

/// Resolves once the connection has had no request in progress for [`IDLE_TIMEOUT`].
pub(super) async fn idle_deadline(activity: &Activity) {
    loop {
        let wait = match activity.idle_for(false) {
            Some(idle) if idle >= IDLE_TIMEOUT => return,
            Some(idle) => IDLE_TIMEOUT - idle,
            None => IDLE_TIMEOUT,
        };
        tokio::time::sleep(wait.max(Duration::from_millis(100))).await;
    }
}

/// Whom a peer address counts as, for its password lane and its share of the connections: the
/// address itself for IPv4, its /64 for IPv6 (one host or one subnet typically holds a whole
/// /64, so its addresses are not many peers).
pub(super) fn peer_group(peer: IpAddr) -> IpAddr {
    match peer.to_canonical() {
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(std::net::Ipv6Addr::from(prefix))
        }
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_cap_requests_waiting_for_password_checks_make_room_and_work_in_progress_does_not() {
        let mut table = Connections::default();
        let (flooder, scraper): (IpAddr, IpAddr) =
            ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
        // Every connection has a request in progress: one being served, the rest waiting in
        // the flooder's password lane.
        let mut flood = Vec::new();
        for i in 0..MAX_CONNECTIONS {
            let (id, activity, evict) = table.admit(flooder).unwrap();
            activity.in_flight.fetch_add(1, Ordering::AcqRel);
            if i > 0 {
                activity.queued.fetch_add(1, Ordering::AcqRel);
            }
            flood.push((id, activity, evict));
        }
        // A newcomer gets in: one of the waiting requests' connections is closed for it.
        let (scraper_id, scraper_activity, _) = table.admit(scraper).expect("admitted");
        assert_eq!(table.open.len(), MAX_CONNECTIONS);
        let evicted: Vec<u64> = flood
            .iter()
            .filter(|(id, _, _)| !table.open.contains_key(id))
            .map(|(id, _, _)| *id)
            .collect();
        assert_eq!(evicted.len(), 1);
        assert_ne!(
            evicted[0], flood[0].0,
            "the request being served was closed"
        );
        // Once nothing waits, nothing busy is closed: the newcomer is refused.
        for (_, activity, _) in &flood {
            activity.queued.store(0, Ordering::Release);
        }
        scraper_activity.in_flight.fetch_add(1, Ordering::AcqRel);
        assert!(table.admit(scraper).is_none());
        assert!(table.open.contains_key(&scraper_id));
    }

    /// A connection from `peer` admitted to `table`, with `in_flight` requests of which
    /// `queued` wait for password checks, its last request started `ago` before now.
    fn admitted(
        table: &mut Connections,
        peer: &str,
        in_flight: usize,
        queued: usize,
        ago: Duration,
    ) -> u64 {
        let (id, activity, _) = table.admit(peer.parse().unwrap()).expect("admitted");
        activity.in_flight.store(in_flight, Ordering::SeqCst);
        activity.queued.store(queued, Ordering::SeqCst);
        *activity.last.lock().unwrap() = Instant::now() - ago;
        id
    }

    #[test]
    fn at_the_cap_young_connections_stay_and_an_ipv6_subnet_is_one_peer() {
        let mut table = Connections::default();
        // One IPv4 peer per connection, all busy but three: a waiter of 30 s, one just
        // admitted (in its TLS handshake: idle for no time), and an idle one of 20 s.
        let mut ids = Vec::new();
        for i in 0..MAX_CONNECTIONS - 2 {
            let peer = format!("198.51.{}.{}", i / 250, i % 250 + 1);
            let (in_flight, queued, ago) = match i {
                0 => (1, 1, Duration::from_secs(30)),
                1 => (0, 0, Duration::ZERO),
                2 => (0, 0, Duration::from_secs(20)),
                _ => (1, 0, Duration::ZERO),
            };
            ids.push(admitted(&mut table, &peer, in_flight, queued, ago));
        }
        // Two idle connections of one /64, from two addresses, idle for 1 s: the subnet holds
        // the most connections, so one of them goes first.
        let v6: Vec<u64> = ["2001:db8:1:2::1", "2001:db8:1:2:ffff::9"]
            .iter()
            .map(|peer| admitted(&mut table, peer, 0, 0, Duration::from_secs(1)))
            .collect();
        admitted(&mut table, "203.0.113.1", 1, 0, Duration::ZERO);
        assert_eq!(
            v6.iter().filter(|id| table.open.contains_key(id)).count(),
            1,
            "the /64's addresses were taken for two peers"
        );
        // Then the longest waiting or idle: the 30 s waiter, the 20 s idle one, the other
        // address of the /64; the young connection last.
        for (n, gone) in [ids[0], ids[2]].into_iter().enumerate() {
            admitted(
                &mut table,
                &format!("203.0.113.{}", n + 2),
                1,
                0,
                Duration::ZERO,
            );
            assert!(
                !table.open.contains_key(&gone),
                "step {n}: the oldest stayed"
            );
            assert!(
                table.open.contains_key(&ids[1]),
                "the young connection went"
            );
        }
        admitted(&mut table, "203.0.113.9", 1, 0, Duration::ZERO);
        assert!(v6.iter().all(|id| !table.open.contains_key(id)));
        assert!(
            table.open.contains_key(&ids[1]),
            "the young connection went"
        );

        assert_eq!(
            peer_group("::ffff:192.0.2.7".parse().unwrap()),
            "192.0.2.7".parse::<IpAddr>().unwrap()
        );
        assert_ne!(
            peer_group("2001:db8:1:2::1".parse().unwrap()),
            peer_group("2001:db8:1:3::1".parse().unwrap())
        );
    }
}
