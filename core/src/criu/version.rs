//! CRIU versions and which ones gpucr accepts.

use std::fmt;
use std::path::Path;

use super::rpc;
use super::CriuError;

/// A CRIU version as reported by the RPC VERSION request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CriuVersion {
    pub major: u32,
    pub minor: u32,
    pub sublevel: u32,
}

/// The oldest CRIU gpucr drives (plugin ABI 0x200 and the RPC fields it sets).
pub const MIN_VERSION: CriuVersion = CriuVersion {
    major: 4,
    minor: 0,
    sublevel: 0,
};
/// The first CRIU that dumps TCP/UDP sockets on Linux >= 6.16 (CRIU issue #2705).
pub const SOCKETS_OK_VERSION: CriuVersion = CriuVersion {
    major: 4,
    minor: 2,
    sublevel: 0,
};
/// The kernel release from which older CRIU fails on every inet socket.
const SOCKET_BREAKING_KERNEL: (u32, u32) = (6, 16);

impl CriuVersion {
    pub fn from_rpc(v: &rpc::CriuVersion) -> CriuVersion {
        let clamp = |n: i32| u32::try_from(n).unwrap_or(0);
        CriuVersion {
            major: clamp(v.major_number),
            minor: clamp(v.minor_number),
            sublevel: clamp(v.sublevel.unwrap_or(0)),
        }
    }
}

impl fmt::Display for CriuVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)?;
        if self.sublevel != 0 {
            write!(f, ".{}", self.sublevel)?;
        }
        Ok(())
    }
}

/// Refuse CRIU older than [`MIN_VERSION`]; return a warning when CRIU older than
/// [`SOCKETS_OK_VERSION`] runs on a kernel where it cannot dump sockets.
pub fn check_supported(
    path: &Path,
    version: CriuVersion,
    kernel_release: &str,
) -> Result<Option<String>, CriuError> {
    if version < MIN_VERSION {
        return Err(CriuError::TooOld {
            path: path.to_path_buf(),
            found: version.to_string(),
            needed: MIN_VERSION.to_string(),
        });
    }
    if version < SOCKETS_OK_VERSION
        && parse_kernel(kernel_release).is_some_and(|k| k >= SOCKET_BREAKING_KERNEL)
    {
        return Ok(Some(format!(
            "CRIU {version} cannot dump TCP/UDP sockets on Linux {kernel_release} (needs CRIU >= \
             {SOCKETS_OK_VERSION} on Linux >= 6.16, CRIU issue #2705); scripts/install-criu.sh \
             installs 4.2.1"
        )));
    }
    Ok(None)
}

/// "6.18.0-1-amd64" -> (6, 18).
fn parse_kernel(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(major: u32, minor: u32, sublevel: u32) -> CriuVersion {
        CriuVersion {
            major,
            minor,
            sublevel,
        }
    }

    #[test]
    fn displays_like_criu() {
        assert_eq!(v(4, 2, 1).to_string(), "4.2.1");
        assert_eq!(v(3, 17, 0).to_string(), "3.17");
    }

    #[test]
    fn too_old_is_refused_with_advice() {
        let err = check_supported(Path::new("/x/criu"), v(3, 17, 1), "6.1.0").unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("/x/criu is CRIU 3.17.1; gpucr needs CRIU >= 4.0"),
            "{text}"
        );
        assert!(text.contains("scripts/install-criu.sh"), "{text}");
    }

    #[test]
    fn old_criu_on_new_kernel_warns() {
        let warning = check_supported(Path::new("c"), v(4, 1, 1), "6.18.0-1-amd64").unwrap();
        assert!(warning.unwrap().contains("cannot dump TCP/UDP sockets"));
        assert_eq!(
            check_supported(Path::new("c"), v(4, 1, 1), "6.15.2").unwrap(),
            None
        );
        assert_eq!(
            check_supported(Path::new("c"), v(4, 2, 1), "6.18.0").unwrap(),
            None
        );
    }

    #[test]
    fn kernel_release_parses() {
        assert_eq!(parse_kernel("6.18.0-1-amd64"), Some((6, 18)));
        assert_eq!(parse_kernel("5.10"), Some((5, 10)));
        assert_eq!(parse_kernel("garbage"), None);
    }
}
