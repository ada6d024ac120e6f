//! The text views of a [`Report`]: a summary, then the sections the flags ask for, each
//! a tree as checkpointctl prints them.

use super::model::*;
use super::tree::Node;
use super::verify::Status;
use crate::units::size;

/// Which sections to show after the summary and the process tree.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Views {
    /// argv instead of comm in the process tree.
    pub cmdline: bool,
    /// The environment under each process in the tree.
    pub environment: bool,
    pub files: bool,
    pub sockets: bool,
    pub mounts: bool,
    pub memory: bool,
    pub gpu: bool,
    pub stats: bool,
}

impl Views {
    /// Every section.
    pub fn all() -> Views {
        Views {
            cmdline: true,
            environment: true,
            files: true,
            sockets: true,
            mounts: true,
            memory: true,
            gpu: true,
            stats: true,
        }
    }
}

/// The summary, the process tree and the chosen sections.
pub fn render(report: &Report, views: &Views) -> String {
    let mut root = Node::new(format!("Image {}", report.image.dir));
    container(&mut root, report);
    summary(&mut root, report);
    process_tree(&mut root, report, views);
    if views.files {
        files(&mut root, report);
    }
    if views.sockets {
        sockets(&mut root, report);
    }
    if views.mounts {
        mounts(&mut root, report);
    }
    if views.memory {
        memory(&mut root, report);
    }
    if views.gpu {
        gpu(&mut root, report);
    }
    if views.stats {
        stats(&mut root, report);
    }
    root.render()
}

/// The result of `--verify`: one line per problem, then the verdict.
pub fn render_verify(report: &Report, verify: &VerifyReport, status: Status) -> String {
    let mut out = String::new();
    for p in &verify.problems {
        out.push_str(&p.message);
        out.push('\n');
    }
    let detail = match status {
        Status::Intact if verify.files_checked == 0 && report.archive.is_some() => format!(
            "no gpucr manifest (checkpointed without gpucr): {} CRIU images are well formed",
            verify.images_checked
        ),
        Status::Intact => {
            let by_size = match verify.files_size_only {
                0 => String::new(),
                n => format!(
                    " ({n} memory pages file{} by size only: dumped with --no-page-checksums)",
                    if n == 1 { "" } else { "s" }
                ),
            };
            let mut text = format!(
                "{} files ({}) match the manifest{by_size}; {} CRIU images are well formed",
                verify.files_checked,
                size(verify.bytes_checked),
                verify.images_checked
            );
            if verify.gpu_chunks_checked > 0 {
                text.push_str(&format!(
                    "; {} GPU memory chunks match their checksums",
                    verify.gpu_chunks_checked
                ));
            }
            text
        }
        Status::Damaged | Status::Incomplete => format!(
            "{} problem{} found",
            verify.problems.len(),
            if verify.problems.len() == 1 { "" } else { "s" }
        ),
    };
    out.push_str(&format!(
        "{}: {}: {detail}\n",
        report.image.dir,
        status.name()
    ));
    out
}

/// The container and the archive, for a container checkpoint archive.
fn container(root: &mut Node, r: &Report) {
    let (Some(c), Some(a)) = (&r.container, &r.archive) else {
        return;
    };
    let node = root.push(Node::new(format!(
        "Container: {} ({})",
        if c.container_name.is_empty() {
            "unnamed"
        } else {
            &c.container_name
        },
        c.engine
    )));
    let or_unknown = |v: &str| {
        if v.is_empty() {
            "unknown".to_string()
        } else {
            v.to_string()
        }
    };
    node.leaf(format!("ID: {}", or_unknown(&c.id)));
    node.leaf(format!("Image: {}", or_unknown(&c.image)));
    node.leaf(format!("Runtime: {}", or_unknown(&c.runtime)));
    node.leaf(format!("Created: {}", or_unknown(&c.created)));
    if let Some(at) = &c.checkpointed {
        node.leaf(format!("Checkpointed: {at}"));
    }
    if let (Some(pod), ns) = (&c.pod, &c.namespace) {
        node.leaf(format!(
            "Pod: {pod} (namespace {})",
            ns.as_deref().unwrap_or("unknown")
        ));
    }
    if let Some(ip) = &c.ip {
        node.leaf(format!("IP: {ip}"));
    }
    let s = &c.checkpoint_size;
    node.leaf(format!(
        "Checkpoint: {} (memory pages {}, GPU memory {}), root filesystem changes {}",
        size(s.total_size),
        size(s.memory_pages_size),
        size(s.gpu_memory_size),
        size(s.root_fs_diff_size)
    ));
    node.leaf(format!(
        "Archive: {} ({} compression, {} members)",
        a.path,
        a.compression,
        a.members.len()
    ));
}

