//! One module per subcommand: glue between the clap structs and the library.
//!
//! Each `run` returns the exit code on success; errors are a [`Failure`], whose exit code is one
//! exhaustive match.

pub mod check_topology;
pub mod common;
pub mod completions;
pub mod cuda_guard;
pub mod dump;
pub mod engine_helper;
mod failure;
pub mod give_back;
pub mod inspect;
pub mod install_plugin;
pub mod lazy_guard;
pub mod migrate;
pub mod migrate_guard;
pub mod restore;
pub mod restore_guard;
pub mod sim_guard;
pub mod terminal;

pub use failure::Failure;
