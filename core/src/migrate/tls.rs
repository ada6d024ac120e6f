//! Mutual TLS between a migration's two sides (rustls, the ring provider).
//!
//! Each side presents its own certificate and accepts exactly one certificate from its
//! peer: the one it was given (`--peer-cert`), compared byte for byte, with the
//! handshake's signature checked against it by the provider's algorithms. There is no
//! certificate authority, no name check and no expiry: the pinned certificate is the
//! whole trust. A peer without the right key fails the handshake, before either side
//! reads a byte of the migration.

use std::net::TcpStream;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    CertificateError, ClientConfig, ClientConnection, DigitallySignedStruct, DistinguishedName,
    ServerConfig, ServerConnection, SignatureScheme, StreamOwned,
};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use super::identity::Identity;
use super::link::is_silence;

/// The name the source asks for; the receiver's certificate is pinned, so the name
/// is never checked.
const RECEIVER_NAME: &str = "gpucr-receiver";

/// Why the TLS session could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("the TLS configuration was refused: {0}")]
    Config(#[source] rustls::Error),
    #[error("TLS handshake with {peer} failed: {source}")]
    Handshake {
        peer: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "TLS handshake with {peer} failed: no answer within {} s (--link-timeout)",
        after.as_secs_f64()
    )]
    Silent {
        peer: String,
        after: std::time::Duration,
    },
}

/// The error of a handshake over `tcp` with `peer` that failed with `source`: a peer
/// that stayed silent past the socket's time limit is named as such (the socket says
/// only "Resource temporarily unavailable").
fn handshake_failed(tcp: &TcpStream, peer: &str, source: std::io::Error) -> TlsError {
    match tcp.read_timeout() {
        Ok(Some(after)) if is_silence(source.kind()) => TlsError::Silent {
            peer: peer.to_owned(),
            after,
        },
        _ => TlsError::Handshake {
            peer: peer.to_owned(),
            source,
        },
    }
}

/// The source's end: a TLS client.
pub type SourceStream = StreamOwned<ClientConnection, TcpStream>;
/// The receiver's end: a TLS server.
pub type ReceiverStream = StreamOwned<ServerConnection, TcpStream>;

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Accepts exactly the pinned certificate, alone (no intermediates).
#[derive(Debug)]
struct Pinned {
    peer: CertificateDer<'static>,
    provider: Arc<CryptoProvider>,
}

impl Pinned {
    fn new(peer: &CertificateDer<'static>, provider: Arc<CryptoProvider>) -> Pinned {
        Pinned {
            peer: peer.clone(),
            provider,
        }
    }

