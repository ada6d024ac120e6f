//! gpucr-core: checkpoint and restore GPU process trees through CRIU, as a library with
//! no command line and no terminal.
//!
//! Everything gpucr does lives here: the dump and restore sequences, the CRIU client,
//! the helper and the plugin protocol, the GPU backends, the transfer engine, the image
//! and its verification, engine mode. Progress goes through a
//! [`progress::Reporter`]; errors are thiserror enums that know their exit code
//! ([`exit_code::ExitCode`]). The `gpucr` crate beside it holds the clap definitions,
//! the glue from flags to these options, the terminal reporter, the generated docs and
//! the binary.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod archive;
pub mod cancel;
pub mod criu;
pub mod dump;
pub mod engine;
pub mod exit_code;
pub mod gpu;
pub mod guard;
pub mod helper;
pub mod image;
pub mod inspect;
pub mod interrupt;
pub mod lazy;
pub mod migrate;
pub mod niceness;
pub mod progress;
pub mod restore;
pub mod restore_guard;
pub mod stderr;
pub mod target;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod transfer;
pub mod units;
pub mod wait;
