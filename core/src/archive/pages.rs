//! Which bytes of a pages file to keep while it streams past: the pages that hold each
//! process's argv and environment (what the process tree shows), nothing else.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use gpucr_criu_image::explore::MAX_ARGS_BYTES;
use gpucr_criu_image::pagemap::Location;
use gpucr_criu_image::store::MemoryFiles;
use gpucr_criu_image::ImageDir;

use crate::image::{Manifest, MANIFEST_FILE};

/// The byte ranges (offset, length) of the pages file `pages` that hold the argv and
/// environment of the processes whose pagemap and mm images are in `files`; sorted,
/// merged. `page_size` is used when the manifest in `files` records none.
pub fn capture_plan(
    files: &MemoryFiles,
    root: &Path,
    page_size: u64,
    pages: &str,
) -> Vec<(u64, u64)> {
    let page_size = manifest_page_size(files, root).unwrap_or(page_size);
    let images = ImageDir::in_memory(root, page_size, Arc::new(files.clone()));
    let mut ranges = Vec::new();
    for name in files.names() {
        let Some(pid) = gpucr_criu_image::pagemap::process_of(name) else {
            continue;
        };
        let Ok(pagemap) = images.pagemap_named(name) else {
            continue;
        };
        if pagemap.pages_file_name() != pages {
            continue;
        }
        let Ok(mm) = images.mm(pid) else { continue };
        for (start, end) in [
            (mm.mm_arg_start, mm.mm_arg_end),
            (mm.mm_env_start, mm.mm_env_end),
        ] {
            if end <= start {
                continue;
            }
            let end = end.min(start.saturating_add(MAX_ARGS_BYTES));
            let mut addr = start - start % page_size;
            while addr < end {
                if let Location::Pages(offset) = pagemap.locate(addr) {
                    ranges.push((offset, page_size));
                }
                addr += page_size;
            }
        }
    }
    merge(ranges)
}

fn manifest_page_size(files: &MemoryFiles, root: &Path) -> Option<u64> {
    let file = files.get(MANIFEST_FILE)?;
    let mut bytes = vec![0u8; file.size() as usize];
    gpucr_criu_image::store::Source::Memory(file.clone())
        .read_exact_at(&mut bytes, 0)
        .ok()?;
    let manifest = Manifest::parse(&bytes, &root.join(MANIFEST_FILE)).ok()?;
    Some(manifest.host.page_size).filter(|s| s.is_power_of_two())
}

fn merge(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (start, len) in ranges {
        match out.last_mut() {
            Some((s, l)) if *s + *l >= start => *l = (*l).max(start + len - *s),
            _ => out.push((start, len)),
        }
    }
    out
}

/// Keeps the planned ranges of a file whose bytes arrive in order.
#[derive(Debug)]
pub struct Capture {
    ranges: Vec<(u64, u64)>,
    next: usize,
    pos: u64,
    extents: BTreeMap<u64, Vec<u8>>,
}

impl Capture {
    pub fn new(ranges: Vec<(u64, u64)>) -> Capture {
        Capture {
            ranges,
            next: 0,
            pos: 0,
            extents: BTreeMap::new(),
        }
    }

    /// The next bytes of the file.
    pub fn update(&mut self, bytes: &[u8]) {
        let end = self.pos + bytes.len() as u64;
        while let Some(&(start, len)) = self.ranges.get(self.next) {
            if start >= end {
                break;
            }
            let lo = start.max(self.pos);
            let hi = (start + len).min(end);
            if hi > lo {
                self.extents
                    .entry(start)
                    .or_default()
                    .extend_from_slice(&bytes[(lo - self.pos) as usize..(hi - self.pos) as usize]);
            }
            if start + len <= end {
                self.next += 1;
            } else {
                break;
            }
        }
        self.pos = end;
    }

    /// The kept ranges (start offset -> bytes) and how many bytes they hold.
    pub fn finish(self) -> (BTreeMap<u64, Vec<u8>>, u64) {
        let held = self.extents.values().map(|v| v.len() as u64).sum();
        (self.extents, held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge() {
        assert_eq!(
            merge(vec![(8192, 4096), (0, 4096), (4096, 4096), (20000, 10)]),
            vec![(0, 12288), (20000, 10)]
        );
    }

    #[test]
    fn capture_keeps_planned_ranges_across_pieces() {
        let data: Vec<u8> = (0..100u8).collect();
        let mut c = Capture::new(vec![(5, 10), (40, 3), (98, 5)]);
        for piece in data.chunks(7) {
            c.update(piece);
        }
        let (extents, held) = c.finish();
        assert_eq!(extents[&5], (5..15).collect::<Vec<u8>>());
        assert_eq!(extents[&40], vec![40, 41, 42]);
        // A range past the end keeps what there was.
        assert_eq!(extents[&98], vec![98, 99]);
        assert_eq!(held, 15);
    }
}
