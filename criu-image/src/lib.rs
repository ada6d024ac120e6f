//! Reader for CRIU image directories, for gpucr.
//!
//! * [`framing`]: the file format: head magic, image magic, length-prefixed protobuf
//!   entries, with allocation bounded by the file size.
//! * [`proto`]: the messages (generated from `proto/criu/*.proto`).
//! * [`pagemap`] and [`pages`]: which pages were dumped and lazy reads of their bytes.
//! * [`ImageDir`]: typed access to the images of one dump directory.
//! * [`explore`]: what `crit x` shows (process tree, fds, memory) plus sockets,
//!   argv/environment read from the dumped memory, mounts and CRIU's statistics.
//! * [`check`]: structural verification of every image file.
//! * [`store`]: files read from disk or held in memory (an archive read as a stream).
//!
//! Every error is an [`ImageError`] naming the file and the byte offset. No input makes
//! the reader panic or allocate more than the file it reads holds.

#![deny(unsafe_code)]
#![deny(missing_debug_implementations)]

pub mod check;
mod dir;
pub mod encode;
mod error;
pub mod explore;
pub mod framing;
pub mod magic;
pub mod pagemap;
pub mod pages;
pub mod proto;
pub mod store;

pub use dir::{FileTable, ImageDir};
pub use error::{ErrorKind, ImageError, Result};