fn summary(root: &mut Node, r: &Report) {
    let i = &r.image;
    match &i.incomplete_reason {
        None => root.leaf("Complete: yes"),
        Some(reason) => root.leaf(format!("Complete: no ({reason})")),
    }
    let versions = match (&i.gpucr_version, &i.criu_version) {
        (Some(g), Some(c)) => format!("gpucr {g}, CRIU {c}"),
        _ if i.manifest_damaged => "gpucr: unknown (the manifest cannot be read)".to_string(),
        _ => "gpucr: unknown (no manifest)".to_string(),
    };
    let images = i
        .criu_image_version
        .map(|v| format!(" (CRIU images v{v})"))
        .unwrap_or_default();
    root.leaf(format!("Versions: {versions}{images}"));
    if let (Some(created), Some(host)) = (&i.created, &i.host) {
        root.leaf(format!(
            "Created: {created} on {} (Linux {}, {})",
            host.hostname, host.kernel, host.arch
        ));
    }
    if let Some(t) = &i.target {
        let cmd = if t.cmdline.is_empty() {
            t.comm.clone()
        } else {
            t.cmdline.join(" ")
        };
        root.leaf(format!("Target: pid {} ({}): {cmd}", t.pid, t.comm));
    }
    if let Some(options) = &i.options {
        dump_options(root, options);
    }
    let mut backend = format!("Backend: {}", i.backend.as_deref().unwrap_or("unknown"));
    if !i.criu_plugins.is_empty() {
        backend.push_str(&format!(" (CRIU plugins: {})", i.criu_plugins.join(", ")));
    }
    root.leaf(backend);
    root.leaf(format!(
        "Processes: {}, threads: {}",
        i.processes, i.threads
    ));
    let s = &i.sizes;
    let size_node = root.push(Node::new(format!(
        "Size: {} in {} files",
        size(s.total),
        s.files
    )));
    size_node.leaf(format!("CPU memory pages: {}", size(s.cpu_pages)));
    if r.gpu.recorded {
        // With CUDA's host staging the driver moved the device memory into the
        // process's own memory, so it is in the CPU memory pages, not in gpu/.
        let host_staged = r
            .gpu
            .tasks
            .iter()
            .filter(|t| t.state.staging.as_deref() == Some(crate::gpu::cuda::Staging::Host.name()))
            .count();
        let staged = match host_staged {
            0 => String::new(),
            n => format!(
                " (the device memory of {n} CUDA task{} is in the CPU memory pages: host staging)",
                if n == 1 { "" } else { "s" }
            ),
        };
        size_node.leaf(format!(
            "GPU memory: {} raw, {} stored{staged}",
            size(r.gpu.memory_raw),
            size(r.gpu.memory_stored)
        ));
    } else {
        size_node.leaf("GPU memory: none recorded");
    }
}

/// "Options: ..." (the CRIU options the dump was made with) and, below it, the
/// options of its `--criu-config` file.
fn dump_options(root: &mut Node, o: &crate::image::manifest::DumpOptions) {
    if o.set_by_engine {
        root.leaf("Options: the container engine's (its CRIU was configured by the engine)");
        return;
    }
    let mut words: Vec<String> = [
        (o.leave_running, "leave-running"),
        (o.flags.tcp_established, "tcp-established"),
        (o.flags.shell_job, "shell-job"),
        (o.flags.ext_unix_sk, "ext-unix-sk"),
        (o.flags.file_locks, "file-locks"),
        (o.mount_namespace, "own mount namespace"),
        (o.no_page_checksums, "no page checksums"),
    ]
    .into_iter()
    .filter(|(on, _)| *on)
    .map(|(_, word)| word.to_owned())
    .collect();
    words.push(format!("network lock {}", o.network_lock));
    let node = root.push(Node::new(format!("Options: {}", words.join(", "))));
    if let Some(config) = &o.criu_config {
        let options = if config.options.is_empty() {
            "no options".to_owned()
        } else {
            config.options.join("; ")
        };
        node.leaf(format!("CRIU config {}: {options}", config.file));
    }
}

