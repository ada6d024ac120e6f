//! Every error a command can end with, and its exit code: one enum, one exhaustive
//! match. A command's typed errors convert into it with `?`; a new error type a command
//! returns needs a variant here (and so a decision about its exit code), or it does not
//! compile. Only what has no code of its own (the command line's own I/O, such as
//! writing the result to standard output) is [`Failure::Other`], exit 1.

use crate::archive::ArchiveError;
use crate::criu::{CriuConfigError, CriuError};
use crate::dump::DumpError;
use crate::exit_code::{self, ExitCode};
use crate::gpu::GpuError;
use crate::helper::HelperError;
use crate::image::{ImageDirError, ManifestError};
use crate::migrate::{IdentityError, MigrateError, ReceiveError};
use crate::restore::RestoreError;
use crate::target::TargetError;

use super::check_topology::CheckTopologyError;
use super::install_plugin::InstallPluginError;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error(transparent)]
    Dump(#[from] DumpError),
    #[error(transparent)]
    Restore(#[from] RestoreError),
    #[error(transparent)]
    Criu(#[from] CriuError),
    #[error(transparent)]
    CriuConfig(#[from] CriuConfigError),
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    ImageDir(#[from] ImageDirError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error(transparent)]
    Helper(#[from] HelperError),
    #[error(transparent)]
    CheckTopology(#[from] CheckTopologyError),
    #[error(transparent)]
    InstallPlugin(#[from] InstallPluginError),
    #[error(transparent)]
    Migrate(#[from] MigrateError),
    #[error(transparent)]
    Receive(#[from] ReceiveError),
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// No code of its own: [`exit_code::FAILURE`].
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

impl ExitCode for Failure {
    fn exit_code(&self) -> u8 {
        match self {
            Failure::Dump(e) => e.exit_code(),
            Failure::Restore(e) => e.exit_code(),
            Failure::Criu(e) => e.exit_code(),
            Failure::CriuConfig(e) => e.exit_code(),
            Failure::Target(e) => e.exit_code(),
            Failure::ImageDir(e) => e.exit_code(),
            Failure::Manifest(e) => e.exit_code(),
            Failure::Archive(e) => e.exit_code(),
            Failure::Gpu(e) => e.exit_code(),
            Failure::Helper(e) => e.exit_code(),
            Failure::CheckTopology(e) => e.exit_code(),
            Failure::InstallPlugin(e) => e.exit_code(),
            Failure::Migrate(e) => e.exit_code(),
            Failure::Receive(e) => e.exit_code(),
            Failure::Identity(e) => e.exit_code(),
            Failure::Other(_) => exit_code::FAILURE,
        }
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Failure {
        Failure::Other(e.into())
    }
}

impl From<serde_json::Error> for Failure {
    fn from(e: serde_json::Error) -> Failure {
        Failure::Other(e.into())
    }
}

#[cfg(test)]
mod tests {
    use anyhow::Context;

    use super::*;

    #[test]
    fn each_error_keeps_its_own_code() {
        let target = || TargetError::NotFound { pid: 7 };
        assert_eq!(Failure::from(target()).exit_code(), exit_code::TARGET);
        assert_eq!(
            Failure::from(DumpError::Target(target())).exit_code(),
            exit_code::TARGET
        );
        let criu = CriuError::NotFound {
            searched: "PATH".into(),
        };
        assert_eq!(Failure::from(criu).exit_code(), exit_code::CRIU_UNAVAILABLE);
        let dir = ImageDirError::NotADirectory { path: "/x".into() };
        assert_eq!(Failure::from(dir).exit_code(), exit_code::IMAGE_DIR);
        let missing = ManifestError::Missing { path: "/x".into() };
        assert_eq!(
            Failure::from(missing).exit_code(),
            exit_code::IMAGE_INCOMPLETE
        );
        let no_dir = RestoreError::NoDir { dir: "/x".into() };
        assert_eq!(
            Failure::from(no_dir).exit_code(),
            exit_code::IMAGE_INCOMPLETE
        );
        let io: Result<(), _> = Err(std::io::Error::other("x"));
        assert_eq!(
            Failure::from(io.context("plain").unwrap_err()).exit_code(),
            exit_code::FAILURE
        );
    }
}
