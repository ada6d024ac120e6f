//! What an image holds, in the shape `crit x` gives it (ps, fds, mems) plus what crit
//! does not show: sockets with addresses and queues, argv and environment read from the
//! dumped memory, mounts and CRIU's statistics.

pub mod args;
pub mod fds;
pub mod mems;
pub mod mounts;
pub mod ps;
pub mod sockets;

pub use args::{read_cmdline, read_environ, MAX_ARGS_BYTES};
pub use fds::{explore_fds, FileDesc, ProcessFiles};
pub use mems::{explore_mems, ProcessMemory, Vma, VmaKind};
pub use mounts::{explore_mounts, Mount};
pub use ps::{Process, ProcessTree, TaskState, Thread};
pub use sockets::{Socket, SocketFamily};
