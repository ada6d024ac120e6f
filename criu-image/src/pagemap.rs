//! The pagemap of a process (or of a shared memory object): which virtual pages were
//! dumped, and where each one lies in its pages file.
//!
//! `pagemap-<pid>.img` starts with a `pagemap_head` naming `pages-<pages_id>.img`, then
//! lists runs of pages in address order. The data of every run flagged PE_PRESENT lies
//! back to back in the pages file, in the order of the pagemap; runs flagged PE_PARENT
//! (in a parent image) or PE_LAZY (served by a page server) take no space there. The page
//! size is not recorded in the image: callers pass the dumping host's page size.

use std::path::{Path, PathBuf};

use crate::error::{ImageError, Result};
use crate::framing::ImageFile;
use crate::magic;
use crate::proto::{PagemapEntry, PagemapHead};

/// The pages are in the parent image (a pre-dump).
pub const PE_PARENT: u32 = 1 << 0;
/// The pages are restored lazily, from a page server.
pub const PE_LAZY: u32 = 1 << 1;
/// The pages are in this image's pages file.
pub const PE_PRESENT: u32 = 1 << 2;

/// One pagemap entry: `nr_pages` pages from `vaddr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub vaddr: u64,
    pub nr_pages: u64,
    /// PE_* flags (old images' `in_parent` and missing flags are translated).
    pub flags: u32,
    /// Where the run's data starts in the pages file (PE_PRESENT runs only).
    pub file_offset: Option<u64>,
    /// The offset of the entry in the pagemap file, for error messages.
    pub entry_offset: u64,
}

impl Run {
    pub fn is_present(&self) -> bool {
        self.flags & PE_PRESENT != 0
    }
}

/// Where the data of one virtual address is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// At this offset of the pages file.
    Pages(u64),
    /// In the parent image.
    Parent,
    /// On a page server (lazy restore).
    Lazy,
    /// Not dumped (a hole: never touched, or a file mapping CRIU re-maps).
    Absent,
}

/// The process a pagemap image is named for: `pagemap-<pid>.img` gives its pid; a
/// shared memory object's (`pagemap-shmem-<id>.img`) and any other name give None.
pub fn process_of(name: &str) -> Option<u32> {
    name.strip_prefix("pagemap-")?
        .strip_suffix(".img")?
        .parse()
        .ok()
}

/// The index of one pagemap image, sorted by address.
#[derive(Debug, Clone)]
pub struct Pagemap {
    path: PathBuf,
    pages_id: u32,
    page_size: u64,
    runs: Vec<Run>,
    present_pages: u64,
}

impl Pagemap {
    /// Read and index `path`. Every size is checked for overflow, and runs that
    /// overlap are an error.
    pub fn read(path: &Path, page_size: u64) -> Result<Pagemap> {
        Pagemap::from_image(ImageFile::open(path)?, page_size)
    }

    /// Read and index an open pagemap image.
    pub fn from_image(image: ImageFile, page_size: u64) -> Result<Pagemap> {
        let mut image = image.expect_magic(magic::PAGEMAP)?;
        let path = image.path().to_path_buf();
        let path = path.as_path();
        let head_offset = image.offset();
        let head: PagemapHead = image
            .read_entry()?
            .ok_or_else(|| ImageError::invalid(path, head_offset, "no pagemap_head entry"))?;
        let mut runs = Vec::new();
        let mut next_offset: u64 = 0;
        let mut present_pages: u64 = 0;
        while let Some((offset, entry)) = image.read_entry_at::<PagemapEntry>()? {
            let run = to_run(&entry, offset, page_size, &mut next_offset)
                .ok_or_else(|| ImageError::invalid(path, offset, overflow_message(&entry)))?;
            if run.is_present() {
                present_pages += run.nr_pages;
            }
            runs.push(run);
        }
        // CRIU writes runs in address order; sort anyway so lookups can bisect.
        runs.sort_by_key(|r| r.vaddr);
        for pair in runs.windows(2) {
            let end = pair[0].vaddr + pair[0].nr_pages * page_size;
            if end > pair[1].vaddr {
                return Err(ImageError::invalid(
                    path,
                    pair[1].entry_offset,
                    format!(
                        "pages at {:#x} overlap the run {:#x}..{end:#x}",
                        pair[1].vaddr, pair[0].vaddr
                    ),
                ));
            }
        }
        Ok(Pagemap {
            path: path.to_path_buf(),
            pages_id: head.pages_id,
            page_size,
            runs,
            present_pages,
        })
    }

