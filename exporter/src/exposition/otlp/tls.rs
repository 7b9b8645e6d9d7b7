//! TLS and the HTTP client of the OTLP exporters.
//!
//! One TLS stack for everything: rustls with the ring provider (as for `--web.config.file`).
//! gRPC (tonic) gets a `ClientTlsConfig`; HTTP (reqwest, for both the span exporter and the
//! metrics push) gets a rustls `ClientConfig` built here. Trust is the configured CA file when
//! one is set (`OTEL_EXPORTER_OTLP_CERTIFICATE`: it replaces the system roots, so a private
//! collector cannot be impersonated by any public CA), the system's roots otherwise; a client
//! certificate and key, when set, are presented for mutual TLS.

use std::sync::Arc;

use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};

use crate::config::otlp::{SignalSettings, TlsSettings};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {problem}")]
    Pem { path: String, problem: String },
    #[error("no trusted CA: the system has no root certificates ({0}); set OTEL_EXPORTER_OTLP_CERTIFICATE or otlp.certificate")]
    NoRoots(String),
    #[error("TLS client configuration")]
    Rustls(#[from] rustls::Error),
    #[error("HTTP client: {0}")]
    Client(String),
}

fn certificates(path: &str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.into(),
            problem: e.to_string(),
        })
}

/// The rustls client configuration of an HTTPS endpoint.
pub(crate) fn rustls_config(tls: &TlsSettings) -> Result<rustls::ClientConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    match &tls.ca {
        Some(ca) => {
            for cert in certificates(&ca.path, &ca.pem)? {
                roots.add(cert).map_err(|e| TlsError::Pem {
                    path: ca.path.clone(),
                    problem: e.to_string(),
                })?;
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(native.certs);
            if added == 0 {
                let why = native
                    .errors
                    .first()
                    .map(|e| e.to_string())
                    .unwrap_or_else(|| "none found".into());
                return Err(TlsError::NoRoots(why));
            }
        }
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    Ok(match &tls.client {
        Some((cert, key)) => {
            let chain = certificates(&cert.path, &cert.pem)?;
            let key = PrivateKeyDer::from_pem_slice(&key.pem).map_err(|e| TlsError::Pem {
                path: key.path.clone(),
                problem: e.to_string(),
            })?;
            builder.with_client_auth_cert(chain, key)?
        }
        None => builder.with_no_client_auth(),
    })
}

/// The tonic TLS configuration of an HTTPS gRPC endpoint.
pub(crate) fn tonic_config(tls: &TlsSettings) -> tonic::transport::ClientTlsConfig {
    let config = tonic::transport::ClientTlsConfig::new();
    let mut config = match &tls.ca {
        Some(ca) => config.ca_certificate(tonic::transport::Certificate::from_pem(&ca.pem)),
        None => config.with_native_roots(),
    };
    if let Some((cert, key)) = &tls.client {
        config = config.identity(tonic::transport::Identity::from_pem(&cert.pem, &key.pem));
    }
    config
}

/// The blocking HTTP client of one signal: TLS as configured, the request timeout. Must be
/// built, used and dropped outside the tokio runtime.
pub(crate) fn http_client(
    settings: &SignalSettings,
) -> Result<reqwest::blocking::Client, TlsError> {
    let mut builder = reqwest::blocking::Client::builder().timeout(settings.timeout);
    if let Some(tls) = &settings.tls {
        builder = builder.use_preconfigured_tls(rustls_config(tls)?);
    }
    builder.build().map_err(|e| TlsError::Client(e.to_string()))
}

/// The span exporter's HTTP client: opentelemetry-otlp's `HttpClient` over the same
/// blocking reqwest client (and TLS) as the metrics push.
#[derive(Debug)]
pub(crate) struct BlockingHttpClient(pub reqwest::blocking::Client);

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for BlockingHttpClient {
    async fn send_bytes(
        &self,
        request: opentelemetry_http::Request<opentelemetry_http::Bytes>,
    ) -> Result<
        opentelemetry_http::Response<opentelemetry_http::Bytes>,
        opentelemetry_http::HttpError,
    > {
        use std::io::Read;
        // OTLP responses are small; a collector that answers more is cut off here.
        const MAX_RESPONSE: u64 = 4 * 1024 * 1024;
        let request: reqwest::blocking::Request = request.try_into()?;
        let mut response = self.0.execute(request)?;
        let status = response.status();
        let headers = std::mem::take(response.headers_mut());
        let mut body = Vec::new();
        response.take(MAX_RESPONSE).read_to_end(&mut body)?;
        let mut out = opentelemetry_http::Response::builder()
            .status(status)
            .body(opentelemetry_http::Bytes::from(body))?;
        *out.headers_mut() = headers;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::otlp::PemFile;

    fn pem(path: &str, text: String) -> PemFile {
        PemFile {
            path: path.into(),
            pem: text.into_bytes(),
        }
    }

    #[test]
    fn builds_with_a_ca_and_a_client_identity() {
        let ca = rcgen::generate_simple_self_signed(vec!["collector.test".into()]).unwrap();
        let client = rcgen::generate_simple_self_signed(vec!["client.test".into()]).unwrap();
        let tls = TlsSettings {
            ca: Some(pem("ca.pem", ca.cert.pem())),
            client: Some((
                pem("client.pem", client.cert.pem()),
                pem("client.key", client.signing_key.serialize_pem()),
            )),
        };
        let config = rustls_config(&tls).unwrap();
        assert!(config.client_auth_cert_resolver.has_certs());
        // A key that does not match the certificate is refused now, not at the first request.
        let other = rcgen::generate_simple_self_signed(vec!["x".into()]).unwrap();
        let mismatched = TlsSettings {
            client: Some((
                pem("client.pem", client.cert.pem()),
                pem("other.key", other.signing_key.serialize_pem()),
            )),
            ..tls
        };
        assert!(rustls_config(&mismatched).is_err());
    }
}
