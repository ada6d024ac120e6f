//! gpucr: checkpoint and restore GPU process trees through CRIU — the command line.
//!
//! This crate holds the clap definitions ([`cli`]), the glue from flags to the
//! library's options and the output ([`cmd`]), the man pages and completions generated
//! from the clap definitions ([`docs`]) and the binary (`src/main.rs`). Everything else
//! is the `gpucr-core` library, whose modules are re-exported here under their own
//! names.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod cli;
pub mod cmd;
pub mod docs;

pub use gpucr_core::{
    archive, cancel, criu, dump, engine, errln, exit_code, gpu, guard, helper, image, inspect,
    interrupt, lazy, migrate, niceness, progress, restore, restore_guard, stderr, target, transfer,
    units,
};
