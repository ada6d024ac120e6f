//! What tests of gpucr (this crate's and the command line's) build images from: a
//! sample manifest and hand-made tar archives. Compiled for this crate's tests and with
//! the `testing` feature, never into a release.

use std::path::Path;

use crate::image::manifest::{DumpOptions, FileRecord, Host, Manifest, Target, Timings};
use crate::image::manifest::{FORMAT_NAME, FORMAT_VERSION};

/// A manifest of one file, `core-1.img` (3 bytes), for tests.
pub fn sample_manifest() -> Manifest {
    Manifest {
        format: FORMAT_NAME.into(),
        format_version: FORMAT_VERSION,
        gpucr_version: "0.1.0".into(),
        criu_version: "4.2.1".into(),
        created: "2026-11-22T12:00:00Z".into(),
        host: Host {
            hostname: "h".into(),
            page_size: 4096,
            kernel: "6.18.0".into(),
            arch: "x86_64".into(),
        },
        backend: "none".into(),
        target: Target {
            pid: 42,
            comm: "w".into(),
            cmdline: vec!["w".into()],
        },
        options: DumpOptions {
            network_lock: "nftables".into(),
            ..Default::default()
        },
        checksum_algorithm: crate::image::checksum::ALGORITHM.into(),
        files: vec![FileRecord {
            path: "core-1.img".into(),
            size: 3,
            checksum: "00".into(),
            blocks: vec![],
        }],
        timings: Timings::default(),
        gpu: None,
        topology: None,
    }
}

/// A plain tar at `path` of `(name, content)` files, the names written as given
/// (`..` included, which tar's own path setters refuse).
pub fn raw_tar(path: &Path, members: &[(&str, &[u8])]) {
    let mut tar = tar::Builder::new(std::fs::File::create(path).unwrap());
    for (name, content) in members {
        let mut h = tar::Header::new_old();
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_size(content.len() as u64);
        h.set_mode(0o600);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_cksum();
        tar.append(&h, *content).unwrap();
    }
    tar.into_inner().unwrap();
}
