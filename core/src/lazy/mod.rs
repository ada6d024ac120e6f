//! On-demand restore of CPU memory: gpucr's own lazy-pages server.
//!
//! CRIU restores the tree with `lazy_pages`: each task's private anonymous memory is
//! registered with a userfaultfd instead of being read, and the userfaultfd is handed to
//! whoever listens on `lazy-pages.socket` in CRIU's working directory ([`socket`]). This
//! server takes them, works out from the image which ranges each task still needs
//! ([`pages`], [`ranges`]) and fills them through the userfaultfd ([`uffd`]): faults
//! first, the rest in the background, every block checked against the manifest before
//! any byte of it is placed ([`server`]), the stream holding back while the tree
//! starts ([`hold`]). When serving fails, the tree is killed
//! ([`kill`]).

pub mod error;
pub mod guard;
pub mod hold;
pub mod kill;
pub mod pages;
pub mod ranges;
pub mod remote;
pub mod server;
pub mod socket;
pub mod uffd;

pub use error::LazyError;
pub use guard::LazyGuard;
pub use hold::StartupHold;
pub use remote::RemoteBlocks;
pub use server::{LazyServer, ServeOptions, Serving, Summary, TaskMemory};
pub use socket::SOCKET_NAME;
