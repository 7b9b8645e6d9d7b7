//! The HTTP endpoint (hyper on tokio): the routes of [`routes`] at the listen address.
//!
//! With `--web.config.file` ([`super::web_config`]) connections are TLS, every request needs
//! basic auth when users are configured (401 otherwise), and the configured headers are added;
//! each request is checked against the file as it is now, and answered 500 while a change left
//! it invalid. No client can hold a connection without using it, nor lock others out by
//! filling the connection cap or the password checks.
//!
//! The listen address takes the exporters' forms: `HOST:PORT`, and `:PORT` or `[::]:PORT` for
//! every address of both families on one dual-stack socket.
//!
//! By role: this module binds the listen address; [`routes`] holds the routes, [`admission`]
//! the connection cap and deadlines, [`auth_gate`] basic auth (who runs bcrypt, and when) and
//! the configured headers, [`serve`] the accept loop, TLS and shutdown.

mod admission;
mod auth_gate;
mod routes;
mod serve;

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

use tokio::net::{TcpListener, TcpSocket};

pub use self::{
    admission::{IDLE_TIMEOUT, MAX_CONNECTIONS},
    routes::{cached, handle, AppState, Handler, ReloadHandler},
    serve::serve_with,
};

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error(
        "cannot listen on {address} (is another sysscope or exporter already using this port? \
         choose another with --web.listen-address)"
    )]
    Bind {
        address: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "invalid --web.listen-address `{0}`: expected host:port or :port, e.g. 127.0.0.1:9812, \
         [::]:9812 or :9812 (every address, IPv4 and IPv6)"
    )]
    Address(String),
}

/// What `--web.listen-address` asks for, in the forms the Prometheus exporters take.
#[derive(Debug, PartialEq, Eq)]
enum ListenAddress {
    /// `:PORT` or `[::]:PORT`: every address of both families, one IPv6 socket that also takes
    /// IPv4 (IPV6_V6ONLY off, whatever `net.ipv6.bindv6only` says), as node_exporter listens.
    AllFamilies(u16),
    /// `HOST:PORT` (an address or a name): the first address it resolves to, its family only.
    Host,
}

fn parse(address: &str) -> Result<ListenAddress, HttpError> {
    let invalid = || HttpError::Address(address.to_string());
    if let Some(port) = address.strip_prefix(':') {
        return port
            .parse::<u16>()
            .map(ListenAddress::AllFamilies)
            .map_err(|_| invalid());
    }
    match address.parse::<SocketAddr>() {
        Ok(SocketAddr::V6(a)) if a.ip().is_unspecified() => {
            Ok(ListenAddress::AllFamilies(a.port()))
        }
        _ => Ok(ListenAddress::Host),
    }
}

/// Resolves `--web.listen-address` and binds it.
pub async fn bind(address: &str) -> Result<TcpListener, HttpError> {
    let invalid = || HttpError::Address(address.to_string());
    let bind_error = |source| HttpError::Bind {
        address: address.to_string(),
        source,
    };
    if let ListenAddress::AllFamilies(port) = parse(address)? {
        return bind_all_families(port).map_err(bind_error);
    }
    let mut resolved = tokio::net::lookup_host(address)
        .await
        .map_err(|_| invalid())?;
    let first = resolved.next().ok_or_else(invalid)?;
    TcpListener::bind(first).await.map_err(bind_error)
}

/// Listens on every IPv6 and IPv4 address of `port`: one dual-stack IPv6 socket, or an IPv4
/// one where the kernel has no IPv6 at all (booted with `ipv6.disable=1`).
fn bind_all_families(port: u16) -> std::io::Result<TcpListener> {
    let socket = match TcpSocket::new_v6() {
        Ok(socket) => socket,
        Err(e) if e.raw_os_error() == Some(libc::EAFNOSUPPORT) => {
            tracing::info!(port, "no IPv6 in this kernel: listening on IPv4 only");
            let socket = TcpSocket::new_v4()?;
            socket.set_reuseaddr(true)?;
            socket.bind((Ipv4Addr::UNSPECIFIED, port).into())?;
            return socket.listen(1024);
        }
        Err(e) => return Err(e),
    };
    set_ipv6_only(&socket, false)?;
    // As TcpListener::bind does: a restarted exporter rebinds over its old connections'
    // TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind((Ipv6Addr::UNSPECIFIED, port).into())?;
    socket.listen(1024)
}

/// IPV6_V6ONLY, which tokio's socket does not expose.
fn set_ipv6_only(socket: &TcpSocket, only: bool) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let value = libc::c_int::from(only);
    // SAFETY: a valid socket descriptor owned by `socket`, and an int option of int size.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IPV6,
            libc::IPV6_V6ONLY,
            std::ptr::from_ref(&value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exporter_forms_of_listen_addresses() {
        assert_eq!(parse(":9812").unwrap(), ListenAddress::AllFamilies(9812));
        assert_eq!(
            parse("[::]:9812").unwrap(),
            ListenAddress::AllFamilies(9812)
        );
        assert_eq!(parse("0.0.0.0:9812").unwrap(), ListenAddress::Host);
        assert_eq!(parse("[::1]:9812").unwrap(), ListenAddress::Host);
        assert_eq!(parse("localhost:9812").unwrap(), ListenAddress::Host);
        for bad in [":", ":x", ":70000", ":-1"] {
            assert!(
                matches!(parse(bad), Err(HttpError::Address(_))),
                "{bad} accepted"
            );
        }
    }

    /// `:PORT` takes connections over both loopbacks on one socket (where this machine has
    /// IPv6; the test says which half it skipped).
    #[tokio::test]
    async fn a_port_alone_listens_on_both_families() {
        let listener = bind(":0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        if !addr.is_ipv6() {
            // A kernel without IPv6 at all: `:PORT` is IPv4 only there, by design.
            crate::util::test_support::require(
                "a_port_alone_listens_on_both_families",
                "IPv6 in the kernel",
                false,
            );
            return;
        }
        let port = addr.port();
        let mut peers = vec![SocketAddr::from((Ipv4Addr::LOCALHOST, port))];
        // ::1 on lo, as /proc/net/if_inet6 lists it (absent where IPv6 is off on lo).
        let has_ipv6_loopback = std::fs::read_to_string("/proc/net/if_inet6")
            .is_ok_and(|t| t.lines().any(|l| l.starts_with(&format!("{:032x}", 1))));
        // CI machines have it: there a missing ::1 fails the test.
        if crate::util::test_support::require(
            "a_port_alone_listens_on_both_families (its IPv6 half)",
            "::1 on the loopback interface",
            has_ipv6_loopback,
        ) {
            peers.push(SocketAddr::from((Ipv6Addr::LOCALHOST, port)));
        }
        for peer in peers {
            let (connected, accepted) =
                tokio::join!(tokio::net::TcpStream::connect(peer), listener.accept());
            connected.unwrap_or_else(|e| panic!("connect to {peer}: {e}"));
            accepted.unwrap();
        }
        assert!(matches!(
            bind(":x").await,
            Err(HttpError::Address(a)) if a == ":x"
        ));
    }
}