fn process_label(p: &ProcessInfo, views: &Views) -> String {
    let name = match (&p.cmdline, views.cmdline) {
        (Some(argv), true) if !argv.is_empty() => argv.join(" "),
        _ => p.comm.clone(),
    };
    let mut label = format!("[{}] {name}", p.pid);
    if p.threads.len() > 1 {
        label.push_str(&format!(" ({} threads)", p.threads.len()));
    }
    if p.state != "alive" {
        label.push_str(&format!(" <{}>", p.state));
    }
    label
}

fn process_tree(root: &mut Node, r: &Report, views: &Views) {
    let section = root.push(Node::new("Process tree"));
    if r.process_tree.is_empty() {
        section.leaf("(no processes could be read)");
    }
    for node in &r.process_tree {
        section.push(tree_node(node, r, views));
    }
}

fn tree_node(node: &TreeNode, r: &Report, views: &Views) -> Node {
    let process = r.processes.iter().find(|p| p.pid == node.pid);
    let mut out = match process {
        Some(p) => Node::new(process_label(p, views)),
        None => Node::new(format!("[{}] {}", node.pid, node.comm)),
    };
    if views.environment {
        if let Some(p) = process {
            let mut env = Node::new("Environment variables");
            match &p.environment {
                Some(vars) if vars.is_empty() => env.leaf("(empty)"),
                Some(vars) => vars.iter().for_each(|v| env.leaf(v.clone())),
                None => env.leaf("(not in the image)"),
            }
            out.push(env);
        }
    }
    for child in &node.children {
        out.push(tree_node(child, r, views));
    }
    out
}

fn files(root: &mut Node, r: &Report) {
    let section = root.push(Node::new("Open files"));
    for p in &r.processes {
        let Some(list) = &p.files else { continue };
        let node = section.push(Node::new(format!("[{}] {}", p.pid, p.comm)));
        for f in list {
            node.leaf(format!("[{} {}] {}", f.kind, f.fd, f.path));
        }
        if let Some(cwd) = &p.cwd {
            node.leaf(format!("[cwd] {cwd}"));
        }
        if let Some(root_dir) = &p.root {
            node.leaf(format!("[root] {root_dir}"));
        }
    }
}

fn sockets(root: &mut Node, r: &Report) {
    let section = root.push(Node::new("Open sockets"));
    for p in r.processes.iter().filter(|p| !p.sockets.is_empty()) {
        let node = section.push(Node::new(format!("[{}] {}", p.pid, p.comm)));
        for s in &p.sockets {
            node.leaf(socket_line(s));
        }
    }
    if section.children.is_empty() {
        section.leaf("(none)");
    }
}

fn socket_line(s: &SocketInfo) -> String {
    let proto = match s.family.as_str() {
        "unix" => format!("UNIX ({})", s.kind),
        "inet" | "inet6" => {
            let v = if s.family == "inet6" { "6" } else { "" };
            format!("{}{v}", s.protocol.to_uppercase())
        }
        "netlink" => format!("NETLINK ({})", s.protocol),
        other => other.to_uppercase(),
    };
    let state = s
        .state
        .as_deref()
        .map(|st| format!(" {st}"))
        .unwrap_or_default();
    let endpoint = |addr: &Option<String>, port: Option<u16>| {
        let a = addr.as_deref().unwrap_or("*");
        match port {
            Some(p) if a.contains(':') => format!("[{a}]:{p}"),
            Some(p) => format!("{a}:{p}"),
            None => a.to_string(),
        }
    };
    let mut text = format!("[fd {}] {proto}{state}", s.fd);
    match s.family.as_str() {
        "unix" => {
            text.push_str(&format!(" {}", s.local.as_deref().unwrap_or("(unnamed)")));
            if let Some(peer) = s.peer_inode {
                text.push_str(&format!(" ino {} -> peer {peer}", s.inode));
            } else {
                text.push_str(&format!(" ino {}", s.inode));
            }
        }
        _ => {
            text.push_str(&format!(" {}", endpoint(&s.local, s.local_port)));
            if s.remote.is_some() || s.remote_port.is_some() {
                text.push_str(&format!(" -> {}", endpoint(&s.remote, s.remote_port)));
            }
        }
    }
    text.push_str(&format!(
        " (↑ {} ↓ {}",
        size(u64::from(s.send_buf)),
        size(u64::from(s.recv_buf))
    ));
    if s.in_queue.is_some() || s.out_queue.is_some() {
        text.push_str(&format!(
            "; queued in {} out {}",
            size(s.in_queue.unwrap_or(0)),
            size(s.out_queue.unwrap_or(0))
        ));
    }
    text.push(')');
    text
}

