//! Open files of each process (`crit x fds`): fdinfo-<files_id>.img resolved through
//! files.img, plus the cwd and root from fs-<pid>.img.

use std::collections::HashMap;

use crate::dir::{FileTable, ImageDir};
use crate::error::Result;
use crate::explore::ps::ProcessTree;
use crate::explore::sockets::{self, Socket, SocketContext};
use crate::proto::{FdTypes, FileEntry, MemfdInodeEntry, TtyInfoEntry};

/// One open descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileDesc {
    pub fd: u32,
    /// The file object's id in files.img.
    pub id: u32,
    /// CRIU's file type name: "REG", "PIPE", "UNIXSK", "INETSK", "MEMFD", ...
    pub kind: String,
    /// What the descriptor refers to: a path for regular files, `pipe[N]`,
    /// `unix[INO (PEER) NAME]` (as `crit x fds` prints them), `memfd:NAME`,
    /// `tcp 127.0.0.1:80 LISTEN`, ...
    pub path: String,
    /// open(2) flags of the file, when recorded.
    pub flags: Option<u32>,
    /// The file offset, for regular files and memfds.
    pub pos: Option<u64>,
    /// The socket behind the descriptor, for sockets.
    pub socket: Option<Socket>,
}

/// The open files of one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessFiles {
    pub pid: u32,
    pub files: Vec<FileDesc>,
    pub cwd: Option<String>,
    pub root: Option<String>,
}

/// Everything file descriptions draw on, read once per image.
#[derive(Debug)]
pub struct FileContext {
    pub files: FileTable,
    pub memfds: HashMap<u64, MemfdInodeEntry>,
    pub ttys: HashMap<u32, TtyInfoEntry>,
    pub sockets: SocketContext,
}

impl FileContext {
    pub fn load(dir: &ImageDir) -> Result<FileContext> {
        Ok(FileContext {
            files: dir.files()?,
            memfds: dir.memfd_inodes()?,
            ttys: dir.tty_infos()?,
            sockets: SocketContext::load(dir)?,
        })
    }

    /// The path of regular file `id`, if there is one.
    pub fn reg_path(&self, id: u32) -> Option<String> {
        self.files
            .get(id)
            .and_then(|f| f.reg.as_ref())
            .map(|r| r.name.clone())
    }
}

/// The open files of every process with resources (zombies have none), in tree order.
pub fn explore_fds(
    dir: &ImageDir,
    tree: &ProcessTree,
    ctx: &FileContext,
) -> Result<Vec<ProcessFiles>> {
    let mut out = Vec::new();
    for (_, process) in tree.walk() {
        if !process.state.has_resources() {
            continue;
        }
        out.push(process_files(dir, ctx, process.pid)?);
    }
    Ok(out)
}

/// The open files of process `pid`.
pub fn process_files(dir: &ImageDir, ctx: &FileContext, pid: u32) -> Result<ProcessFiles> {
    let ids = dir.ids(pid)?;
    let mut files = Vec::new();
    for fd in dir.fdinfo(ids.files_id)? {
        files.push(describe_fd(
            dir,
            ctx,
            fd.fd,
            fd.id,
            fd.r#type,
            Some(fd.flags),
        )?);
    }
    let (cwd, root) = match dir.fs(pid) {
        Ok(fs) => (ctx.reg_path(fs.cwd_id), ctx.reg_path(fs.root_id)),
        Err(e) if e.is_missing() => (None, None),
        Err(e) => return Err(e),
    };
    Ok(ProcessFiles {
        pid,
        files,
        cwd,
        root,
    })
}

fn describe_fd(
    dir: &ImageDir,
    ctx: &FileContext,
    fd: u32,
    id: u32,
    kind: i32,
    fd_flags: Option<u32>,
) -> Result<FileDesc> {
    let kind_name = type_name(kind);
    let Some(file) = ctx.files.get(id) else {
        return Ok(FileDesc {
            fd,
            id,
            kind: kind_name.clone(),
            path: format!("{kind_name}.{id}"),
            flags: fd_flags,
            pos: None,
            socket: None,
        });
    };
    let socket = sockets::describe(dir, &ctx.sockets, file)?;
    let (path, flags, pos) = describe_file(ctx, file, socket.as_ref());
    Ok(FileDesc {
        fd,
        id,
        kind: kind_name,
        path,
        flags,
        pos,
        socket,
    })
}

