//! `--web.config.file` enforced: TLS (rustls with the ring provider) and HTTP basic auth for
//! the HTTP endpoint. The file's format (exporter-toolkit's) and its validation are
//! [`crate::config::web`]'s; here it is made ready and followed, so a rotated certificate,
//! users, passwords, headers and TLS settings need no restart ([`WebConfigFile`]).
//!
//! By role: [`tls`] builds the TLS server configuration, [`basic_auth`] checks credentials, and
//! [`follow`] reads the file and the files it names as one snapshot, builds the [`WebConfig`]
//! the endpoint enforces, and follows them while the endpoint serves.

mod basic_auth;
mod follow;
mod tls;

pub(crate) use self::basic_auth::AuthPrecheck;
pub use self::{
    basic_auth::{parse_basic, BasicAuth},
    follow::{WebConfig, WebConfigFile},
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

    #[test]
    fn empty_and_null_files_change_nothing() {
        for text in ["", "\n", "---\n", "# only a comment\n", "{}"] {
            let c = WebConfig::parse(text, "x", Path::new(".")).unwrap();
            assert!(c.tls.is_none() && c.basic_auth.is_none() && c.headers.is_empty());
            assert!(c.http2);
        }
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = err("tls_server_config:\n  cert_fil: a.pem\n");
        assert!(e.contains("cert_fil"), "{e}");
        let e = err("basic_auth:\n  a: b\n");
        assert!(e.contains("basic_auth"), "{e}");
    }

    #[test]
    fn wrong_types_are_explained() {
        let e = err("basic_auth_users: [a, b]\n");
        assert!(e.contains("basic_auth_users"), "{e}");
        let e = err("http_server_config:\n  http2: maybe\n");
        assert!(e.contains("http2"), "{e}");
    }

    #[test]
    fn headers_are_checked() {
        let c = WebConfig::parse(
            "http_server_config:\n  http2: false\n  headers:\n    X-Frame-Options: deny\n    Strict-Transport-Security: max-age=31536000\n",
            "x",
            Path::new("."),
        )
        .unwrap();
        assert!(!c.http2);
        assert_eq!(c.headers.len(), 2);
        let e = err("http_server_config:\n  headers:\n    X-Powered-By: me\n");
        assert!(e.contains("http_server_config.headers.X-Powered-By"), "{e}");
        let e = err("http_server_config:\n  headers:\n    X-Content-Type-Options: sniff\n");
        assert!(e.contains("nosniff"), "{e}");
    }
}
