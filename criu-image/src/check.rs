//! Structural verification of a CRIU image directory, file by file:
//!
//! * every framed image (`*.img` that is not raw, `stats-*`) has a valid head, a known
//!   layout of entries with lengths inside the file, protobuf that decodes, and the
//!   extra payloads its type carries (pipe data, socket queues, TCP queues, ghost file
//!   chunks, IPC data) inside the file;
//! * every pages file is exactly as long as the PE_PRESENT pages of its pagemaps;
//! * every process in pstree.img has the images a restore needs.
//!
//! Each problem is an [`ImageError`] naming the file and the offset.

use std::collections::BTreeMap;

use prost::{Message, Name};

use crate::dir::ImageDir;
use crate::error::{ImageError, Result};
use crate::explore::ps::TaskState;
use crate::framing::ImageFile;
use crate::magic;
use crate::proto::{
    BpfmapDataEntry, CoreEntry, FdinfoEntry, FileEntry, FsEntry, GhostChunkEntry, GhostFileEntry,
    InventoryEntry, IpcMsg, IpcMsgEntry, IpcSemEntry, IpcShmEntry, MemfdInodeEntry, MmEntry,
    MntEntry, PagemapEntry, PagemapHead, PipeDataEntry, PstreeEntry, SkPacketEntry, StatsEntry,
    TaskKobjIdsEntry, TcpStreamEntry, TtyInfoEntry, UnknownEntry,
};

/// How many entries an image holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framing {
    pub magic: u32,
    pub entries: u64,
}

/// Walk every entry of one image, decoding it and skipping its extra payload.
pub fn check_framing(path: &std::path::Path) -> Result<Framing> {
    check_image_framing(ImageFile::open(path)?)
}

/// [`check_framing`] of an open image.
pub fn check_image_framing(mut image: ImageFile) -> Result<Framing> {
    let magic = image.magic();
    let entries = match magic {
        magic::PAGEMAP => {
            let head = entries_of::<PagemapHead>(&mut image, Some(1))?;
            head + entries_of::<PagemapEntry>(&mut image, None)?
        }
        magic::PIPES_DATA | magic::FIFO_DATA => {
            with_payload::<PipeDataEntry>(&mut image, |e| Ok(u64::from(e.bytes)))?
        }
        magic::SK_QUEUES => with_payload::<SkPacketEntry>(&mut image, |e| Ok(u64::from(e.length)))?,
        magic::TCP_STREAM => with_payload::<TcpStreamEntry>(&mut image, |e| {
            Ok(u64::from(e.inq_len) + u64::from(e.outq_len))
        })?,
        magic::BPFMAP_DATA => with_payload::<BpfmapDataEntry>(&mut image, |e| {
            Ok(u64::from(e.keys_bytes) + u64::from(e.values_bytes))
        })?,
        magic::IPCNS_SHM => with_payload::<IpcShmEntry>(&mut image, |e| {
            Ok(if e.in_pagemaps == Some(true) {
                0
            } else {
                e.size.div_ceil(4).saturating_mul(4)
            })
        })?,
        magic::IPCNS_SEM => with_payload::<IpcSemEntry>(&mut image, |e| {
            Ok((u64::from(e.nsems) * 2).div_ceil(8) * 8)
        })?,
        magic::IPCNS_MSG => ipc_messages(&mut image)?,
        magic::GHOST_FILE => ghost_file(&mut image)?,
        magic::INVENTORY => entries_of::<InventoryEntry>(&mut image, None)?,
        magic::PSTREE => entries_of::<PstreeEntry>(&mut image, None)?,
        magic::CORE => entries_of::<CoreEntry>(&mut image, None)?,
        magic::IDS => entries_of::<TaskKobjIdsEntry>(&mut image, None)?,
        magic::MM => entries_of::<MmEntry>(&mut image, None)?,
        magic::FDINFO => entries_of::<FdinfoEntry>(&mut image, None)?,
        magic::FILES => entries_of::<FileEntry>(&mut image, None)?,
        magic::FS => entries_of::<FsEntry>(&mut image, None)?,
        magic::STATS => entries_of::<StatsEntry>(&mut image, None)?,
        magic::MNTS => entries_of::<MntEntry>(&mut image, None)?,
        magic::MEMFD_INODE => entries_of::<MemfdInodeEntry>(&mut image, None)?,
        magic::TTY_INFO => entries_of::<TtyInfoEntry>(&mut image, None)?,
        _ => entries_of::<UnknownEntry>(&mut image, None)?,
    };
    Ok(Framing { magic, entries })
}

/// Every problem found in `dir`, sorted by file name. An empty list means the CRIU
/// images are structurally sound.
pub fn check_dir(dir: &ImageDir) -> Vec<ImageError> {
    let mut problems = Vec::new();
    let names = match dir.file_names() {
        Ok(names) => names,
        Err(e) => return vec![e],
    };
    for name in names.iter().filter(|n| magic::is_framed_image(n)) {
        if let Err(e) = dir.open_image(name).and_then(check_image_framing) {
            problems.push(e);
        }
    }
    check_pages_sizes(dir, &names, &mut problems);
    check_process_images(dir, &mut problems);
    problems.sort_by(|a, b| a.path.cmp(&b.path).then(a.offset.cmp(&b.offset)));
    problems.dedup_by(|a, b| a.path == b.path && a.to_string() == b.to_string());
    problems
}