    fn check(
        &self,
        presented: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
    ) -> Result<(), rustls::Error> {
        if presented.as_ref() == self.peer.as_ref() && intermediates.is_empty() {
            Ok(())
        } else {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn tls12(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.check(cert, &[])?;
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn tls13(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.check(cert, &[])?;
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.check(end_entity, intermediates)
            .map(|()| ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls12(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.schemes()
    }
}

impl ClientCertVerifier for Pinned {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.check(end_entity, intermediates)
            .map(|()| ClientCertVerified::assertion())
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls12(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.schemes()
    }
}

fn client_config(identity: &Identity) -> Result<ClientConfig, TlsError> {
    let provider = provider();
    let verifier = Arc::new(Pinned::new(&identity.peer_cert, provider.clone()));
    ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(vec![identity.cert.clone()], identity.key.clone_key())
        .map_err(TlsError::Config)
}

fn server_config(identity: &Identity) -> Result<ServerConfig, TlsError> {
    let provider = provider();
    let verifier = Arc::new(Pinned::new(&identity.peer_cert, provider.clone()));
    ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![identity.cert.clone()], identity.key.clone_key())
        .map_err(TlsError::Config)
}

/// The source's handshake over `tcp` (whose read and write timeouts bound it).
pub fn connect(mut tcp: TcpStream, identity: &Identity) -> Result<SourceStream, TlsError> {
    let peer = peer_name(&tcp);
    let name = ServerName::try_from(RECEIVER_NAME).map_err(|e| TlsError::Handshake {
        peer: peer.clone(),
        source: std::io::Error::other(e.to_string()),
    })?;
    let mut conn = ClientConnection::new(Arc::new(client_config(identity)?), name)
        .map_err(TlsError::Config)?;
    while conn.is_handshaking() {
        if let Err(e) = conn.complete_io(&mut tcp) {
            return Err(handshake_failed(&tcp, &peer, e));
        }
    }
    Ok(StreamOwned::new(conn, tcp))
}

/// The receiver's handshake over `tcp` (whose read and write timeouts bound it).
pub fn accept(mut tcp: TcpStream, identity: &Identity) -> Result<ReceiverStream, TlsError> {
    let peer = peer_name(&tcp);
    let mut conn =
        ServerConnection::new(Arc::new(server_config(identity)?)).map_err(TlsError::Config)?;
    while conn.is_handshaking() {
        if let Err(e) = conn.complete_io(&mut tcp) {
            return Err(handshake_failed(&tcp, &peer, e));
        }
    }
    Ok(StreamOwned::new(conn, tcp))
}

/// Give every read and write on `tcp` the link's time limit (the TLS handshake's
/// too), and send each frame as soon as it is written.
pub fn limit(tcp: &TcpStream, timeout: std::time::Duration) -> std::io::Result<()> {
    tcp.set_read_timeout(Some(timeout))?;
    tcp.set_write_timeout(Some(timeout))?;
    tcp.set_nodelay(true)
}

/// The peer's address, for messages.
pub fn peer_name(tcp: &TcpStream) -> String {
    tcp.peer_addr()
        .map_or_else(|_| "an unknown peer".into(), |a| a.to_string())
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::time::Duration;

    use super::*;
    use crate::migrate::identity::keygen;
    use crate::migrate::identity::testing::identity;

    /// The receiver's handshake result and what it read, for a source presenting
    /// `source` (a key/cert pair name) and pinning `pinned` as the receiver's.
    fn exchange(
        dir: &std::path::Path,
        source: &str,
        receiver_pins: &str,
    ) -> (Result<Vec<u8>, String>, Result<(), String>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let receiver = identity(dir, "receiver", receiver_pins);
        let server = std::thread::spawn(move || {
            let (tcp, _) = listener.accept().unwrap();
            tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut stream = accept(tcp, &receiver).map_err(|e| e.to_string())?;
            let mut got = vec![0u8; 5];
            stream.read_exact(&mut got).map_err(|e| e.to_string())?;
            Ok(got)
        });
        let tcp = TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let source = identity(dir, source, "receiver");
        let sent = connect(tcp, &source)
            .map_err(|e| e.to_string())
            .and_then(|mut s| {
                s.write_all(b"hello").map_err(|e| e.to_string())?;
                s.flush().map_err(|e| e.to_string())
            });
        (server.join().unwrap(), sent)
    }

    #[test]
    fn the_pinned_certificate_gets_in_and_another_does_not() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["source", "receiver", "intruder"] {
            keygen(dir.path(), name).unwrap();
        }
        let (read, sent) = exchange(dir.path(), "source", "source");
        assert_eq!(read.unwrap(), b"hello");
        sent.unwrap();
        let (read, _) = exchange(dir.path(), "intruder", "source");
        let err = read.unwrap_err();
        assert!(err.contains("handshake"), "{err}");
    }

    /// A client that presents `cert` and signs its handshake with `key` (no check that
    /// they belong together: an attacker's own client, not gpucr's).
    #[derive(Debug)]
    struct Presents(Arc<rustls::sign::CertifiedKey>);

    impl rustls::client::ResolvesClientCert for Presents {
        fn resolve(
            &self,
            _: &[&[u8]],
            _: &[SignatureScheme],
        ) -> Option<Arc<rustls::sign::CertifiedKey>> {
            Some(self.0.clone())
        }

        fn has_certs(&self) -> bool {
            true
        }
    }

    #[test]
    fn a_certificate_presented_with_another_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["source", "receiver", "intruder"] {
            keygen(dir.path(), name).unwrap();
        }
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let receiver = identity(dir.path(), "receiver", "source");
        let receiver_cert = receiver.cert.clone();
        let server = std::thread::spawn(move || {
            let (tcp, _) = listener.accept().unwrap();
            tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            accept(tcp, &receiver)
                .map(|_| ())
                .map_err(|e| e.to_string())
        });
        // The source's pinned certificate, the handshake signed with the intruder's key.
        let intruder = identity(dir.path(), "intruder", "receiver");
        let source = identity(dir.path(), "source", "receiver");
        let signing = provider()
            .key_provider
            .load_private_key(intruder.key.clone_key())
            .unwrap();
        let presented = rustls::sign::CertifiedKey::new(vec![source.cert.clone()], signing);
        let config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Pinned::new(&receiver_cert, provider())))
            .with_client_cert_resolver(Arc::new(Presents(Arc::new(presented))));
        let mut tcp = TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let name = ServerName::try_from(RECEIVER_NAME).unwrap();
        let mut conn = ClientConnection::new(Arc::new(config), name).unwrap();
        while conn.is_handshaking() {
            if conn.complete_io(&mut tcp).is_err() {
                break;
            }
        }
        let refused = server.join().unwrap().unwrap_err();
        assert!(refused.contains("handshake"), "{refused}");
    }

    #[test]
    fn a_peer_silent_through_the_handshake_is_named_so() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["source", "receiver"] {
            keygen(dir.path(), name).unwrap();
        }
        // A listener that accepts and never answers.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let tcp = TcpStream::connect(addr).unwrap();
        let _held = listener.accept().unwrap();
        limit(&tcp, Duration::from_millis(200)).unwrap();
        let err = connect(tcp, &identity(dir.path(), "source", "receiver")).unwrap_err();
        assert!(matches!(err, TlsError::Silent { .. }), "{err:?}");
        assert!(err.to_string().contains("no answer within 0.2 s"), "{err}");
    }
}