fn mounts(root: &mut Node, r: &Report) {
    let section = root.push(Node::new("Mounts"));
    match &r.mounts {
        None => section.leaf("(not recorded: the tree shared the host's mount namespace)"),
        Some(list) => {
            for m in list {
                section.leaf(format!(
                    "{} {} {} ({})",
                    m.mountpoint, m.fstype, m.source, m.options
                ));
            }
        }
    }
}

fn memory(root: &mut Node, r: &Report) {
    let section = root.push(Node::new("Memory"));
    for p in &r.processes {
        let Some(m) = &p.memory else { continue };
        let node = section.push(Node::new(format!(
            "[{}] {}: {} VMAs, {} mapped, {} dumped ({} pages in {})",
            p.pid,
            p.comm,
            m.vmas.len(),
            size(m.vma_bytes),
            size(m.dumped_bytes),
            m.dumped_pages,
            m.pages_file
        )));
        if let Some(exe) = &m.exe {
            node.leaf(format!("exe {exe}"));
        }
        for v in &m.vmas {
            let what = match (&v.file, v.kind.as_str()) {
                (Some(f), _) if v.pgoff > 0 => format!("{f} + {:#x}", v.pgoff),
                (Some(f), _) => f.clone(),
                (None, "anon") => String::new(),
                (None, kind) => format!("[{kind}]"),
            };
            let dumped = if v.dumped_bytes > 0 {
                format!(" dumped {}", size(v.dumped_bytes))
            } else {
                String::new()
            };
            node.leaf(
                format!(
                    "{:>14}-{:<14} {} {:>10}{dumped} {what}",
                    v.start.trim_start_matches("0x"),
                    v.end.trim_start_matches("0x"),
                    v.prot,
                    size(v.size)
                )
                .trim_end()
                .to_string(),
            );
        }
    }
}

fn gpu(root: &mut Node, r: &Report) {
    let g = &r.gpu;
    let section = root.push(Node::new("GPU"));
    section.leaf(format!(
        "Backend: {}",
        g.backend.as_deref().unwrap_or("unknown")
    ));
    if !g.recorded {
        section.leaf(g.note.clone());
        return;
    }
    let mut memory = format!(
        "Memory: {} raw, {} stored",
        size(g.memory_raw),
        size(g.memory_stored)
    );
    if let Some(ratio) = g.compression_ratio {
        memory.push_str(&format!(" (compression ratio {ratio:.2})"));
    }
    if let (Some(chunk), Some(codec)) = (g.chunk_size, &g.compression) {
        memory.push_str(&format!(", {} chunks, {codec}", size(chunk)));
    }
    if let Some(secs) = g.transfer_seconds {
        memory.push_str(&format!(", copied in {:.1} ms", secs * 1000.0));
    }
    section.leaf(memory);
    let devices = section.push(Node::new("Devices"));
    for d in &g.devices {
        devices.leaf(format!("GPU {}: {}", d.gpu_id, totals_text(&d.totals)));
    }
    let kinds = section.push(Node::new("Buffers by kind"));
    for k in &g.by_kind {
        kinds.leaf(format!("{}: {}", k.kind, totals_text(&k.totals)));
    }
    let tasks = section.push(Node::new("Tasks"));
    for t in &g.tasks {
        let task = tasks.push(Node::new(format!(
            "[{}] {}: {} buffers, {} (host pid {})",
            t.pid,
            t.device_path,
            t.buffers,
            size(t.bytes),
            t.host_pid
        )));
        if !t.gpus.is_empty() {
            task.leaf(format!("GPUs: {}", t.gpus.join(", ")));
        }
        for f in &t.device_files {
            task.leaf(format!("device file {:#x}: {} ({})", f.id, f.path, f.role));
        }
        task.leaf(format!(
            "state: {} ({}, {})",
            t.state.file,
            t.state.format,
            size(t.state.size)
        ));
        if let Some(staging) = &t.state.staging {
            task.leaf(format!("CUDA memory staging: {staging}"));
        }
        for o in &t.operations {
            task.leaf(format!(
                "{} at {:.1} ms, {:.1} ms: {}",
                o.name, o.start_ms, o.duration_ms, o.result
            ));
        }
    }
    let buffers = section.push(Node::new("Buffers"));
    for b in &g.buffers {
        let mut line = format!(
            "[{}/{}] {} on GPU {}: {}",
            b.task,
            b.buffer,
            b.kind,
            b.gpu_id,
            size(b.size)
        );
        if let (Some(stored), Some(chunks)) = (b.stored_bytes, b.chunks) {
            line.push_str(&format!(
                ", stored {} ({chunks} chunks: {} zero, {} raw, {} compressed)",
                size(stored),
                b.zero_chunks.unwrap_or(0),
                b.raw_chunks.unwrap_or(0),
                b.compressed_chunks.unwrap_or(0)
            ));
        }
        buffers.leaf(line);
    }
    if !g.topology_gpus.is_empty() {
        let topology = section.push(Node::new(format!(
            "Topology recorded: {} GPU(s)",
            g.topology_gpus.len()
        )));
        for id in &g.topology_gpus {
            topology.leaf(id.clone());
        }
    }
    section.leaf(g.note.clone());
}

