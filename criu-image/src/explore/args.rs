//! argv and the environment, read from the dumped memory between mm's arg_start..arg_end
//! and env_start..env_end (what `/proc/PID/cmdline` and `environ` show).

use crate::error::Result;
use crate::pages::{split_nul, PageReader};
use crate::proto::MmEntry;

/// The most bytes read for argv or the environment. Linux caps each string at 128 KiB
/// and the total at a quarter of the stack limit; 16 MiB covers every real process and
/// bounds what a corrupt image can make the reader allocate.
pub const MAX_ARGS_BYTES: u64 = 16 << 20;

/// argv as dumped; None when the pages are not in this image (a zombie, or memory the
/// image does not hold).
pub fn read_cmdline(mm: &MmEntry, memory: &PageReader) -> Result<Option<Vec<String>>> {
    read_strings(mm.mm_arg_start, mm.mm_arg_end, memory)
}

/// The environment as dumped, "NAME=value" strings; None as for [`read_cmdline`].
pub fn read_environ(mm: &MmEntry, memory: &PageReader) -> Result<Option<Vec<String>>> {
    read_strings(mm.mm_env_start, mm.mm_env_end, memory)
}

fn read_strings(start: u64, end: u64, memory: &PageReader) -> Result<Option<Vec<String>>> {
    if end <= start {
        return Ok(if start == end { Some(Vec::new()) } else { None });
    }
    let len = (end - start).min(MAX_ARGS_BYTES) as usize;
    Ok(memory.read(start, len)?.map(|bytes| split_nul(&bytes)))
}
