//! A side's identity: its private key and certificate (PEM files made by `gpucr
//! keygen`), and the other side's certificate, pinned.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rustls::sign::CertifiedKey;
use rustls::InconsistentKeys;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Why an identity could not be made or read.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("cannot read {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a PEM {what} ({detail})")]
    NotPem {
        what: &'static str,
        path: PathBuf,
        detail: String,
    },
    #[error("{path}: holds {count} certificates; exactly one is expected")]
    CertificateCount { path: PathBuf, count: usize },
    #[error("{path}: the private key may be read by others (mode {mode:o}); make it 0600")]
    KeyReadable { path: PathBuf, mode: u32 },
    #[error(
        "{key} does not belong to {cert}: the certificate holds another key's public half \
         (give the certificate `gpucr keygen` wrote beside this key)"
    )]
    KeyMismatch { key: PathBuf, cert: PathBuf },
    #[error("{path}: cannot sign with this private key: {detail}")]
    KeyUnusable { path: PathBuf, detail: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot generate a key pair for {name}: {detail}")]
    Generate { name: String, detail: String },
}

impl crate::exit_code::ExitCode for IdentityError {
    fn exit_code(&self) -> u8 {
        crate::exit_code::USAGE
    }
}

/// One side's key and certificate, and the certificate its peer must present.
#[derive(Debug)]
pub struct Identity {
    pub key: PrivateKeyDer<'static>,
    pub cert: CertificateDer<'static>,
    pub peer_cert: CertificateDer<'static>,
}

/// Where a side's identity is read from (`--key`, `--cert`, `--peer-cert`).
#[derive(Debug, Clone)]
pub struct IdentityFiles {
    pub key: PathBuf,
    pub cert: PathBuf,
    pub peer_cert: PathBuf,
}

