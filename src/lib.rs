//! gpucr: checkpoint and restore GPU process trees through CRIU.
//!
//! The binary (`src/main.rs`) only parses the command line and maps errors to exit
//! codes; everything else lives in this library so that tests can drive it.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod archive;
pub mod cancel;
pub mod cli;
pub mod cmd;
pub mod criu;
pub mod docs;
pub mod dump;
pub mod engine;
pub mod exit_code;
pub mod gpu;
pub mod guard;
pub mod helper;
pub mod image;
pub mod inspect;
pub mod interrupt;
pub mod niceness;
pub mod progress;
pub mod restore;
pub mod restore_guard;
pub mod stderr;
pub mod target;
pub mod transfer;
pub mod units;
