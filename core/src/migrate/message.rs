//! The messages of the migration protocol, as they travel in frames (`link`).
//!
//! ```text
//! source                                   receiver
//!   Hello ------------------------------->   (versions)
//!         <-------------------------------   Hello
//!   Offer (backend, GPU topology) ------->   same check as restore
//!         <-------------------------------   Accept | Mismatch (source: exit 9)
//!   (dump; Working while it runs, and
//!    Part, Chunk ... as CRIU writes pages) ->  appended to the pages files
//!   Part, Chunk..., Whole (each pages file
//!    streamed: the rest of it) ---------->   each checked at its size
//!   File, Chunk..., FileEnd (each other
//!    file) ------------------------------>   written into a fresh 0700 directory
//!   Done -------------------------------->   restored, verified as any restore
//!         <-------------------------------   Restored (tree left stopped) | Failed
//!   Commit ------------------------------>   the restored tree let run
//!         <-------------------------------   Resumed
//!   (the source's stopped tree killed)
//! ```
//!
//! Post-copy (the Offer's `post_copy`) sends each large pages file as Later (its name
//! and size) instead of its bytes, and the destination asks for its blocks:
//!
//! ```text
//!   File..., Later..., Done ------------->   the blocks CRIU reads itself fetched
//!         <-------------------------------   Fetch (a block) ...
//!   Chunk..., FileEnd (each) ------------>   written into the sparse pages file
//!         <-------------------------------   Restored (restored --lazy, stopped)
//!   Commit ------------------------------>   the tree let run
//!         <-------------------------------   Resumed, then Fetch ... as pages are needed
//!         <-------------------------------   AllIn (every page in)
//!   (the source's stopped tree killed)
//!   Done -------------------------------->
//! ```
//!
//! The source answers each of the destination's messages in the order they came.
//! Either side may send Failed instead of what comes next; Working keeps a link alive
//! while its sender works, and is skipped by the reader.

use serde::{Deserialize, Serialize};

/// The protocol's version: both sides must speak the same.
pub const PROTOCOL_VERSION: u32 = 3;

/// A control message, sent as JSON in a frame of its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "message", rename_all = "snake_case", deny_unknown_fields)]
pub enum Control {
    Hello {
        protocol: u32,
        gpucr: String,
    },
    /// What the job needs: its GPU backend and the source's GPU topology.
    Offer {
        pid: i32,
        backend: Option<String>,
        topology: Option<gpucr_topology::Topology>,
        /// Post-copy: the destination resumes the job before its memory is there.
        #[serde(default)]
        post_copy: bool,
    },
    Accept,
    /// The destination's GPUs cannot hold the job: the topology report.
    Mismatch {
        report: String,
    },
    /// A file of the image follows, in chunks, then [`Control::FileEnd`].
    File {
        path: String,
        size: u64,
    },
    FileEnd,
    /// Stop-and-copy, while the job is dumped: the next chunk is the bytes of `path` (a
    /// pages file or a GPU data file, each written from start to end) from `offset` on
    /// (the file made at its first part; each part follows the last), until
    /// [`Control::Whole`].
    Part {
        path: String,
        offset: u64,
    },
    /// The file `path`, sent in parts, is whole at `size` bytes.
    Whole {
        path: String,
        size: u64,
    },
    /// Post-copy: a pages file of `size` bytes whose blocks come when asked for.
    Later {
        path: String,
        size: u64,
    },
    /// Post-copy: send block `block` of the pages file `path` (chunks, then FileEnd).
    Fetch {
        path: String,
        block: u64,
    },
    /// Post-copy: every page is in on the destination; the source may let its copy go.
    AllIn,
    /// Every file was sent.
    Done,
    /// The sender is still working (dumping, restoring).
    Working,
    /// The destination restored the tree, left stopped: `pid` there.
    Restored {
        pid: i32,
    },
    /// The source gives its copy up: the destination may let the tree run.
    Commit,
    /// The tree runs on the destination, restored from `dir`.
    Resumed {
        pid: i32,
        dir: String,
    },
    /// The sender gave up: why, and the exit code that says it.
    Failed {
        code: u8,
        reason: String,
    },
}

impl Control {
    /// The message's name, for errors.
    pub fn name(&self) -> &'static str {
        match self {
            Control::Hello { .. } => "hello",
            Control::Offer { .. } => "offer",
            Control::Accept => "accept",
            Control::Mismatch { .. } => "mismatch",
            Control::File { .. } => "file",
            Control::FileEnd => "file_end",
            Control::Part { .. } => "part",
            Control::Whole { .. } => "whole",
            Control::Later { .. } => "later",
            Control::Fetch { .. } => "fetch",
            Control::AllIn => "all_in",
            Control::Done => "done",
            Control::Working => "working",
            Control::Restored { .. } => "restored",
            Control::Commit => "commit",
            Control::Resumed { .. } => "resumed",
            Control::Failed { .. } => "failed",
        }
    }
}