/// The name of an fd_types value ("REG"), or "TYPE-N" for one this reader does not know.
pub fn type_name(kind: i32) -> String {
    match FdTypes::try_from(kind) {
        Ok(t) => t.as_str_name().to_string(),
        Err(_) => format!("TYPE-{kind}"),
    }
}

/// What a file object is, as (path or description, flags, position).
fn describe_file(
    ctx: &FileContext,
    file: &FileEntry,
    socket: Option<&Socket>,
) -> (String, Option<u32>, Option<u64>) {
    if let Some(reg) = &file.reg {
        return (reg.name.clone(), Some(reg.flags), Some(reg.pos));
    }
    if let Some(pipe) = &file.pipe {
        return (format!("pipe[{}]", pipe.pipe_id), Some(pipe.flags), None);
    }
    if let Some(fifo) = &file.fifo {
        let path = fifo.regf_id.and_then(|id| ctx.reg_path(id));
        let text = match path {
            Some(p) => format!("{p} (fifo[{}])", fifo.pipe_id),
            None => format!("fifo[{}]", fifo.pipe_id),
        };
        return (text, None, None);
    }
    if let Some(usk) = &file.usk {
        // `crit x fds` format.
        let name = sockets::unix_name(&usk.name, usk.name_dir.as_deref())
            .map(|n| format!(" {n}"))
            .unwrap_or_default();
        return (
            format!("unix[{} ({}){name}]", usk.ino, usk.peer),
            Some(usk.flags),
            None,
        );
    }
    if let Some(sk) = socket {
        let state = sk
            .state
            .as_deref()
            .map(|s| format!(" {s}"))
            .unwrap_or_default();
        let local = endpoint(sk.local.as_deref(), sk.local_port);
        let remote = match (sk.remote.as_deref(), sk.remote_port) {
            (None, None) => String::new(),
            (addr, port) => format!(" -> {}", endpoint(addr, port)),
        };
        return (
            format!("{} {local}{remote}{state}", sk.protocol),
            None,
            None,
        );
    }
    if let Some(memfd) = &file.memfd {
        let name = ctx
            .memfds
            .get(&u64::from(memfd.inode_id))
            .map(|i| i.name.clone())
            .unwrap_or_else(|| format!("inode {}", memfd.inode_id));
        return (format!("memfd:{name}"), Some(memfd.flags), Some(memfd.pos));
    }
    if let Some(efd) = &file.efd {
        return (
            format!("eventfd[counter={}]", efd.counter),
            Some(efd.flags),
            None,
        );
    }
    if let Some(epfd) = &file.epfd {
        let targets: Vec<String> = epfd.tfd.iter().map(|t| t.tfd.to_string()).collect();
        return (
            format!("eventpoll[fds={}]", targets.join(",")),
            Some(epfd.flags),
            None,
        );
    }
    if let Some(sgfd) = &file.sgfd {
        return (
            format!("signalfd[sigmask={:#x}]", sgfd.sigmask),
            Some(sgfd.flags),
            None,
        );
    }
    if let Some(tfd) = &file.tfd {
        return (
            format!("timerfd[clock={}]", tfd.clockid),
            Some(tfd.flags),
            None,
        );
    }
    if let Some(tty) = &file.tty {
        let text = match ctx.ttys.get(&tty.tty_info_id) {
            Some(info) => tty_name(info),
            None => format!("tty[info {}]", tty.tty_info_id),
        };
        return (text, Some(tty.flags), None);
    }
    if file.ext.is_some() {
        return (format!("ext[{}]", file.id), None, None);
    }
    (
        format!("{}.{}", type_name(file.r#type), file.id),
        None,
        None,
    )
}

fn endpoint(addr: Option<&str>, port: Option<u16>) -> String {
    let addr = addr.unwrap_or("*");
    match port {
        Some(p) if addr.contains(':') => format!("[{addr}]:{p}"),
        Some(p) => format!("{addr}:{p}"),
        None => addr.to_string(),
    }
}

fn tty_name(info: &TtyInfoEntry) -> String {
    let (major, minor) = (
        info.rdev >> 8 & 0xfff,
        (info.rdev & 0xff) | (info.rdev >> 12 & 0xfff00),
    );
    let kind = match info.r#type {
        1 => "pty",
        2 => "console",
        3 => "vt",
        4 => "ctty",
        5 => "ext-tty",
        6 => "serial",
        _ => "tty",
    };
    match &info.pty {
        Some(pty) => format!("{kind}[{major}:{minor}] index {}", pty.index),
        None => format!("{kind}[{major}:{minor}]"),
    }
}
