//! Pages files whose blocks are still elsewhere: a post-copy migration's destination
//! restores before the source has sent the job's memory, and brings each block into the
//! local pages file when it is first needed (`crate::migrate::postcopy`). The server
//! asks for a block before it reads it; what it reads is then checked against the
//! manifest as any other block is.

/// Where blocks of pages files not yet in the image directory come from.
pub trait RemoteBlocks: Send + Sync + std::fmt::Debug {
    /// Make block `block` (of `crate::image::checksum::BLOCK_SIZE` bytes) of the pages
    /// file `file` (its name in the image directory) present in the local file, asking
    /// for it ahead of the others when `urgent` (a task waits on it), and return once it
    /// is there. A file that was never remote is there already. An error says why the
    /// block will not come (the link is lost): the task that needs it must not wait.
    fn fetch(&self, file: &str, block: u64, urgent: bool) -> Result<(), String>;

    /// True while the link the blocks come over is better left to other traffic (a
    /// post-copy destination whose tree waits, stopped, for the source's word): the
    /// background stream then starts no block, unless a step waits for a fill
    /// (`TaskMemory::fill_task`). Faults are served as ever.
    fn holds_background(&self) -> bool {
        false
    }
}
