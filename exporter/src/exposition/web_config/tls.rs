//! The TLS server configuration (rustls with the ring provider) of a validated
//! `tls_server_config`, from the PEM bytes of its certificate, key and client CA.

use std::sync::Arc;

use rustls::{
    server::WebPkiClientVerifier,
    sign::{CertifiedKey, SingleCertAndKey},
    ServerConfig,
};

use crate::config::{
    pem,
    web::{Pem, TlsServer},
};

/// A TLS server configuration and the certificate and key it serves.
pub(super) type ServedTls = (Arc<ServerConfig>, Arc<CertifiedKey>);

/// The server configuration of `tls`, whose PEM data `read` gives; an error is (the key under
/// `tls_server_config`, the problem). A certificate and key files that do not load as a pair
/// (caught mid-rotation, or not written yet) leave `serving`, the pair in use, served, logged;
/// without one they are an error.
pub(super) fn server_config(
    tls: &TlsServer,
    read: &dyn Fn(&Pem) -> Result<Vec<u8>, String>,
    http2: bool,
    serving: Option<&Arc<CertifiedKey>>,
) -> Result<ServedTls, (&'static str, String)> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&tls.versions)
        .map_err(|e| ("min_version", e.to_string()))?;
    let builder = match &tls.client_ca {
        None => builder.with_no_client_auth(),
        Some((ca, required)) => {
            let bad = |problem| ("client_ca_file", problem);
            let described = |problem: String| format!("{}: {problem}", ca.describe());
            let roots = pem::roots(&read(ca).map_err(bad)?).map_err(|p| bad(described(p)))?;
            let mut v =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
            if !required {
                v = v.allow_unauthenticated();
            }
            let verifier = v.build().map_err(|e| bad(described(e.to_string())))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let pair = || {
        let described = |pem: &Pem, problem: String| format!("{}: {problem}", pem.describe());
        let chain = pem::certificates(&read(&tls.cert)?).map_err(|p| described(&tls.cert, p))?;
        let key = pem::private_key(&read(&tls.key)?).map_err(|p| described(&tls.key, p))?;
        CertifiedKey::from_der(chain, key, &provider).map_err(|e| {
            let (cert, key) = (tls.cert.describe(), tls.key.describe());
            format!("certificate {cert} and key {key} do not form a usable pair: {e}")
        })
    };
    let files = matches!((&tls.cert, &tls.key), (Pem::File(_), Pem::File(_)));
    let served = match (pair(), serving) {
        (Ok(pair), _) => Arc::new(pair),
        // Files can be caught mid-rotation; inline PEM is part of the text, which is invalid.
        (Err(problem), Some(serving)) if files => {
            tracing::warn!(
                error = %problem,
                "TLS certificate or key changed but they do not load as a pair; the previous \
                 pair stays in use until they do"
            );
            serving.clone()
        }
        (Err(problem), _) => {
            let key = if matches!(tls.cert, Pem::File(_)) {
                "cert_file"
            } else {
                "cert"
            };
            return Err((key, problem));
        }
    };
    // The one pair this config was built with: a rotated pair is a change of the files, so it
    // arrives as a new config (one mechanism, one set of rules).
    let resolver = SingleCertAndKey::from(served.clone());
    let mut config = builder.with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = alpn(http2);
    Ok((Arc::new(config), served))
}

/// The protocols a TLS handshake offers: they must be what the listener serves.
pub(super) fn alpn(http2: bool) -> Vec<Vec<u8>> {
    if http2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::exposition::web_config::{tests::err, WebConfig};

    #[test]
    fn missing_halves_of_a_pair_are_named() {
        let e = err("tls_server_config:\n  cert_file: a.pem\n");
        assert!(e.contains("tls_server_config.key_file"), "{e}");
        let e = err("tls_server_config:\n  key_file: a.key\n");
        assert!(e.contains("tls_server_config.cert_file"), "{e}");
        let e = err(
            "tls_server_config:\n  cert_file: /nonexistent/a.pem\n  key_file: /nonexistent/a.key\n",
        );
        assert!(
            e.contains("tls_server_config.cert_file") && e.contains("/nonexistent/a.pem"),
            "{e}"
        );
    }

    #[test]
    fn tls_section_without_certificate_is_plain_http() {
        let c = WebConfig::parse("tls_server_config: {}\n", "x", Path::new(".")).unwrap();
        assert!(c.tls.is_none());
        let e = err("tls_server_config:\n  client_auth_type: RequireAndVerifyClientCert\n");
        assert!(e.contains("no server certificate"), "{e}");
    }

    #[test]
    fn unsupported_and_unknown_values_are_named() {
        let pair = "tls_server_config:\n  cert_file: a.pem\n  key_file: a.key\n";
        let e = err(&format!("{pair}  min_version: TLS11\n"));
        assert!(e.contains("min_version") && e.contains("TLS11"), "{e}");
        let e = err(&format!("{pair}  min_version: tls1.2\n"));
        assert!(e.contains("min_version") && e.contains("tls1.2"), "{e}");
        let e = err(&format!(
            "{pair}  cipher_suites: [TLS_AES_128_GCM_SHA256]\n"
        ));
        assert!(e.contains("cipher_suites"), "{e}");
        let e = err(&format!("{pair}  client_allowed_sans: [a]\n"));
        assert!(e.contains("client_allowed_sans"), "{e}");
    }
}
