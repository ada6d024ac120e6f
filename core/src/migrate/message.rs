//! The messages of the migration protocol, as they travel in frames (`link`).
//!
//! ```text
//! source                                   receiver
//!   Hello ------------------------------->   (versions)
//!         <-------------------------------   Hello
//!   Offer (backend, GPU topology, lanes) ->  same check as restore
//!         <-------------------------------   Accept (lanes, ticket) | Mismatch (exit 9)
//!   each lane: its own TLS connection,
//!    Hello, Join (ticket, number) ------->   (a wrong ticket: the connection dropped)
//!   (dump; Working on this link while it
//!    runs; on the lanes, Part, Chunk ...
//!    as CRIU writes the pages) ---------->   written where each part says
//!   lanes: the rest of the parts, Done -->   lanes: Done once written
//!   Whole (each file sent in parts) ----->   each checked whole at its size
//!   File, Chunk..., FileEnd (each other
//!    file) ------------------------------>   written into a fresh 0700 directory
//!   Done -------------------------------->   restored, verified as any restore
//!         <-------------------------------   Restored (tree left stopped) | Failed
//!   Commit ------------------------------>   the restored tree let run
//!         <-------------------------------   Resumed
//!   (the source's stopped tree killed)
//! ```
//!
//! Post-copy (the Offer's `post_copy`) streams only the GPU data on the lanes, and sends
//! each large pages file as Later (its name and size) instead of its bytes; the
//! destination asks for its blocks over this link:
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
pub const PROTOCOL_VERSION: u32 = 4;

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
        /// How many lanes (connections beside this one) the source would open.
        lanes: u32,
    },
    /// The job fits: open `lanes` lanes, each joining with `ticket`.
    Accept {
        lanes: u32,
        ticket: String,
    },
    /// The first message of a lane (after Hello): the migration it belongs to, by the
    /// ticket its Accept gave, and its number.
    Join {
        ticket: String,
        lane: u32,
    },
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
    /// On a lane: the next chunk is the bytes of `path` (a pages file or a GPU data
    /// file, each written from start to end) at `offset` (the file made at its first
    /// part; parts come in any order, on any lane, and never overlap), until
    /// [`Control::Whole`] on the control link.
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
    /// The source lost a lane (`why`): the receiver answers Failed with its own reason
    /// (it closed the lane: a full disk, a corrupt chunk), or the source's.
    LaneLost {
        why: String,
    },
    /// Every file was sent (on a lane: every part of this lane; the receiver answers
    /// Done once they are written).
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
            Control::Accept { .. } => "accept",
            Control::Join { .. } => "join",
            Control::Mismatch { .. } => "mismatch",
            Control::File { .. } => "file",
            Control::FileEnd => "file_end",
            Control::Part { .. } => "part",
            Control::Whole { .. } => "whole",
            Control::Later { .. } => "later",
            Control::Fetch { .. } => "fetch",
            Control::AllIn => "all_in",
            Control::LaneLost { .. } => "lane_lost",
            Control::Done => "done",
            Control::Working => "working",
            Control::Restored { .. } => "restored",
            Control::Commit => "commit",
            Control::Resumed { .. } => "resumed",
            Control::Failed { .. } => "failed",
        }
    }
}
