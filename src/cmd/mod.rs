//! One module per subcommand: glue between the clap structs and the library.
//!
//! Each `run` returns the exit code on success; errors carry their own exit code
//! (see [`crate::exit_code::for_error`]).

pub mod check_topology;
pub mod common;
pub mod completions;
pub mod dump;
pub mod inspect;
pub mod restore;
