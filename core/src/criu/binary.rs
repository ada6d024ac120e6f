//! Finding the criu binary.

use std::env;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::CriuError;

/// Where criu is looked for after PATH (it is often installed for root only).
const FALLBACK_DIRS: &[&str] = &["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin"];

/// The criu binary to run: `explicit` (from --criu or GPUCR_CRIU) when given, otherwise
/// the first executable `criu` on PATH or in the usual sbin directories.
pub fn locate(explicit: Option<&Path>) -> Result<PathBuf, CriuError> {
    if let Some(path) = explicit {
        return if is_executable(path) {
            Ok(path.to_path_buf())
        } else {
            Err(CriuError::NotFound {
                searched: path.display().to_string(),
            })
        };
    }
    let path_var = env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<PathBuf> = env::split_paths(&path_var)
        .chain(FALLBACK_DIRS.iter().map(PathBuf::from))
        .collect();
    dirs.iter()
        .map(|d| d.join("criu"))
        .find(|p| is_executable(p))
        .ok_or_else(|| CriuError::NotFound {
            searched: format!("criu on PATH and in {}", FALLBACK_DIRS.join(", ")),
        })
}

fn is_executable(path: &Path) -> bool {
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_missing_path_names_it() {
        let err = locate(Some(Path::new("/nonexistent/criu"))).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/criu"), "{err}");
        assert!(err.to_string().contains("scripts/install-criu.sh"), "{err}");
    }

    #[test]
    fn explicit_non_executable_is_not_found() {
        let f = tempfile::NamedTempFile::new().unwrap();
        assert!(locate(Some(f.path())).is_err());
    }
}
