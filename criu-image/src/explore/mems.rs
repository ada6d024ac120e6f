//! Address spaces (`crit x mems`): each process's VMAs from mm-<pid>.img, with how much
//! of each was dumped according to pagemap-<pid>.img.

use crate::dir::ImageDir;
use crate::error::Result;
use crate::explore::fds::FileContext;
use crate::explore::ps::ProcessTree;
use crate::pagemap::Pagemap;
use crate::proto::MmEntry;

// VMA status bits (criu/include/image.h).
pub const VMA_AREA_REGULAR: u32 = 1 << 0;
pub const VMA_AREA_STACK: u32 = 1 << 1;
pub const VMA_AREA_VSYSCALL: u32 = 1 << 2;
pub const VMA_AREA_VDSO: u32 = 1 << 3;
pub const VMA_AREA_HEAP: u32 = 1 << 5;
pub const VMA_FILE_PRIVATE: u32 = 1 << 6;
pub const VMA_FILE_SHARED: u32 = 1 << 7;
pub const VMA_ANON_SHARED: u32 = 1 << 8;
pub const VMA_ANON_PRIVATE: u32 = 1 << 9;
pub const VMA_AREA_SYSVIPC: u32 = 1 << 10;
pub const VMA_AREA_SOCKET: u32 = 1 << 11;
pub const VMA_AREA_VVAR: u32 = 1 << 12;
pub const VMA_AREA_AIORING: u32 = 1 << 13;
pub const VMA_AREA_MEMFD: u32 = 1 << 14;
pub const VMA_AREA_GUARD: u32 = 1 << 16;
pub const VMA_EXT_PLUGIN: u32 = 1 << 27;

/// What a VMA maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmaKind {
    /// Private anonymous memory (heap, malloc arenas, ...).
    Anon,
    /// A file mapping (the file's contents are re-mapped on restore, not dumped,
    /// except for private pages the process wrote to).
    File,
    /// Shared anonymous memory (its pages are in a pagemap-shmem image).
    Shmem,
    Memfd,
    Stack,
    Heap,
    Vdso,
    Vvar,
    Vsyscall,
    SysvIpc,
    Socket,
    Aio,
    /// Memory owned by a CRIU plugin (a device mapping).
    Plugin,
    Other,
}

impl VmaKind {
    fn from_status(status: u32, flags: u32) -> VmaKind {
        const MAP_GROWSDOWN: u32 = 0x0100;
        if status & VMA_EXT_PLUGIN != 0 {
            VmaKind::Plugin
        } else if status & VMA_AREA_SYSVIPC != 0 {
            VmaKind::SysvIpc
        } else if status & VMA_AREA_MEMFD != 0 {
            VmaKind::Memfd
        } else if status & VMA_ANON_SHARED != 0 {
            VmaKind::Shmem
        } else if status & VMA_AREA_SOCKET != 0 {
            VmaKind::Socket
        } else if status & (VMA_FILE_PRIVATE | VMA_FILE_SHARED) != 0 {
            VmaKind::File
        } else if status & VMA_AREA_STACK != 0 || flags & MAP_GROWSDOWN != 0 {
            VmaKind::Stack
        } else if status & VMA_AREA_VSYSCALL != 0 {
            VmaKind::Vsyscall
        } else if status & VMA_AREA_VDSO != 0 {
            VmaKind::Vdso
        } else if status & VMA_AREA_VVAR != 0 {
            VmaKind::Vvar
        } else if status & VMA_AREA_AIORING != 0 {
            VmaKind::Aio
        } else if status & VMA_AREA_HEAP != 0 {
            VmaKind::Heap
        } else if status & VMA_ANON_PRIVATE != 0 {
            VmaKind::Anon
        } else {
            VmaKind::Other
        }
    }

    /// Lower-case name: "anon", "file", "shmem", "memfd", "stack", ...
    pub fn name(&self) -> &'static str {
        match self {
            VmaKind::Anon => "anon",
            VmaKind::File => "file",
            VmaKind::Shmem => "shmem",
            VmaKind::Memfd => "memfd",
            VmaKind::Stack => "stack",
            VmaKind::Heap => "heap",
            VmaKind::Vdso => "vdso",
            VmaKind::Vvar => "vvar",
            VmaKind::Vsyscall => "vsyscall",
            VmaKind::SysvIpc => "sysvipc",
            VmaKind::Socket => "socket",
            VmaKind::Aio => "aio",
            VmaKind::Plugin => "plugin",
            VmaKind::Other => "other",
        }
    }
}