    /// The pagemap file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The id of the pages file: `pages-<id>.img`.
    pub fn pages_id(&self) -> u32 {
        self.pages_id
    }

    /// The pages file's name.
    pub fn pages_file_name(&self) -> String {
        format!("pages-{}.img", self.pages_id)
    }

    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    /// All runs, sorted by address.
    pub fn runs(&self) -> &[Run] {
        &self.runs
    }

    /// Pages whose data is in the pages file.
    pub fn present_pages(&self) -> u64 {
        self.present_pages
    }

    /// The bytes the pages file must hold: present pages times the page size.
    pub fn present_bytes(&self) -> u64 {
        self.present_pages * self.page_size
    }

    /// Pages of every run, present or not.
    pub fn total_pages(&self) -> u64 {
        self.runs.iter().map(|r| r.nr_pages).sum()
    }

    /// The run holding `addr`.
    pub fn find(&self, addr: u64) -> Option<&Run> {
        let i = self.runs.partition_point(|r| r.vaddr <= addr);
        let run = self.runs.get(i.checked_sub(1)?)?;
        (addr < run.vaddr + run.nr_pages * self.page_size).then_some(run)
    }

    /// Where the byte at `addr` was dumped.
    pub fn locate(&self, addr: u64) -> Location {
        match self.find(addr) {
            None => Location::Absent,
            Some(run) => match run.file_offset {
                Some(base) => Location::Pages(base + (addr - run.vaddr)),
                None if run.flags & PE_PARENT != 0 => Location::Parent,
                None if run.flags & PE_LAZY != 0 => Location::Lazy,
                None => Location::Absent,
            },
        }
    }

    /// Pages of `start..end` whose data is in the pages file.
    pub fn present_pages_in(&self, start: u64, end: u64) -> u64 {
        let first = self
            .runs
            .partition_point(|r| r.vaddr + r.nr_pages * self.page_size <= start);
        let mut pages = 0;
        for run in self.runs[first..].iter().take_while(|r| r.vaddr < end) {
            if !run.is_present() {
                continue;
            }
            let lo = run.vaddr.max(start);
            let hi = (run.vaddr + run.nr_pages * self.page_size).min(end);
            if hi > lo {
                pages += (hi - lo).div_ceil(self.page_size);
            }
        }
        pages
    }
}

/// Translate one entry; None if a size overflows.
fn to_run(entry: &PagemapEntry, offset: u64, page_size: u64, next: &mut u64) -> Option<Run> {
    let flags = match entry.flags {
        Some(f) => f,
        None if entry.in_parent == Some(true) => PE_PARENT,
        None => PE_PRESENT,
    };
    let nr_pages = entry.nr_pages.unwrap_or(u64::from(entry.compat_nr_pages));
    let bytes = nr_pages.checked_mul(page_size)?;
    entry.vaddr.checked_add(bytes)?;
    let file_offset = if flags & PE_PRESENT != 0 {
        let at = *next;
        *next = next.checked_add(bytes)?;
        Some(at)
    } else {
        None
    };
    Some(Run {
        vaddr: entry.vaddr,
        nr_pages,
        flags,
        file_offset,
        entry_offset: offset,
    })
}

fn overflow_message(entry: &PagemapEntry) -> String {
    format!(
        "{} pages at {:#x} overflow the address space or the pages file",
        entry.nr_pages.unwrap_or(u64::from(entry.compat_nr_pages)),
        entry.vaddr
    )
}

#[cfg(test)]
pub(crate) mod tests_support {
    use std::path::{Path, PathBuf};

    use crate::encode::{image_bytes, push_entry};
    use crate::framing::Head;
    use crate::magic;
    use crate::proto::{PagemapEntry, PagemapHead};

