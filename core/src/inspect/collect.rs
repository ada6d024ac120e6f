//! Build the [`Report`] of an image directory: the manifest, CRIU's images and the
//! sizes of the files. Parts that cannot be read become [`ReportError`]s; the rest is
//! still shown.

use std::io;
use std::path::Path;

use gpucr_criu_image::explore::fds::{process_files, FileContext};
use gpucr_criu_image::explore::mems::process_memory;
use gpucr_criu_image::explore::sockets::SocketContext;
use gpucr_criu_image::explore::{
    explore_mounts, read_cmdline, read_environ, FileDesc, Process, ProcessMemory, ProcessTree,
};
use gpucr_criu_image::pagemap::{PE_LAZY, PE_PARENT, PE_PRESENT};
use gpucr_criu_image::{ImageDir, ImageError};

use super::model::*;
use super::source::ImageSource;
use super::InspectError;
use crate::image::dir::ImagePath;
use crate::image::{Manifest, ManifestError, INCOMPLETE_FILE, MANIFEST_FILE};
use crate::progress::spans;

/// What to collect.
#[derive(Debug, Clone)]
pub struct Options {
    /// Only this process and its descendants (pid inside the image's namespace).
    pub pid: Option<u32>,
    /// The page size to read pagemaps with (CRIU does not record it).
    pub page_size: u64,
}

/// Read everything `gpucr inspect` shows about the image directory `dir`.
pub fn collect(dir: &Path, opts: &Options) -> Result<Report, InspectError> {
    collect_from(&ImageSource::dir(dir), opts)
}