/// One mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vma {
    pub start: u64,
    pub end: u64,
    /// PROT_* bits.
    pub prot: u32,
    /// MAP_* flags.
    pub flags: u32,
    /// CRIU's VMA_* status bits.
    pub status: u32,
    pub pgoff: u64,
    pub shmid: u64,
    pub kind: VmaKind,
    /// The mapped file's path (file and memfd mappings), when known.
    pub file: Option<String>,
    /// MAP_SHARED.
    pub shared: bool,
    /// Pages of this VMA whose contents are in the pages file.
    pub dumped_pages: u64,
}

impl Vma {
    pub fn size(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    /// "rwxp" / "r--s" as in /proc/PID/maps.
    pub fn prot_string(&self) -> String {
        let bit = |b: u32, c: char| if self.prot & b != 0 { c } else { '-' };
        let mut s = String::with_capacity(4);
        s.push(bit(1, 'r'));
        s.push(bit(2, 'w'));
        s.push(bit(4, 'x'));
        s.push(if self.shared { 's' } else { 'p' });
        s
    }
}

/// The address space of one process.
#[derive(Debug, Clone)]
pub struct ProcessMemory {
    pub pid: u32,
    /// The executable's path.
    pub exe: Option<String>,
    pub mm: MmEntry,
    pub vmas: Vec<Vma>,
    pub pagemap: Pagemap,
}

impl ProcessMemory {
    /// The bytes mapped.
    pub fn vma_bytes(&self) -> u64 {
        self.vmas.iter().map(Vma::size).sum()
    }

    /// Pages whose contents are in the pages file.
    pub fn dumped_pages(&self) -> u64 {
        self.pagemap.present_pages()
    }

    pub fn dumped_bytes(&self) -> u64 {
        self.pagemap.present_bytes()
    }
}

/// The memory of every process with resources, in tree order.
pub fn explore_mems(
    dir: &ImageDir,
    tree: &ProcessTree,
    ctx: &FileContext,
) -> Result<Vec<ProcessMemory>> {
    let mut out = Vec::new();
    for (_, process) in tree.walk() {
        if process.state.has_resources() {
            out.push(process_memory(dir, ctx, process.pid)?);
        }
    }
    Ok(out)
}

/// The memory of process `pid`.
pub fn process_memory(dir: &ImageDir, ctx: &FileContext, pid: u32) -> Result<ProcessMemory> {
    let mm = dir.mm(pid)?;
    let pagemap = dir.pagemap(pid)?;
    let mut vmas = Vec::with_capacity(mm.vmas.len());
    for v in &mm.vmas {
        const MAP_SHARED: u32 = 0x01;
        let kind = VmaKind::from_status(v.status, v.flags);
        let file = match kind {
            VmaKind::File | VmaKind::Memfd => u32::try_from(v.shmid).ok().and_then(|id| {
                let entry = ctx.files.get(id)?;
                match (&entry.reg, &entry.memfd) {
                    (Some(reg), _) => Some(reg.name.clone()),
                    (None, Some(m)) => ctx
                        .memfds
                        .get(&u64::from(m.inode_id))
                        .map(|i| format!("memfd:{}", i.name)),
                    (None, None) => None,
                }
            }),
            _ => None,
        };
        vmas.push(Vma {
            start: v.start,
            end: v.end,
            prot: v.prot,
            flags: v.flags,
            status: v.status,
            pgoff: v.pgoff,
            shmid: v.shmid,
            kind,
            file,
            shared: v.flags & MAP_SHARED != 0,
            dumped_pages: pagemap.present_pages_in(v.start, v.end),
        });
    }
    let exe = ctx.reg_path(mm.exe_file_id);
    Ok(ProcessMemory {
        pid,
        exe,
        mm,
        vmas,
        pagemap,
    })
}
