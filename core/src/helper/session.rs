//! The private resources of one gpucr operation: the plugin directory CRIU loads from
//! (`CRIU_LIBS_DIR`, holding gpucr's plugin only, so no other plugin is co-loaded;
//! created 0700, removed when the operation ends) and the connector, the socketpair
//! through which every plugin instance reaches the helper.
//!
//! CRIU inherits one end of the connector (never a path: a restored task in a mount
//! namespace of its own could not reach a socket file). At dump the plugin finds it at
//! the number in `GPUCR_HELPER_FD`; at restore gpucr also hands it over as CRIU's
//! `inherit_fd` "gpucr-helper", which CRIU keeps in its fdstore, reachable from criu and
//! from every restored task (CRIU closes the fds a restored task inherited).

use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use gpucr_abi::{ENV_BACKEND, ENV_HELPER_FD, HELPER_INHERIT_KEY, PLUGIN_BUILD_FILE, PLUGIN_FILE};
use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};

use super::HelperError;

/// Overrides where the plugin is looked for.
pub const ENV_PLUGIN: &str = "GPUCR_PLUGIN";
/// Test hook: the value given to the plugin as `GPUCR_HELPER_FD` instead of the real
/// connector (to prove that a plugin which cannot reach the helper fails the dump
/// cleanly).
pub const ENV_TEST_HELPER_FD: &str = "GPUCR_TEST_HELPER_FD";

/// The private directory and connector of one operation.
#[derive(Debug)]
pub struct Session {
    /// None in engine mode (the engine's CRIU loads the installed plugin).
    dir: Option<tempfile::TempDir>,
    plugin: PathBuf,
    /// The backend whose plugin half serves CRIU.
    backend: String,
    /// The helper's end of the connector, until the helper takes it.
    helper_end: Option<OwnedFd>,
    /// CRIU's end, until CRIU has started with it.
    criu_end: Option<OwnedFd>,
    /// The number of CRIU's end, in gpucr's table and so in CRIU's.
    criu_fd: RawFd,
}

impl Session {
    /// Create the directory, link the plugin into its `plugin/` subdirectory and make
    /// the connector, for an operation of `backend`.
    pub fn create(backend: &str) -> Result<Session, HelperError> {
        let plugin = locate_plugin()?;
        let dir = tempfile::Builder::new()
            .prefix("gpucr-")
            .tempdir()
            .map_err(|source| HelperError::Io {
                path: std::env::temp_dir(),
                source,
            })?;
        let plugin_dir = dir.path().join("plugin");
        std::fs::create_dir(&plugin_dir).map_err(|source| HelperError::Io {
            path: plugin_dir.clone(),
            source,
        })?;
        let link = plugin_dir.join(PLUGIN_FILE);
        std::os::unix::fs::symlink(&plugin, &link).map_err(|source| HelperError::Io {
            path: link.clone(),
            source,
        })?;
        let (helper_end, criu_end) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| HelperError::Socket {
            path: "the helper connector (socketpair)".into(),
            source: e,
        })?;
        Ok(Session {
            dir: Some(dir),
            plugin,
            backend: backend.to_owned(),
            helper_end: Some(helper_end),
            criu_fd: criu_end.as_raw_fd(),
            criu_end: Some(criu_end),
        })
    }

    /// Engine mode: the helper's end of the connector the plugin made itself (CRIU was
    /// started by a container engine, and its plugin started this helper).
    pub fn engine(connector: OwnedFd, backend: &str) -> Session {
        Session {
            dir: None,
            plugin: PathBuf::new(),
            backend: backend.to_owned(),
            criu_fd: -1,
            helper_end: Some(connector),
            criu_end: None,
        }
    }

    /// The plugin that CRIU will load.
    pub fn plugin(&self) -> &Path {
        &self.plugin
    }

    /// The environment of the `criu swrk` child.
    pub fn criu_env(&self) -> Vec<(OsString, OsString)> {
        let Some(dir) = &self.dir else {
            return Vec::new();
        };
        vec![
            (
                "CRIU_LIBS_DIR".into(),
                dir.path().join("plugin").into_os_string(),
            ),
            (ENV_BACKEND.into(), self.backend.clone().into()),
            (
                ENV_HELPER_FD.into(),
                std::env::var_os(ENV_TEST_HELPER_FD)
                    .unwrap_or_else(|| self.criu_fd.to_string().into()),
            ),
        ]
    }

    /// The descriptors the `criu swrk` child inherits.
    pub fn criu_inherit(&self) -> Vec<BorrowedFd<'_>> {
        self.criu_end.iter().map(AsFd::as_fd).collect()
    }

    /// The connector as a restore's `inherit_fd` (key, number in CRIU's table).
    pub fn criu_inherit_fd(&self) -> (String, i32) {
        (HELPER_INHERIT_KEY.to_owned(), self.criu_fd)
    }

    /// CRIU has started: close gpucr's copy of CRIU's end (so the helper sees the
    /// connector close once CRIU and every restored task are done with it) and hand
    /// the helper its end.
    pub fn take_helper_end(&mut self) -> Result<OwnedFd, HelperError> {
        self.criu_end = None;
        self.helper_end
            .take()
            .ok_or_else(|| HelperError::Failed("the helper connector was already taken".into()))
    }
}

/// The plugin: `GPUCR_PLUGIN`, else next to the gpucr binary (a cargo build), else in
/// `<prefix>/lib/gpucr/` of an installed gpucr.
pub fn locate_plugin() -> Result<PathBuf, HelperError> {
    if let Some(path) = std::env::var_os(ENV_PLUGIN).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(HelperError::NoPlugin {
                searched: vec![path],
            })
        };
    }
    let exe = std::env::current_exe().map_err(|source| HelperError::Io {
        path: "/proc/self/exe".into(),
        source,
    })?;
    let bin_dir = exe.parent().unwrap_or(Path::new("/"));
    let mut candidates = vec![bin_dir.join(PLUGIN_BUILD_FILE)];
    // Integration tests run from target/<profile>/deps/.
    if bin_dir.ends_with("deps") {
        candidates.push(bin_dir.parent().unwrap_or(bin_dir).join(PLUGIN_BUILD_FILE));
    }
    if let Some(prefix) = bin_dir.parent() {
        candidates.push(prefix.join("lib/gpucr").join(PLUGIN_FILE));
    }
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or(HelperError::NoPlugin {
            searched: candidates,
        })
}
