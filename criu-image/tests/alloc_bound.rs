//! Allocation is bounded by the file being read: a length field of 4 GiB in a 100-byte
//! file is an error, not an allocation; and no damage to a small image makes the reader
//! ask for more memory than the image holds. A counting global allocator records the
//! largest single allocation; this file has one test so nothing else allocates meanwhile.

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use gpucr_criu_image::check::{check_dir, check_framing};
use gpucr_criu_image::explore::fds::FileContext;
use gpucr_criu_image::explore::{explore_fds, explore_mems, read_cmdline, ProcessTree};
use gpucr_criu_image::{magic, ErrorKind, ImageDir};

struct Largest;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; the counter only
// observes sizes.
unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is passed through.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout` (see `alloc`).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: the caller's contract for `realloc` is passed through.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Largest = Largest;

/// Largest allocation made by `f`.
fn largest_allocation(f: impl FnOnce()) -> usize {
    LARGEST.store(0, Ordering::SeqCst);
    f();
    LARGEST.load(Ordering::SeqCst)
}

#[test]
fn allocation_is_bounded_by_the_file() {
    let tmp = tempfile::tempdir().unwrap();

    // A 100-byte pstree.img whose first entry claims 4 GiB.
    let path = tmp.path().join("pstree.img");
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&magic::IMG_COMMON.to_le_bytes());
    bytes.extend_from_slice(&magic::PSTREE.to_le_bytes());
    bytes.extend_from_slice(&u32::MAX.to_le_bytes());
    bytes.resize(100, 0xab);
    std::fs::write(&path, &bytes).unwrap();
    let mut result = None;
    let largest = largest_allocation(|| result = Some(check_framing(&path)));
    let err = result.unwrap().unwrap_err();
    assert!(
        matches!(
            err.kind,
            ErrorKind::EntryTooLarge {
                size: 4_294_967_295,
                available: 88
            }
        ),
        "{err}"
    );
    assert_eq!(err.offset, 8);
    assert!(largest > 0, "the counting allocator saw nothing");
    assert!(
        largest < 64 * 1024,
        "largest allocation {largest} bytes for a 100-byte file"
    );

    // Every entry of every image of a synthetic dump given a huge length, in turn: the
    // reader never allocates more than the largest file plus its read buffer.
    let dir = tmp.path().join("image");
    std::fs::create_dir(&dir).unwrap();
    support::write_image_dir(&dir);
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let biggest_file = names
        .iter()
        .map(|n| std::fs::metadata(dir.join(n)).unwrap().len())
        .max()
        .unwrap();
    let bound = biggest_file as usize + 128 * 1024;
    for name in &names {
        let path = dir.join(name);
        let original = std::fs::read(&path).unwrap();
        for at in (0..original.len().saturating_sub(3)).step_by(4) {
            let mut damaged = original.clone();
            damaged[at..at + 4].copy_from_slice(&0xffff_fff0u32.to_le_bytes());
            std::fs::write(&path, &damaged).unwrap();
            let largest = largest_allocation(|| read_all(&dir));
            assert!(
                largest <= bound,
                "{name} with a huge word at {at}: allocated {largest} bytes"
            );
        }
        std::fs::write(&path, &original).unwrap();
    }
}

fn read_all(root: &std::path::Path) {
    let dir = ImageDir::new(root, support::PAGE);
    if let (Ok(tree), Ok(ctx)) = (ProcessTree::load(&dir), FileContext::load(&dir)) {
        let _ = explore_fds(&dir, &tree, &ctx);
        if let Ok(mems) = explore_mems(&dir, &tree, &ctx) {
            for m in mems {
                if let Ok(reader) = dir.memory(m.pid) {
                    let _ = read_cmdline(&m.mm, &reader);
                }
            }
        }
    }
    let _ = check_dir(&dir);
}
