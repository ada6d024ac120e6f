//! The private directory of one gpucr operation: the helper's socket and the plugin
//! directory CRIU loads from (`CRIU_LIBS_DIR`, holding gpucr's plugin only, so no other
//! plugin is co-loaded). Created 0700, removed when the operation ends.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use gpucr_abi::{ENV_HELPER_SOCK, PLUGIN_BUILD_FILE, PLUGIN_FILE};

use super::HelperError;

/// Overrides where the plugin is looked for.
pub const ENV_PLUGIN: &str = "GPUCR_PLUGIN";
/// Test hook: the socket path given to the plugin instead of the helper's own (to prove
/// that a plugin which cannot reach the helper fails the dump cleanly).
pub const ENV_TEST_PLUGIN_SOCK: &str = "GPUCR_TEST_PLUGIN_SOCK";

/// The private directory of one operation.
#[derive(Debug)]
pub struct Session {
    dir: tempfile::TempDir,
    plugin: PathBuf,
}

impl Session {
    /// Create the directory and link the plugin into its `plugin/` subdirectory.
    pub fn create() -> Result<Session, HelperError> {
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
        Ok(Session { dir, plugin })
    }

    /// The helper's socket path.
    pub fn socket_path(&self) -> PathBuf {
        self.dir.path().join("helper.sock")
    }

    /// The plugin that CRIU will load.
    pub fn plugin(&self) -> &Path {
        &self.plugin
    }

    /// The environment of the `criu swrk` child.
    pub fn criu_env(&self) -> Vec<(OsString, OsString)> {
        vec![
            (
                "CRIU_LIBS_DIR".into(),
                self.dir.path().join("plugin").into_os_string(),
            ),
            (
                ENV_HELPER_SOCK.into(),
                std::env::var_os(ENV_TEST_PLUGIN_SOCK)
                    .unwrap_or_else(|| self.socket_path().into_os_string()),
            ),
        ]
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