/// The manifest of `source`.
pub fn read_manifest(source: &ImageSource) -> Result<Manifest, ManifestError> {
    let path = Manifest::path_in(source.root());
    match source.read(MANIFEST_FILE) {
        Ok(text) => Manifest::parse(&text, &path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(ManifestError::Missing { path }),
        Err(source) => Err(ManifestError::Read { path, source }),
    }
}

/// Read everything `gpucr inspect` shows about the image in `source`.
pub fn collect_from(source: &ImageSource, opts: &Options) -> Result<Report, InspectError> {
    let dir = source.root();
    if !source.exists() {
        let path = dir.to_path_buf();
        return Err(match ImagePath::of(dir) {
            ImagePath::Missing => InspectError::NotFound { path },
            _ => InspectError::NotADirectory { path },
        });
    }
    let mut errors = Vec::new();
    // Present but unreadable: the image is damaged, not missing its manifest.
    let mut unreadable_manifest = None;
    let manifest = match read_manifest(source) {
        Ok(m) => Some(m),
        Err(ManifestError::Missing { .. }) => None,
        Err(e) => {
            let message = super::with_causes(&e);
            unreadable_manifest = Some(message.clone());
            errors.push(ReportError {
                file: MANIFEST_FILE.into(),
                offset: None,
                message,
            });
            None
        }
    };
    let images = source.images(opts.page_size);
    let inventory = match images.inventory() {
        Ok(inv) => Some(inv),
        Err(e) => {
            errors.push(report_error(dir, &e));
            None
        }
    };
    let tree = match ProcessTree::load(&images) {
        Ok(tree) => tree,
        Err(e) => {
            errors.push(report_error(dir, &e));
            ProcessTree::default()
        }
    };
    let selected: Vec<(usize, &Process)> = match opts.pid {
        Some(pid) => {
            let sub = tree.subtree(pid);
            if sub.is_empty() && !tree.is_empty() {
                let pids: Vec<String> =
                    tree.processes().iter().map(|p| p.pid.to_string()).collect();
                return Err(InspectError::NoSuchProcess {
                    pid,
                    pids: pids.join(", "),
                });
            }
            sub
        }
        None => tree.walk(),
    };
    let ctx = match FileContext::load(&images) {
        Ok(ctx) => Some(ctx),
        Err(e) => {
            errors.push(report_error(dir, &e));
            None
        }
    };
    let empty_ctx;
    let ctx_for_memory = match &ctx {
        Some(c) => c,
        None => {
            empty_ctx = FileContext {
                files: Default::default(),
                memfds: Default::default(),
                ttys: Default::default(),
                sockets: SocketContext::default(),
            };
            &empty_ctx
        }
    };
    let mut processes = Vec::with_capacity(selected.len());
    for (_, p) in &selected {
        processes.push(process_info(
            dir,
            &images,
            ctx.as_ref(),
            ctx_for_memory,
            p,
            &mut errors,
        ));
    }
    let roots: Vec<u32> = match opts.pid {
        Some(pid) if tree.get(pid).is_some() => vec![pid],
        _ => tree.roots().iter().map(|p| p.pid).collect(),
    };
    let process_tree = roots
        .iter()
        .filter_map(|&pid| tree_node(&tree, pid, &mut Vec::new()))
        .collect();
    let mounts = match explore_mounts(&images, &tree) {
        Ok(m) => m.map(|list| list.into_iter().map(mount_info).collect()),
        Err(e) => {
            errors.push(report_error(dir, &e));
            None
        }
    };
    let stats = stats(dir, &images, manifest.as_ref(), &mut errors);
    let mut sizes = sizes(source);
    let (gpu, gpu_error) = super::gpu::gpu_info(source, manifest.as_ref());
    errors.extend(gpu_error);
    if gpu.recorded {
        sizes.gpu_raw = gpu.memory_raw;
        sizes.gpu_stored = gpu.memory_stored;
    }
    let incomplete_reason = match (&manifest, source.incomplete_reason()) {
        (_, Some(reason)) => Some(reason),
        (None, None) if source.has_file(INCOMPLETE_FILE) => {
            Some("the dump failed (see gpucr-incomplete.json)".into())
        }
        (None, None) if unreadable_manifest.is_some() => Some(format!(
            "the image is damaged: {}",
            unreadable_manifest.as_deref().unwrap_or_default()
        )),
        // A container checkpointed by its engine without gpucr (no GPU): CRIU's images
        // are the whole checkpoint.
        (None, None) if source.is_archive() && !source.has_dir(crate::transfer::GPU_DIR) => None,
        (None, None) => Some(
            "no manifest (gpucr.json): the dump did not finish, or this is not a gpucr image"
                .into(),
        ),
        (Some(_), None) => None,
    };
    let manifest_damaged =
        manifest.is_none() && unreadable_manifest.is_some() && !source.has_file(INCOMPLETE_FILE);
    let image = ImageSummary {
        dir: dir.display().to_string(),
        complete: incomplete_reason.is_none(),
        incomplete_reason,
        manifest_damaged,
        format_version: manifest.as_ref().map(|m| m.format_version),
        gpucr_version: manifest.as_ref().map(|m| m.gpucr_version.clone()),
        criu_version: manifest.as_ref().map(|m| m.criu_version.clone()),
        criu_image_version: inventory.as_ref().map(|i| i.img_version),
        created: manifest.as_ref().map(|m| m.created.clone()),
        host: manifest.as_ref().map(|m| HostInfo {
            hostname: m.host.hostname.clone(),
            kernel: m.host.kernel.clone(),
            arch: m.host.arch.clone(),
        }),
        backend: manifest.as_ref().map(|m| m.backend.clone()),
        target: manifest.as_ref().map(|m| TargetInfo {
            pid: m.target.pid,
            comm: m.target.comm.clone(),
            cmdline: m.target.cmdline.clone(),
        }),
        options: manifest.as_ref().map(|m| m.options.clone()),
        criu_plugins: inventory
            .as_ref()
            .and_then(|i| i.plugins_entry.as_ref())
            .map(|p| p.plugins.clone())
            .unwrap_or_default(),
        page_size: opts.page_size,
        processes: tree.len() as u64,
        threads: tree
            .processes()
            .iter()
            .map(|p| p.threads.len() as u64)
            .sum(),
        sizes,
    };
    Ok(Report {
        schema_version: SCHEMA_VERSION,
        container: None,
        archive: None,
        image,
        process_tree,
        processes,
        mounts,
        gpu,
        stats,
        verify: None,
        errors,
    })
}

/// An image error as a report entry, with the file relative to the image directory.
pub fn report_error(dir: &Path, e: &ImageError) -> ReportError {
    let offset = (!e.is_missing()).then_some(e.offset);
    ReportError {
        file: e.relative_path(dir),
        offset,
        message: e.describe_in(dir),
    }
}

fn process_info(
    dir: &Path,
    images: &ImageDir,
    ctx: Option<&FileContext>,
    ctx_for_memory: &FileContext,
    p: &Process,
    errors: &mut Vec<ReportError>,
) -> ProcessInfo {
    let mut info = ProcessInfo {
        pid: p.pid,
        ppid: p.ppid,
        pgid: p.pgid,
        sid: p.sid,
        comm: p.comm.clone(),
        state: p.state.name().into(),
        exit_code: (!p.state.has_resources()).then_some(p.exit_code),
        threads: p
            .threads
            .iter()
            .map(|t| ThreadInfo {
                tid: t.tid,
                comm: t.comm.clone(),
            })
            .collect(),
        cmdline: None,
        environment: None,
        files: None,
        cwd: None,
        root: None,
        sockets: Vec::new(),
        memory: None,
    };
    if !p.state.has_resources() {
        return info;
    }
    if let Some(ctx) = ctx {
        match process_files(images, ctx, p.pid) {
            Ok(files) => {
                info.sockets = files.files.iter().filter_map(socket_info).collect();
                info.files = Some(files.files.iter().map(fd_info).collect());
                info.cwd = files.cwd;
                info.root = files.root;
            }
            Err(e) => errors.push(report_error(dir, &e)),
        }
    }
    match process_memory(images, ctx_for_memory, p.pid) {
        Ok(mem) => {
            match images.page_reader(mem.pagemap.clone()) {
                Ok(reader) => {
                    match read_cmdline(&mem.mm, &reader) {
                        Ok(argv) => info.cmdline = argv,
                        Err(e) => errors.push(report_error(dir, &e)),
                    }
                    match read_environ(&mem.mm, &reader) {
                        Ok(env) => info.environment = env,
                        Err(e) => errors.push(report_error(dir, &e)),
                    }
                }
                // A missing pages file of an empty pagemap is fine; anything else is not.
                Err(e) if e.is_missing() && mem.pagemap.present_pages() == 0 => {}
                Err(e) => errors.push(report_error(dir, &e)),
            }
            info.memory = Some(memory_info(&mem));
        }
        Err(e) => errors.push(report_error(dir, &e)),
    }
    info
}

fn fd_info(f: &FileDesc) -> FdInfo {
    FdInfo {
        fd: f.fd,
        kind: f.kind.clone(),
        path: f.path.clone(),
        id: f.id,
        flags: f.flags,
        pos: f.pos,
    }
}

fn socket_info(f: &FileDesc) -> Option<SocketInfo> {
    let s = f.socket.as_ref()?;
    Some(SocketInfo {
        fd: f.fd,
        family: s.family.name(),
        protocol: s.protocol.clone(),
        kind: s.kind.clone(),
        state: s.state.clone(),
        inode: s.inode,
        local: s.local.clone(),
        local_port: s.local_port,
        remote: s.remote.clone(),
        remote_port: s.remote_port,
        peer_inode: s.peer_inode,
        backlog: s.backlog,
        send_buf: s.send_buf,
        recv_buf: s.recv_buf,
        in_queue: s.in_queue,
        out_queue: s.out_queue,
    })
}

fn memory_info(mem: &ProcessMemory) -> MemoryInfo {
    let page = mem.pagemap.page_size();
    MemoryInfo {
        exe: mem.exe.clone(),
        vma_bytes: mem.vma_bytes(),
        dumped_pages: mem.dumped_pages(),
        dumped_bytes: mem.dumped_bytes(),
        pages_file: mem.pagemap.pages_file_name(),
        arg_start: hex(mem.mm.mm_arg_start),
        arg_end: hex(mem.mm.mm_arg_end),
        env_start: hex(mem.mm.mm_env_start),
        env_end: hex(mem.mm.mm_env_end),
        vmas: mem
            .vmas
            .iter()
            .map(|v| VmaInfo {
                start: hex(v.start),
                end: hex(v.end),
                size: v.size(),
                prot: v.prot_string(),
                kind: v.kind.name().into(),
                file: v.file.clone(),
                pgoff: v.pgoff,
                dumped_pages: v.dumped_pages,
                dumped_bytes: v.dumped_pages * page,
                flags: v.flags,
                status: v.status,
            })
            .collect(),
        pagemap: mem
            .pagemap
            .runs()
            .iter()
            .map(|r| PagemapRun {
                vaddr: hex(r.vaddr),
                nr_pages: r.nr_pages,
                flags: [
                    (PE_PRESENT, "present"),
                    (PE_PARENT, "parent"),
                    (PE_LAZY, "lazy"),
                ]
                .iter()
                .filter(|(bit, _)| r.flags & bit != 0)
                .map(|(_, name)| name.to_string())
                .collect(),
            })
            .collect(),
    }
}

/// `pid`'s node with its descendants; `path` guards against ppid cycles.
fn tree_node(tree: &ProcessTree, pid: u32, path: &mut Vec<u32>) -> Option<TreeNode> {
    if path.contains(&pid) {
        return None;
    }
    let p = tree.get(pid)?;
    path.push(pid);
    let children = tree
        .children(pid)
        .iter()
        .filter_map(|c| tree_node(tree, c.pid, path))
        .collect();
    path.pop();
    Some(TreeNode {
        pid,
        comm: p.comm.clone(),
        children,
    })
}

fn mount_info(m: gpucr_criu_image::explore::Mount) -> MountInfo {
    MountInfo {
        ns_id: m.ns_id,
        mnt_id: m.mnt_id,
        parent_mnt_id: m.parent_mnt_id,
        mountpoint: m.mountpoint,
        fstype: m.fstype,
        source: m.source,
        root: m.root,
        options: m.options,
    }
}

fn stats(
    dir: &Path,
    images: &ImageDir,
    manifest: Option<&Manifest>,
    errors: &mut Vec<ReportError>,
) -> Stats {
    let mut read = |which: &str| match images.stats(which) {
        Ok(s) => s,
        Err(e) => {
            errors.push(report_error(dir, &e));
            None
        }
    };
    let dump = read("dump").and_then(|s| s.dump).map(|d| DumpStats {
        freezing_time_us: d.freezing_time,
        frozen_time_us: d.frozen_time,
        memdump_time_us: d.memdump_time,
        memwrite_time_us: d.memwrite_time,
        irmap_resolve_us: d.irmap_resolve,
        pages_scanned: d.pages_scanned,
        pages_skipped_parent: d.pages_skipped_parent,
        pages_written: d.pages_written,
        pages_lazy: d.pages_lazy,
        page_pipes: d.page_pipes,
        page_pipe_bufs: d.page_pipe_bufs,
        shpages_scanned: d.shpages_scanned,
        shpages_skipped_parent: d.shpages_skipped_parent,
        shpages_written: d.shpages_written,
    });
    let restore = read("restore")
        .and_then(|s| s.restore)
        .map(|r| RestoreStats {
            forking_time_us: r.forking_time,
            restore_time_us: r.restore_time,
            pages_compared: r.pages_compared,
            pages_skipped_cow: r.pages_skipped_cow,
            pages_restored: r.pages_restored,
        });
    let gpucr = manifest.map(|m| PhaseTimings {
        total_ms: m.timings.total_ms,
        events: m
            .timings
            .events
            .iter()
            .map(|e| TimedEventInfo {
                name: e.name.clone(),
                at_ms: e.at_ms,
            })
            .collect(),
        phases: spans(&m.timings.events)
            .into_iter()
            .map(|(from, to, ms)| Phase { from, to, ms })
            .collect(),
    });
    Stats {
        dump,
        restore,
        gpucr,
    }
}

/// Sizes of every file of the image (the manifest included).
fn sizes(source: &ImageSource) -> Sizes {
    let mut sizes = Sizes {
        total: 0,
        files: 0,
        cpu_pages: 0,
        gpu_raw: 0,
        gpu_stored: 0,
    };
    for (name, size) in source.file_sizes() {
        sizes.total += size;
        sizes.files += 1;
        if name.starts_with("pages-") && name.ends_with(".img") {
            sizes.cpu_pages += size;
        }
    }
    sizes
}

fn hex(v: u64) -> String {
    format!("{v:#x}")
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    fn report_of(dir: &Path) -> Report {
        let opts = Options {
            pid: None,
            page_size: 4096,
        };
        collect(dir, &opts).unwrap()
    }

    /// A manifest that is present but not a manifest damages the image; it is not
    /// reported as missing.
    #[test]
    fn a_manifest_that_cannot_be_read_is_damage_not_absence() {
        for (text, says) in [
            (
                "{\"format\": \"gpucr-image\", ",
                "malformed manifest at line 1",
            ),
            ("not json", "malformed manifest at line 1, column 2"),
            ("{\"format\": \"other\"}", "field `format` is \"other\""),
            (
                "{\"format\": \"gpucr-image\", \"format_version\": 99}",
                "field `format_version` is 99",
            ),
        ] {
            let dir = tempfile::tempdir().unwrap();
            fs::write(dir.path().join(MANIFEST_FILE), text).unwrap();
            let report = report_of(dir.path());
            assert!(report.image.manifest_damaged, "{text}");
            assert!(!report.image.complete);
            let reason = report.image.incomplete_reason.clone().unwrap();
            assert!(reason.starts_with("the image is damaged: "), "{reason}");
            assert!(
                reason.contains(MANIFEST_FILE) && reason.contains(says),
                "{reason}"
            );
            assert!(!reason.contains("no manifest"), "{reason}");
            assert!(report.errors.iter().any(|e| e.file == MANIFEST_FILE));
            let text = super::super::text::render(&report, &super::super::Views::default());
            assert!(!text.contains("no manifest"), "{text}");
            assert!(
                text.contains("unknown (the manifest cannot be read)"),
                "{text}"
            );

            // A failed dump's marker still makes it incomplete.
            fs::write(
                dir.path().join(INCOMPLETE_FILE),
                "{\"reason\": \"criu failed\"}",
            )
            .unwrap();
            let report = report_of(dir.path());
            assert!(!report.image.manifest_damaged);
            assert_eq!(
                report.image.incomplete_reason.as_deref(),
                Some("criu failed")
            );
        }
        // No manifest at all is still what it was.
        let dir = tempfile::tempdir().unwrap();
        let report = report_of(dir.path());
        assert!(!report.image.manifest_damaged);
        assert!(report
            .image
            .incomplete_reason
            .unwrap()
            .starts_with("no manifest (gpucr.json)"));
    }
}