/// Each pages file must hold exactly the PE_PRESENT pages of the pagemaps naming it.
fn check_pages_sizes(dir: &ImageDir, names: &[String], problems: &mut Vec<ImageError>) {
    // pages_id -> (bytes needed, pagemap names)
    let mut needed: BTreeMap<u32, (u64, Vec<String>)> = BTreeMap::new();
    for name in names
        .iter()
        .filter(|n| n.starts_with("pagemap-") && n.ends_with(".img"))
    {
        // A pagemap that does not parse is already reported by the framing check.
        let Ok(pm) = dir.pagemap_named(name) else {
            continue;
        };
        let slot = needed.entry(pm.pages_id()).or_default();
        slot.0 = slot.0.saturating_add(pm.present_bytes());
        slot.1.push(name.clone());
    }
    for (pages_id, (bytes, pagemaps)) in needed {
        let pages_name = format!("pages-{pages_id}.img");
        let path = dir.file(&pages_name);
        let actual = match dir.file_size(&pages_name) {
            Ok(size) => size,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && bytes == 0 => continue,
            Err(e) => {
                problems.push(ImageError::io(&path, 0, e));
                continue;
            }
        };
        let described_by = pagemaps.join(", ");
        if actual < bytes {
            problems.push(ImageError::invalid(
                &path,
                actual,
                format!(
                    "truncated: {actual} bytes, but {described_by} describe {bytes} bytes of pages"
                ),
            ));
        } else if actual > bytes {
            problems.push(ImageError::invalid(
                &path,
                bytes,
                format!(
                    "{} bytes past the end of the pages that {described_by} describe ({bytes} bytes)",
                    actual - bytes
                ),
            ));
        }
    }
}

/// Every process needs its core images; live ones also mm, pagemap, ids, fs and fdinfo.
fn check_process_images(dir: &ImageDir, problems: &mut Vec<ImageError>) {
    let Ok(pstree) = dir.pstree() else { return };
    for p in pstree {
        let mut needed: Vec<String> = p.threads.iter().map(|t| format!("core-{t}.img")).collect();
        if !p.threads.contains(&p.pid) {
            needed.push(format!("core-{}.img", p.pid));
        }
        let alive = dir
            .core(p.pid)
            .ok()
            .and_then(|c| c.tc)
            .is_some_and(|tc| TaskState::from_raw(tc.task_state).has_resources());
        if alive {
            needed.push(format!("mm-{}.img", p.pid));
            needed.push(format!("pagemap-{}.img", p.pid));
            if let Ok(ids) = dir.ids(p.pid) {
                needed.push(format!("fdinfo-{}.img", ids.files_id));
            }
        }
        for name in needed {
            if !dir.exists(&name) {
                problems.push(ImageError::invalid(
                    &dir.file(&name),
                    0,
                    format!("missing, but pstree.img lists process {}", p.pid),
                ));
            }
        }
    }
}

/// Decode up to `limit` entries (all when None) as `M`; a missing limited entry is an
/// error.
fn entries_of<M: Message + Name + Default>(
    image: &mut ImageFile,
    limit: Option<u64>,
) -> Result<u64> {
    let mut n = 0;
    while limit.is_none_or(|l| n < l) {
        let at = image.offset();
        match image.read_entry::<M>()? {
            Some(_) => n += 1,
            None if limit.is_some() => {
                return Err(ImageError::invalid(
                    image.path(),
                    at,
                    format!("no {} entry", M::NAME),
                ))
            }
            None => break,
        }
    }
    Ok(n)
}

/// Entries of `M`, each followed by `payload(entry)` bytes.
fn with_payload<M: Message + Name + Default>(
    image: &mut ImageFile,
    payload: impl Fn(&M) -> Result<u64>,
) -> Result<u64> {
    let mut n = 0;
    while let Some(entry) = image.read_entry::<M>()? {
        image.skip(payload(&entry)?)?;
        n += 1;
    }
    Ok(n)
}

fn ipc_messages(image: &mut ImageFile) -> Result<u64> {
    let mut n = 0;
    while let Some(queue) = image.read_entry::<IpcMsgEntry>()? {
        for _ in 0..queue.qnum {
            let at = image.offset();
            let msg = image.read_entry::<IpcMsg>()?.ok_or_else(|| {
                ImageError::invalid(image.path(), at, "fewer messages than the queue's qnum")
            })?;
            image.skip(u64::from(msg.msize).div_ceil(8) * 8)?;
        }
        n += 1;
    }
    Ok(n)
}

fn ghost_file(image: &mut ImageFile) -> Result<u64> {
    let at = image.offset();
    let head = image
        .read_entry::<GhostFileEntry>()?
        .ok_or_else(|| ImageError::invalid(image.path(), at, "no ghost_file_entry"))?;
    if head.chunks != Some(true) {
        image.skip_to_end()?;
        return Ok(1);
    }
    let mut n = 1;
    while let Some(chunk) = image.read_entry::<GhostChunkEntry>()? {
        image.skip(chunk.len)?;
        n += 1;
    }
    Ok(n)
}