    /// Write `name` in `dir`: a pagemap of `pages_id` with `entries`.
    pub fn write_pagemap_in(
        dir: &Path,
        name: &str,
        pages_id: u32,
        entries: &[PagemapEntry],
    ) -> PathBuf {
        let mut bytes = image_bytes(Head::Common, magic::PAGEMAP, &[PagemapHead { pages_id }]);
        for e in entries {
            push_entry(&mut bytes, e);
        }
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::write_pagemap_in;
    use super::*;

    struct Fixture {
        _dir: tempfile::TempDir,
        path: PathBuf,
    }

    fn write_pagemap(pages_id: u32, entries: &[PagemapEntry]) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let path = write_pagemap_in(dir.path(), "pagemap-1.img", pages_id, entries);
        Fixture { _dir: dir, path }
    }

    fn entry(vaddr: u64, nr_pages: u64, flags: Option<u32>) -> PagemapEntry {
        PagemapEntry {
            vaddr,
            compat_nr_pages: 0,
            in_parent: None,
            flags,
            nr_pages: Some(nr_pages),
        }
    }

    #[test]
    fn a_process_pagemap_names_its_pid() {
        assert_eq!(process_of("pagemap-42.img"), Some(42));
        assert_eq!(process_of("pagemap-shmem-105979.img"), None);
        assert_eq!(process_of("pages-1.img"), None);
        assert_eq!(process_of("pagemap-42.img.tmp"), None);
    }

    #[test]
    fn offsets_sum_present_runs_only() {
        let f = write_pagemap(
            3,
            &[
                entry(0x10000, 2, Some(PE_PRESENT)),
                entry(0x20000, 5, Some(PE_PARENT)),
                entry(0x30000, 1, Some(PE_LAZY)),
                entry(0x40000, 3, Some(PE_PRESENT | PE_LAZY)),
            ],
        );
        let pm = Pagemap::read(&f.path, 4096).unwrap();
        assert_eq!(pm.pages_file_name(), "pages-3.img");
        assert_eq!(pm.present_pages(), 5);
        assert_eq!(pm.total_pages(), 11);
        assert_eq!(pm.locate(0x10000 + 4097), Location::Pages(4097));
        assert_eq!(pm.locate(0x20000), Location::Parent);
        assert_eq!(pm.locate(0x30000), Location::Lazy);
        assert_eq!(pm.locate(0x40000 + 10), Location::Pages(2 * 4096 + 10));
        assert_eq!(pm.locate(0x12000), Location::Absent);
        assert_eq!(pm.present_pages_in(0x11000, 0x41000), 2);
    }

    #[test]
    fn page_size_is_a_parameter() {
        let f = write_pagemap(
            1,
            &[
                entry(0x100000, 2, Some(PE_PRESENT)),
                entry(0x200000, 1, None),
            ],
        );
        let pm = Pagemap::read(&f.path, 65536).unwrap();
        assert_eq!(pm.present_bytes(), 3 * 65536);
        assert_eq!(pm.locate(0x200000 + 5), Location::Pages(2 * 65536 + 5));
    }

    #[test]
    fn old_images_use_compat_fields() {
        let old = PagemapEntry {
            vaddr: 0x1000,
            compat_nr_pages: 4,
            in_parent: Some(true),
            flags: None,
            nr_pages: None,
        };
        let f = write_pagemap(1, &[old]);
        let pm = Pagemap::read(&f.path, 4096).unwrap();
        assert_eq!(pm.runs()[0].nr_pages, 4);
        assert_eq!(pm.runs()[0].flags, PE_PARENT);
        assert_eq!(pm.present_pages(), 0);
    }

    #[test]
    fn overflowing_and_overlapping_runs_are_errors() {
        let f = write_pagemap(1, &[entry(u64::MAX - 4095, 2, Some(PE_PRESENT))]);
        let err = Pagemap::read(&f.path, 4096).unwrap_err();
        assert_eq!(err.offset, 14);
        let f = write_pagemap(
            1,
            &[
                entry(0x1000, 2, Some(PE_PRESENT)),
                entry(0x2000, 1, Some(PE_PRESENT)),
            ],
        );
        let err = Pagemap::read(&f.path, 4096).unwrap_err();
        assert!(err.to_string().contains("overlap"), "{err}");
    }
}