impl IdentityFiles {
    /// Read the three files. The key must not be readable by group or others.
    pub fn load(&self) -> Result<Identity, IdentityError> {
        let mode = std::fs::metadata(&self.key)
            .map_err(|source| IdentityError::Read {
                what: "private key",
                path: self.key.clone(),
                source,
            })?
            .permissions();
        let mode = std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777;
        if mode & 0o077 != 0 {
            return Err(IdentityError::KeyReadable {
                path: self.key.clone(),
                mode,
            });
        }
        let key_pem = read(&self.key, "private key")?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| IdentityError::NotPem {
            what: "private key",
            path: self.key.clone(),
            detail: e.to_string(),
        })?;
        let cert = one_certificate(&self.cert)?;
        self.check_pair(&key, &cert)?;
        Ok(Identity {
            key,
            cert,
            peer_cert: one_certificate(&self.peer_cert)?,
        })
    }

    /// The key must be one TLS can sign with, and `cert` must hold its public half:
    /// otherwise every handshake would fail, and only once a peer came.
    fn check_pair(
        &self,
        key: &PrivateKeyDer<'static>,
        cert: &CertificateDer<'static>,
    ) -> Result<(), IdentityError> {
        let provider = rustls::crypto::ring::default_provider();
        let signing = provider
            .key_provider
            .load_private_key(key.clone_key())
            .map_err(|e| IdentityError::KeyUnusable {
                path: self.key.clone(),
                detail: e.to_string(),
            })?;
        match CertifiedKey::new(vec![cert.clone()], signing).keys_match() {
            Ok(()) | Err(rustls::Error::InconsistentKeys(InconsistentKeys::Unknown)) => Ok(()),
            Err(rustls::Error::InconsistentKeys(InconsistentKeys::KeyMismatch)) => {
                Err(IdentityError::KeyMismatch {
                    key: self.key.clone(),
                    cert: self.cert.clone(),
                })
            }
            Err(e) => Err(IdentityError::NotPem {
                what: "certificate",
                path: self.cert.clone(),
                detail: e.to_string(),
            }),
        }
    }
}

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, IdentityError> {
    std::fs::read(path).map_err(|source| IdentityError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

/// The one certificate in the PEM file at `path`.
fn one_certificate(path: &Path) -> Result<CertificateDer<'static>, IdentityError> {
    let pem = read(path, "certificate")?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| IdentityError::NotPem {
            what: "certificate",
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
    match <[_; 1]>::try_from(certs) {
        Ok([cert]) => Ok(cert),
        Err(certs) => Err(IdentityError::CertificateCount {
            path: path.to_path_buf(),
            count: certs.len(),
        }),
    }
}

/// The files `gpucr keygen NAME` wrote.
#[derive(Debug, Clone)]
pub struct KeyFiles {
    pub key: PathBuf,
    pub cert: PathBuf,
}

/// Make a key pair (ECDSA P-256) and a self-signed certificate for `name`, written to
/// `NAME.key` (mode 0600, created: an existing file is never overwritten) and
/// `NAME.crt` in `dir`.
pub fn keygen(dir: &Path, name: &str) -> Result<KeyFiles, IdentityError> {
    let generate = |detail: rcgen::Error| IdentityError::Generate {
        name: name.to_owned(),
        detail: detail.to_string(),
    };
    let certified = rcgen::generate_simple_self_signed(vec![name.to_owned()]).map_err(generate)?;
    let files = KeyFiles {
        key: dir.join(format!("{name}.key")),
        cert: dir.join(format!("{name}.crt")),
    };
    write_new(&files.key, 0o600, &certified.key_pair.serialize_pem())?;
    if let Err(e) = write_new(&files.cert, 0o644, &certified.cert.pem()) {
        let _ = std::fs::remove_file(&files.key);
        return Err(e);
    }
    Ok(files)
}

/// Create `path` (it must not exist) with `mode` and write `text` into it.
fn write_new(path: &Path, mode: u32, text: &str) -> Result<(), IdentityError> {
    let write = |source| IdentityError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(write)?;
    file.write_all(text.as_bytes()).map_err(write)?;
    file.sync_all().map_err(write)
}

/// Identities for the migration's unit tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// `me`'s identity, pinning `peer`'s certificate, from the `NAME.key` and `NAME.crt`
    /// files `keygen` wrote into `dir`.
    pub(crate) fn identity(dir: &Path, me: &str, peer: &str) -> Identity {
        IdentityFiles {
            key: dir.join(format!("{me}.key")),
            cert: dir.join(format!("{me}.crt")),
            peer_cert: dir.join(format!("{peer}.crt")),
        }
        .load()
        .unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keygen_writes_a_private_key_and_a_certificate_that_load() {
        let dir = tempfile::tempdir().unwrap();
        let a = keygen(dir.path(), "source").unwrap();
        let b = keygen(dir.path(), "receiver").unwrap();
        let mode = std::fs::metadata(&a.key).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        let identity = IdentityFiles {
            key: a.key.clone(),
            cert: a.cert.clone(),
            peer_cert: b.cert.clone(),
        }
        .load()
        .unwrap();
        assert_ne!(identity.cert, identity.peer_cert);
        // Never overwritten.
        assert!(matches!(
            keygen(dir.path(), "source"),
            Err(IdentityError::Write { .. })
        ));
    }

    #[test]
    fn a_key_others_may_read_and_a_file_without_a_certificate_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let a = keygen(dir.path(), "a").unwrap();
        let files = IdentityFiles {
            key: a.key.clone(),
            cert: a.cert.clone(),
            peer_cert: a.key.clone(),
        };
        let err = files.load().unwrap_err();
        assert!(
            matches!(err, IdentityError::CertificateCount { count: 0, .. }),
            "{err}"
        );
        std::fs::set_permissions(&a.key, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        let err = files.load().unwrap_err();
        assert!(err.to_string().contains("0600"), "{err}");
    }

    #[test]
    fn a_certificate_of_another_key_is_refused_naming_both_files() {
        let dir = tempfile::tempdir().unwrap();
        let a = keygen(dir.path(), "a").unwrap();
        let b = keygen(dir.path(), "b").unwrap();
        let err = IdentityFiles {
            key: a.key.clone(),
            cert: b.cert.clone(),
            peer_cert: b.cert.clone(),
        }
        .load()
        .unwrap_err();
        assert!(matches!(err, IdentityError::KeyMismatch { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("a.key") && text.contains("b.crt"), "{text}");
    }
}
