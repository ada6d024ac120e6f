//! Reading dumped memory through a pagemap: pread from `pages-<id>.img`, a few pages at a
//! time. Pages files are never read whole.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use crate::error::{ErrorKind, ImageError, Result};
use crate::pagemap::{Location, Pagemap};
use crate::store::Source;

/// The dumped memory of one address space.
#[derive(Debug)]
pub struct PageReader {
    pagemap: Pagemap,
    path: PathBuf,
    file: Source,
    size: u64,
}

impl PageReader {
    /// Open the pages file of `pagemap` in `dir`.
    pub fn open(dir: &Path, pagemap: Pagemap) -> Result<PageReader> {
        let path = dir.join(pagemap.pages_file_name());
        let file = File::open(&path).map_err(|e| ImageError::io(&path, 0, e))?;
        PageReader::from_source(path, Source::File(file), pagemap)
    }

    /// The pages file of `pagemap`, opened elsewhere (held in memory); `path` names it
    /// in errors.
    pub fn from_source(path: PathBuf, file: Source, pagemap: Pagemap) -> Result<PageReader> {
        let size = file.size().map_err(|e| ImageError::io(&path, 0, e))?;
        Ok(PageReader {
            pagemap,
            path,
            file,
            size,
        })
    }

    pub fn pagemap(&self) -> &Pagemap {
        &self.pagemap
    }

    /// The pages file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The bytes of `start..start+len`, or None when part of the range was not dumped
    /// into this image (a hole, a parent image or a page server). `len` is the caller's
    /// bound on the allocation.
    pub fn read(&self, start: u64, len: usize) -> Result<Option<Vec<u8>>> {
        let Some(end) = start.checked_add(len as u64) else {
            return Ok(None);
        };
        let page = self.pagemap.page_size();
        // Check the whole range first, so nothing is allocated for a range that is not
        // there.
        let mut addr = start;
        while addr < end {
            let Location::Pages(at) = self.pagemap.locate(addr) else {
                return Ok(None);
            };
            let chunk = (page - addr % page).min(end - addr);
            if at + chunk > self.size {
                return Err(self.truncated(at, chunk));
            }
            addr += chunk;
        }
        let mut out = vec![0u8; len];
        let mut addr = start;
        while addr < end {
            let Location::Pages(at) = self.pagemap.locate(addr) else {
                return Ok(None);
            };
            let chunk = (page - addr % page).min(end - addr);
            let from = (addr - start) as usize;
            self.read_exact_at(&mut out[from..from + chunk as usize], at)?;
            addr += chunk;
        }
        Ok(Some(out))
    }

    fn read_exact_at(&self, buf: &mut [u8], at: u64) -> Result<()> {
        match self.file.read_exact_at(buf, at) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                Err(self.truncated(at, buf.len() as u64))
            }
            Err(e) => Err(ImageError::io(&self.path, at, e)),
        }
    }

    fn truncated(&self, at: u64, needed: u64) -> ImageError {
        ImageError::new(
            &self.path,
            at,
            ErrorKind::Truncated {
                needed,
                available: self.size.saturating_sub(at),
            },
        )
    }
}

/// Split a NUL-separated block (argv, environ) into strings. A trailing part without
/// its NUL is kept; invalid UTF-8 is replaced.
pub fn split_nul(bytes: &[u8]) -> Vec<String> {
    let bytes = bytes.strip_suffix(&[0]).unwrap_or(bytes);
    if bytes.is_empty() {
        return Vec::new();
    }
    bytes
        .split(|b| *b == 0)
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::pagemap::{PE_PARENT, PE_PRESENT};
    use crate::proto::PagemapEntry;

    fn entry(vaddr: u64, nr_pages: u64, flags: u32) -> PagemapEntry {
        PagemapEntry {
            vaddr,
            compat_nr_pages: 0,
            in_parent: None,
            flags: Some(flags),
            nr_pages: Some(nr_pages),
        }
    }

    #[test]
    fn reads_across_runs_and_stops_at_holes() {
        let dir = tempfile::tempdir().unwrap();
        let pm_file = crate::pagemap::tests_support::write_pagemap_in(
            dir.path(),
            "pagemap-1.img",
            7,
            &[
                entry(0x1000, 1, PE_PRESENT),
                entry(0x2000, 1, PE_PRESENT),
                entry(0x3000, 1, PE_PARENT),
            ],
        );
        let mut pages = File::create(dir.path().join("pages-7.img")).unwrap();
        pages.write_all(&[b'a'; 4096]).unwrap();
        pages.write_all(&[b'b'; 4096]).unwrap();
        let pm = Pagemap::read(&pm_file, 4096).unwrap();
        let reader = PageReader::open(dir.path(), pm).unwrap();
        let got = reader.read(0x1ffe, 4).unwrap().unwrap();
        assert_eq!(got, b"aabb");
        assert_eq!(reader.read(0x2ffe, 4).unwrap(), None);
        assert_eq!(reader.read(0x5000, 1).unwrap(), None);
    }

    #[test]
    fn short_pages_file_is_truncation_with_offset() {
        let dir = tempfile::tempdir().unwrap();
        let pm_file = crate::pagemap::tests_support::write_pagemap_in(
            dir.path(),
            "pagemap-1.img",
            1,
            &[entry(0x1000, 2, PE_PRESENT)],
        );
        std::fs::write(dir.path().join("pages-1.img"), [0u8; 5000]).unwrap();
        let reader = PageReader::open(dir.path(), Pagemap::read(&pm_file, 4096).unwrap()).unwrap();
        assert!(reader.read(0x2000, 100).unwrap().is_some());
        let err = reader.read(0x2000 + 900, 200).unwrap_err();
        assert_eq!(err.offset, 4996);
        assert!(
            err.to_string()
                .contains("pages-1.img: at offset 4996: unexpected end"),
            "{err}"
        );
    }

    #[test]
    fn splits_nul_separated_strings() {
        assert_eq!(split_nul(b"a\0bc\0"), ["a", "bc"]);
        assert_eq!(split_nul(b"a\0\0b"), ["a", "", "b"]);
        assert!(split_nul(b"").is_empty());
    }
}
