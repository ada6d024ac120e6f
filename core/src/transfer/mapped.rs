//! The image's data files, mapped read-only: restore checks each chunk and writes it to
//! the device straight from the page cache, without copying it into gpucr's memory
//! first (only compressed chunks are decompressed into memory of their own).

use std::path::Path;

use memmap2::{Advice, Mmap, MmapOptions};

use super::error::{ProblemKind, TransferError};
use super::format::check_data_file;
use super::index::{ChunkEntry, GpuIndex};

/// How the data files will be read, for the kernel's readahead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Everything will be read soon: start reading it all now.
    Soon,
    /// Read in order when needed, and not before.
    WhenNeeded,
}

/// Every data file of an image, checked and mapped.
pub struct MappedFiles {
    /// `None` for an empty file (nothing can be mapped, no chunk is stored there).
    maps: Vec<Option<Mmap>>,
}

impl MappedFiles {
    /// Open data file after data file of `index` in `dir`, check its header and its
    /// size against the index, and map it.
    pub fn open(
        dir: &Path,
        index: &GpuIndex,
        access: Access,
    ) -> Result<MappedFiles, TransferError> {
        let mut maps = Vec::with_capacity(index.files.len());
        for n in 0..index.files.len() {
            let path = index.data_path(dir, n);
            let file = gpucr_criu_image::store::open_regular(&path)
                .map_err(|e| TransferError::io("open", &path, e))?;
            check_data_file(&file, &path, n, index.files[n].size)?;
            if index.files[n].size == 0 {
                maps.push(None);
                continue;
            }
            // SAFETY: the mapping is read-only and private to this process. The data
            // file lies in an image directory that only its owner can enter (gpucr
            // creates them 0700) and its size was just checked against the index; if
            // it were still truncated while mapped, reading past the new end would raise
            // SIGBUS, the one risk every reader of a mapped file takes.
            let map = unsafe { MmapOptions::new().map(&file) }
                .map_err(|e| TransferError::io("map", &path, e))?;
            let advice = match access {
                Access::Soon => Advice::WillNeed,
                Access::WhenNeeded => Advice::Sequential,
            };
            // Only a hint: a kernel that refuses it reads on demand instead.
            let _ = map.advise(advice);
            maps.push(Some(map));
        }
        Ok(MappedFiles { maps })
    }

    /// Ask the kernel to start reading chunk `c`'s stored bytes into the page cache, so
    /// that they are there when they are needed. Only a hint.
    pub fn will_need(&self, c: &ChunkEntry) {
        if let Some(Some(map)) = self.maps.get(usize::from(c.file)) {
            let page = crate::units::host_page_size() as usize;
            let start = (c.file_offset as usize) / page * page;
            let end = (c.file_offset as usize).saturating_add(c.stored_len as usize);
            if end <= map.len() && start < end {
                let _ = map.advise_range(Advice::WillNeed, start, end - start);
            }
        }
    }

    /// The stored bytes of chunk `c` (empty for zero chunks).
    pub fn stored(&self, c: &ChunkEntry) -> Result<&[u8], ProblemKind> {
        if c.stored_len == 0 {
            return Ok(&[]);
        }
        let map = self
            .maps
            .get(usize::from(c.file))
            .and_then(Option::as_ref)
            .ok_or(ProblemKind::Truncated)?;
        let start = usize::try_from(c.file_offset).map_err(|_| ProblemKind::Truncated)?;
        let end = start
            .checked_add(c.stored_len as usize)
            .ok_or(ProblemKind::Truncated)?;
        map.get(start..end).ok_or(ProblemKind::Truncated)
    }
}
