//! The HTTP endpoint (hyper on tokio): the routes of [`routes`] at the listen address.
//!
//! With `--web.config.file` ([`super::web_config`]) connections are TLS, every request needs
//! basic auth when users are configured (401 otherwise), and the configured headers are added;
//! each request is checked against the file as it is now, and answered 500 while a change left
//! it invalid. No client can hold a connection without using it, nor lock others out by
//! filling the connection cap or the password checks.
//!
//! By role: this module binds the listen address; [`routes`] holds the routes, [`admission`]
//! the connection cap and deadlines, [`auth_gate`] basic auth (who runs bcrypt, and when) and
//! the configured headers, [`serve`] the accept loop, TLS and shutdown.

mod admission;
mod auth_gate;
mod routes;
mod serve;

use tokio::net::TcpListener;

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
        "invalid --web.listen-address `{0}`: expected host:port, e.g. 127.0.0.1:9812 or [::]:9812"
    )]
    Address(String),
}

/// Resolves `--web.listen-address` and binds it.
pub async fn bind(address: &str) -> Result<TcpListener, HttpError> {
    let invalid = || HttpError::Address(address.to_string());
    let mut resolved = tokio::net::lookup_host(address)
        .await
        .map_err(|_| invalid())?;
    let first = resolved.next().ok_or_else(invalid)?;
    TcpListener::bind(first)
        .await
        .map_err(|source| HttpError::Bind {
            address: address.to_string(),
            source,
        })
}
