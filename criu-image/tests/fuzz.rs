//! Property tests: no byte sequence in any image file makes the reader panic or hang.
//! Random bytes, and random damage to a complete synthetic image set, go through every
//! reader, explorer and check; each error must name a file of the directory.

mod support;

use std::path::Path;

use gpucr_criu_image::check::{check_dir, check_framing};
use gpucr_criu_image::explore::fds::FileContext;
use gpucr_criu_image::explore::{
    explore_fds, explore_mems, explore_mounts, read_cmdline, read_environ, ProcessTree,
};
use gpucr_criu_image::{ImageDir, ImageError};
use proptest::prelude::*;
use support::*;

/// Run everything the crate offers over `dir`; errors are fine, panics are not.
fn read_everything(root: &Path) {
    let dir = ImageDir::new(root, PAGE);
    let named = |e: &ImageError| {
        assert!(e.path.starts_with(root), "{e}");
        assert!(e.describe_in(root).starts_with(&e.relative_path(root)));
    };
    let _ = dir.inventory().map_err(|e| named(&e));
    let _ = dir.stats("dump").map_err(|e| named(&e));
    let _ = dir.socket_queues().map_err(|e| named(&e));
    if let Ok(tree) = ProcessTree::load(&dir).map_err(|e| named(&e)) {
        let _ = tree.walk();
        let _ = explore_mounts(&dir, &tree).map_err(|e| named(&e));
        if let Ok(ctx) = FileContext::load(&dir).map_err(|e| named(&e)) {
            let _ = explore_fds(&dir, &tree, &ctx).map_err(|e| named(&e));
            if let Ok(mems) = explore_mems(&dir, &tree, &ctx).map_err(|e| named(&e)) {
                for m in mems {
                    if let Ok(reader) = dir.memory(m.pid).map_err(|e| named(&e)) {
                        let _ = read_cmdline(&m.mm, &reader).map_err(|e| named(&e));
                        let _ = read_environ(&m.mm, &reader).map_err(|e| named(&e));
                    }
                }
            }
        }
    }
    for e in check_dir(&dir) {
        named(&e);
    }
}

/// The files of the synthetic image.
const FILES: &[&str] = &[
    "inventory.img",
    "pstree.img",
    "core-1.img",
    "core-2.img",
    "core-3.img",
    "ids-1.img",
    "fs-1.img",
    "fdinfo-1.img",
    "files.img",
    "memfd.img",
    "tcp-stream-1234.img",
    "pipes-data.img",
    "mm-1.img",
    "pagemap-1.img",
    "pages-11.img",
    "mountpoints-5.img",
    "stats-dump",
];

#[derive(Debug, Clone)]
enum Damage {
    Flip { at: usize, bit: u8 },
    Truncate { to: usize },
    Word { at: usize, value: u32 },
    Splice { at: usize, bytes: Vec<u8> },
    Replace { bytes: Vec<u8> },
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Damage::Flip { at, bit }),
        any::<usize>().prop_map(|to| Damage::Truncate { to }),
        (
            any::<usize>(),
            prop_oneof![Just(u32::MAX), Just(0x8000_0000), any::<u32>()]
        )
            .prop_map(|(at, value)| Damage::Word { at, value }),
        (
            any::<usize>(),
            proptest::collection::vec(any::<u8>(), 1..16)
        )
            .prop_map(|(at, bytes)| Damage::Splice { at, bytes }),
        proptest::collection::vec(any::<u8>(), 0..256).prop_map(|bytes| Damage::Replace { bytes }),
    ]
}

fn apply(bytes: &mut Vec<u8>, d: &Damage) {
    let len = bytes.len().max(1);
    match d {
        Damage::Flip { at, bit } if !bytes.is_empty() => bytes[at % len] ^= 1 << bit,
        Damage::Truncate { to } => bytes.truncate(to % len),
        Damage::Word { at, value } if bytes.len() >= 4 => {
            let at = (at % (bytes.len() - 3)) & !3;
            bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
        }
        Damage::Splice { at, bytes: new } => {
            let at = at % len;
            let at = at.min(bytes.len());
            bytes.splice(at..at, new.iter().copied());
        }
        Damage::Replace { bytes: new } => *bytes = new.clone(),
        _ => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn damaged_images_never_panic(
        file in 0..FILES.len(),
        damages in proptest::collection::vec(damage(), 1..4),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        write_image_dir(tmp.path());
        let path = tmp.path().join(FILES[file]);
        let mut bytes = std::fs::read(&path).unwrap();
        for d in &damages {
            apply(&mut bytes, d);
        }
        std::fs::write(&path, &bytes).unwrap();
        read_everything(tmp.path());
    }

    #[test]
    fn random_bytes_never_panic(
        head in prop_oneof![
            Just(Vec::new()),
            Just(0x5456_4319u32.to_le_bytes().to_vec()),
            Just(0x5510_5940u32.to_le_bytes().to_vec()),
        ],
        magic in prop_oneof![
            Just(0x5027_3030u32), Just(0x5505_3847), Just(0x5749_2820), Just(0x5608_4025),
            Just(0x5630_3138), Just(0x5146_5506), Just(0x5645_3709), Just(0x5258_3605),
            Just(0x5545_3737), Just(0x5957_3019), Just(0x4628_3044), Just(0x5626_4026),
            Just(0x5831_3116), any::<u32>(),
        ],
        tail in proptest::collection::vec(any::<u8>(), 0..512),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let mut bytes = head;
        bytes.extend_from_slice(&magic.to_le_bytes());
        bytes.extend_from_slice(&tail);
        let path = tmp.path().join("x.img");
        std::fs::write(&path, &bytes).unwrap();
        if let Err(e) = check_framing(&path) {
            prop_assert!(e.offset <= bytes.len() as u64, "{}", e);
        }
    }
}
