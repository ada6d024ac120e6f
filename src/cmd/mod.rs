//! One module per subcommand: glue between the clap structs and the library.
//!
//! Each `run` returns the exit code on success; errors carry their own exit code
//! (see [`exit_code_for`]).

pub mod check_topology;
pub mod common;
pub mod completions;
pub mod cuda_guard;
pub mod dump;
pub mod engine_helper;
pub mod give_back;
pub mod inspect;
pub mod install_plugin;
pub mod restore;
pub mod restore_guard;
pub mod sim_guard;
pub mod terminal;

use crate::criu::CriuError;
use crate::dump::DumpError;
use crate::exit_code::{ExitCode, FAILURE};
use crate::image::{ImageDirError, ManifestError};
use crate::restore::RestoreError;
use crate::target::TargetError;

/// The exit code for an error that reached `main`: the first error in the chain that
/// knows its code decides; anything else is [`FAILURE`].
pub fn exit_code_for(err: &anyhow::Error) -> u8 {
    err.chain()
        .find_map(|cause| {
            code_of::<DumpError>(cause)
                .or_else(|| code_of::<RestoreError>(cause))
                .or_else(|| code_of::<CriuError>(cause))
                .or_else(|| code_of::<TargetError>(cause))
                .or_else(|| code_of::<ImageDirError>(cause))
                .or_else(|| code_of::<ManifestError>(cause))
                .or_else(|| code_of::<check_topology::CheckTopologyError>(cause))
                .or_else(|| code_of::<crate::archive::ArchiveError>(cause))
                .or_else(|| code_of::<install_plugin::InstallPluginError>(cause))
        })
        .unwrap_or(FAILURE)
}

/// The code of `cause` if it is an `E`.
fn code_of<E>(cause: &(dyn std::error::Error + 'static)) -> Option<u8>
where
    E: ExitCode + std::error::Error + 'static,
{
    cause.downcast_ref::<E>().map(E::exit_code)
}

#[cfg(test)]
mod tests {
    use anyhow::Context;

    use super::*;
    use crate::exit_code;

    #[test]
    fn the_first_error_that_knows_its_code_decides() {
        let code = |e: anyhow::Error| exit_code_for(&e);
        let target = || TargetError::NotFound { pid: 7 };
        assert_eq!(code(target().into()), exit_code::TARGET);
        assert_eq!(
            code(anyhow::Error::from(DumpError::Target(target())).context("dump")),
            exit_code::TARGET
        );
        let criu = CriuError::NotFound {
            searched: "PATH".into(),
        };
        assert_eq!(code(criu.into()), exit_code::CRIU_UNAVAILABLE);
        let dir = ImageDirError::NotADirectory { path: "/x".into() };
        assert_eq!(code(dir.into()), exit_code::IMAGE_DIR);
        let missing = ManifestError::Missing { path: "/x".into() };
        assert_eq!(code(missing.into()), exit_code::IMAGE_INCOMPLETE);
        let no_dir = RestoreError::NoDir { dir: "/x".into() };
        assert_eq!(code(no_dir.into()), exit_code::IMAGE_INCOMPLETE);
        let io: Result<(), _> = Err(std::io::Error::other("x"));
        assert_eq!(code(io.context("plain").unwrap_err()), exit_code::FAILURE);
    }
}
