//! The PEM data the TLS settings name: one reading of certificates, trust roots and private
//! keys, for the check of the OTLP certificates and key at load (`[otlp]`, `OTEL_*`) and for the
//! TLS server configuration built from the web config file's certificate, key and client CA,
//! so a file is judged by the same rules wherever sysscope reads it. Errors say what is wrong,
//! not where: the caller names the setting and the file.

use rustls::RootCertStore;
use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};

/// The certificates of PEM data: at least one, or why not.
pub fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("not a PEM certificate file: {e}"))?;
    if certs.is_empty() {
        return Err("no PEM certificate (-----BEGIN CERTIFICATE-----) found".into());
    }
    Ok(certs)
}

/// The certificates of PEM data as trust roots, each one usable as a CA.
pub fn roots(pem: &[u8]) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(pem)? {
        roots
            .add(cert)
            .map_err(|e| format!("not a usable CA: {e}"))?;
    }
    Ok(roots)
}

/// The private key of PEM data.
pub fn private_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| format!("no usable PEM private key: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificates_roots_and_keys_are_read_or_refused_with_the_reason() {
        let issued = rcgen::generate_simple_self_signed(vec!["a.test".into()]).unwrap();
        let (cert, key) = (issued.cert.pem(), issued.signing_key.serialize_pem());
        assert_eq!(certificates(cert.as_bytes()).unwrap().len(), 1);
        assert_eq!(roots(cert.as_bytes()).unwrap().len(), 1);
        assert!(private_key(key.as_bytes()).is_ok());
        let e = certificates(b"not pem").unwrap_err();
        assert!(e.contains("no PEM certificate"), "{e}");
        let e = certificates(key.as_bytes()).unwrap_err();
        assert!(e.contains("no PEM certificate"), "{e}");
        let e = private_key(cert.as_bytes()).unwrap_err();
        assert!(e.contains("private key"), "{e}");
    }
}