fn stats(root: &mut Node, r: &Report) {
    let section = root.push(Node::new("Statistics"));
    match &r.stats.dump {
        None => section.leaf("CRIU dump statistics: (none: no stats-dump)"),
        Some(d) => {
            let node = section.push(Node::new("CRIU dump statistics"));
            node.leaf(format!("Freezing time: {}", usec(d.freezing_time_us)));
            node.leaf(format!("Frozen time: {}", usec(d.frozen_time_us)));
            node.leaf(format!("Memdump time: {}", usec(d.memdump_time_us)));
            node.leaf(format!("Memwrite time: {}", usec(d.memwrite_time_us)));
            node.leaf(format!("Pages scanned: {}", d.pages_scanned));
            node.leaf(format!("Pages written: {}", d.pages_written));
            if d.pages_skipped_parent > 0 {
                node.leaf(format!(
                    "Pages skipped (in parent): {}",
                    d.pages_skipped_parent
                ));
            }
            if d.pages_lazy > 0 {
                node.leaf(format!("Pages lazy: {}", d.pages_lazy));
            }
        }
    }
    if let Some(rs) = &r.stats.restore {
        let node = section.push(Node::new("CRIU restore statistics"));
        node.leaf(format!("Forking time: {}", usec(rs.forking_time_us)));
        node.leaf(format!("Restore time: {}", usec(rs.restore_time_us)));
        node.leaf(format!("Pages compared: {}", rs.pages_compared));
        node.leaf(format!("Pages skipped (COW): {}", rs.pages_skipped_cow));
        if let Some(n) = rs.pages_restored {
            node.leaf(format!("Pages restored: {n}"));
        }
    }
    if let Some(t) = &r.stats.gpucr {
        let node = section.push(Node::new(format!(
            "gpucr dump phases ({:.1} ms in all)",
            t.total_ms
        )));
        for p in &t.phases {
            node.leaf(format!("{:>9.1} ms  {} -> {}", p.ms, p.from, p.to));
        }
    }
}

/// Microseconds as milliseconds: "12.345 ms".
fn usec(us: u32) -> String {
    format!("{:.3} ms", f64::from(us) / 1000.0)
}

/// "N buffers, SIZE (SIZE stored)".
fn totals_text(t: &BufferTotals) -> String {
    format!(
        "{} buffers, {} ({} stored)",
        t.buffers,
        size(t.bytes),
        size(t.stored_bytes)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(size(1023), "1023 B");
        assert_eq!(size(16 << 20), "16.0 MiB");
        assert_eq!(usec(827), "0.827 ms");
    }

    #[test]
    fn socket_lines_show_addresses_states_and_queues() {
        let s = SocketInfo {
            fd: 13,
            family: "inet".into(),
            protocol: "tcp".into(),
            kind: "stream".into(),
            state: Some("ESTABLISHED".into()),
            inode: 7,
            local: Some("127.0.0.1".into()),
            local_port: Some(44534),
            remote: Some("127.0.0.1".into()),
            remote_port: Some(47123),
            peer_inode: None,
            backlog: Some(0),
            send_buf: 16384,
            recv_buf: 131072,
            in_queue: Some(5),
            out_queue: Some(0),
        };
        assert_eq!(
            socket_line(&s),
            "[fd 13] TCP ESTABLISHED 127.0.0.1:44534 -> 127.0.0.1:47123 (↑ 16.0 KiB ↓ 128.0 KiB; \
             queued in 5 B out 0 B)"
        );
    }
}
