//! `--web.config.file`: TLS and HTTP basic auth for the HTTP endpoint, in the Prometheus
//! exporter-toolkit format (the YAML file node_exporter and the other exporters read), so one
//! file can secure every exporter on a node.
//!
//! Supported keys: `tls_server_config` (`cert_file`/`key_file` or inline `cert`/`key`,
//! `client_auth_type`, `client_ca_file` or inline `client_ca`, `min_version`, `max_version`,
//! `prefer_server_cipher_suites` (ignored, as Go does)), `basic_auth_users` (bcrypt hashes) and
//! `http_server_config` (`http2`, `headers`). Refused with an error naming the key:
//! `cipher_suites`, `curve_preferences`, `client_allowed_sans` (rustls picks its own safe
//! suites and groups), TLS 1.0/1.1, and the client-auth types that would accept a client
//! certificate without verifying it. Relative paths are relative to the file's directory.
//!
//! TLS is rustls with the ring provider.
//!
//! The file itself and the files it names (certificate, key, client CA) are followed as they
//! change (compared once a second in the background; applied once two checks in a row read the
//! change alike: [`WebConfigFile`]), so a rotated certificate, users, passwords, headers and TLS
//! settings need no restart, as exporter-toolkit re-reads its file on every request. A change
//! that makes the file invalid fails closed, except a certificate and key that do not load as a
//! pair (a key written before its certificate): the previous pair stays in use, logged, until
//! the new one loads.
//!
//! By role: [`schema`] reads the file (its keys, headers and users), [`tls`] builds the TLS
//! server configuration of `tls_server_config`, [`basic_auth`] checks credentials, and
//! [`follow`] follows the file and the files it names while the endpoint serves.

mod basic_auth;
mod follow;
mod schema;
mod tls;

pub(crate) use self::basic_auth::AuthPrecheck;
pub use self::{
    basic_auth::{parse_basic, BasicAuth},
    follow::WebConfigFile,
    schema::{WebConfig, WebConfigError},
};

#[cfg(test)]
mod tests {
    use std::path::Path;

    use base64::Engine;
    use rustls_pki_types::{pem::PemObject, CertificateDer};

    use super::*;

    pub(super) fn err(text: &str) -> String {
        WebConfig::parse(text, "web.yml", Path::new("/nonexistent"))
            .unwrap_err()
            .to_string()
    }

    /// A web config of one user, `ops`, with `password` (bcrypt cost 4, the fastest).
    pub(super) fn ops_with(password: &str) -> String {
        let hash = bcrypt::hash(password, 4).unwrap();
        format!("basic_auth_users:\n  ops: '{hash}'\n")
    }

    /// An `Authorization` header value for `user` and `password`.
    pub(super) fn basic_header(user: &str, password: &str) -> String {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        )
    }

    /// Two checks: enough for a change to be applied.
    pub(super) fn settle(file: &WebConfigFile) {
        file.check();
        file.check();
    }

    /// Writes a self-signed certificate for localhost and its key as `<name>.crt` and
    /// `<name>.key` in `dir`.
    pub(super) fn write_cert(dir: &Path, name: &str) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(dir.join(format!("{name}.crt")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }

    /// The certificate `config` serves, and the one in the file `name`.crt.
    pub(super) fn serves(config: &WebConfig, dir: &Path, name: &str) -> bool {
        let served = config.served_cert.as_ref().expect("TLS configured");
        let in_file = CertificateDer::pem_file_iter(dir.join(format!("{name}.crt")))
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        served.end_entity_cert().unwrap() == &in_file
    }

    /// The example in docs/operations.md is valid as written.
    #[test]
    fn the_documented_example_is_valid() {
        let doc = include_str!("../../../../docs/operations.md");
        let start = doc.find("```yaml\n").expect("yaml example") + "```yaml\n".len();
        let yaml = &doc[start..start + doc[start..].find("```").unwrap()];
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca.self_signed(&key).unwrap();
        let server = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        std::fs::write(dir.path().join("sysscope.crt"), server.cert.pem()).unwrap();
        std::fs::write(
            dir.path().join("sysscope.key"),
            server.signing_key.serialize_pem(),
        )
        .unwrap();
        std::fs::write(dir.path().join("prometheus-ca.crt"), ca.pem()).unwrap();
        let c = WebConfig::parse(yaml, "docs/operations.md", dir.path()).unwrap();
        assert!(c.tls.is_some() && c.basic_auth.is_some() && c.http2);
        assert_eq!(c.headers.len(), 2);
    }
}
