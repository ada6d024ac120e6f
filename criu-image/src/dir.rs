//! Typed access to the images of one CRIU dump directory.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use prost::{Message, Name};

use crate::error::{ImageError, Result};
use crate::framing::{read_all_of, read_one_of, ImageFile};
use crate::magic;
use crate::pagemap::Pagemap;
use crate::pages::PageReader;
use crate::proto::{
    CoreEntry, EventfdFileEntry, EventpollFileEntry, ExtFileEntry, FdTypes, FdinfoEntry, FifoEntry,
    FileEntry, FsEntry, InetSkEntry, InventoryEntry, MemfdInodeEntry, MmEntry, MntEntry,
    NetlinkSkEntry, PacketSockEntry, PipeEntry, PstreeEntry, RegFileEntry, SignalfdEntry,
    SkPacketEntry, StatsEntry, TaskKobjIdsEntry, TcpStreamEntry, TimerfdEntry, TtyFileEntry,
    TtyInfoEntry, UnixSkEntry,
};
use crate::store::{MemoryFiles, Source};

/// One CRIU image directory. Nothing is read until asked for.
#[derive(Debug, Clone)]
pub struct ImageDir {
    root: PathBuf,
    page_size: u64,
    /// Files read from memory instead of `root` (an archive read as a stream).
    memory: Option<Arc<MemoryFiles>>,
}

/// Every file object of the dump (files.img), by id.
#[derive(Debug, Clone, Default)]
pub struct FileTable {
    files: HashMap<u32, FileEntry>,
}

impl FileTable {
    pub fn get(&self, id: u32) -> Option<&FileEntry> {
        self.files.get(&id)
    }

    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &FileEntry> {
        self.files.values()
    }

    fn insert(&mut self, entry: FileEntry) {
        self.files.insert(entry.id, entry);
    }
}

impl ImageDir {
    /// The images in `root`, dumped on a host whose page size was `page_size` bytes
    /// (CRIU does not record it; pass the dumping host's `sysconf(_SC_PAGESIZE)`).
    pub fn new(root: impl Into<PathBuf>, page_size: u64) -> ImageDir {
        assert!(
            page_size.is_power_of_two(),
            "page size {page_size} is not a power of two"
        );
        ImageDir {
            root: root.into(),
            page_size,
            memory: None,
        }
    }

    /// The images held in `files`, named in errors as if they were in `root`.
    pub fn in_memory(root: impl Into<PathBuf>, page_size: u64, files: Arc<MemoryFiles>) -> Self {
        ImageDir {
            memory: Some(files),
            ..ImageDir::new(root, page_size)
        }
    }

    /// Open the file `name` (from memory when the images are held there).
    pub fn open(&self, name: &str) -> Result<Source> {
        let path = self.file(name);
        match &self.memory {
            Some(files) => match files.get(name) {
                Some(f) => Ok(Source::Memory(f.clone())),
                None => Err(ImageError::missing(&path)),
            },
            None => crate::store::open_regular(&path)
                .map(Source::File)
                .map_err(|e| ImageError::io(&path, 0, e)),
        }
    }

    /// Open the image `name`, positioned after its magic(s).
    pub fn open_image(&self, name: &str) -> Result<ImageFile> {
        ImageFile::from_source(&self.file(name), self.open(name)?)
    }

    /// The size of the file `name`.
    pub fn file_size(&self, name: &str) -> io::Result<u64> {
        match &self.memory {
            Some(files) => files
                .get(name)
                .map(|f| f.size())
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound)),
            None => Ok(self.file(name).metadata()?.len()),
        }
    }

    fn read_all<M: Message + Name + Default>(&self, name: &str, magic: u32) -> Result<Vec<M>> {
        read_all_of(self.open_image(name)?.expect_magic(magic)?)
    }

    fn read_one<M: Message + Name + Default>(&self, name: &str, magic: u32) -> Result<M> {
        read_one_of(self.open_image(name)?.expect_magic(magic)?)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    /// The path of the image `name`.
    pub fn file(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    pub fn exists(&self, name: &str) -> bool {
        match &self.memory {
            Some(files) => files.contains(name),
            None => self.file(name).is_file(),
        }
    }

    pub fn inventory(&self) -> Result<InventoryEntry> {
        self.read_one("inventory.img", magic::INVENTORY)
    }

    /// The processes, in the order of pstree.img (parents before children).
    pub fn pstree(&self) -> Result<Vec<PstreeEntry>> {
        self.read_all("pstree.img", magic::PSTREE)
    }

    /// The core image of thread `tid`.
    pub fn core(&self, tid: u32) -> Result<CoreEntry> {
        self.read_one(&format!("core-{tid}.img"), magic::CORE)
    }

    /// The kernel object ids of process `pid`: ids-<pid>.img, or the copy in its core
    /// image (older CRIU).
    pub fn ids(&self, pid: u32) -> Result<TaskKobjIdsEntry> {
        let name = format!("ids-{pid}.img");
        let path = self.file(&name);
        match self.read_one(&name, magic::IDS) {
            Err(e) if e.is_missing() => self
                .core(pid)?
                .ids
                .ok_or_else(|| ImageError::missing(&path)),
            other => other,
        }
    }

    pub fn mm(&self, pid: u32) -> Result<MmEntry> {
        self.read_one(&format!("mm-{pid}.img"), magic::MM)
    }

    /// The pagemap of process `pid`.
    pub fn pagemap(&self, pid: u32) -> Result<Pagemap> {
        self.pagemap_named(&format!("pagemap-{pid}.img"))
    }

    /// A pagemap image by file name (`pagemap-shmem-<id>.img` too).
    pub fn pagemap_named(&self, name: &str) -> Result<Pagemap> {
        Pagemap::from_image(self.open_image(name)?, self.page_size)
    }

    /// The dumped memory of process `pid`.
    pub fn memory(&self, pid: u32) -> Result<PageReader> {
        self.page_reader(self.pagemap(pid)?)
    }

    /// The dumped memory that `pagemap` describes.
    pub fn page_reader(&self, pagemap: Pagemap) -> Result<PageReader> {
        let name = pagemap.pages_file_name();
        PageReader::from_source(self.file(&name), self.open(&name)?, pagemap)
    }

    /// The open descriptors of the fd table `files_id` (from ids).
    pub fn fdinfo(&self, files_id: u32) -> Result<Vec<FdinfoEntry>> {
        self.read_all(&format!("fdinfo-{files_id}.img"), magic::FDINFO)
    }

    pub fn fs(&self, pid: u32) -> Result<FsEntry> {
        self.read_one(&format!("fs-{pid}.img"), magic::FS)
    }

    /// Every file object: files.img, or the per-type images of older CRIU versions.
    pub fn files(&self) -> Result<FileTable> {
        let mut table = FileTable::default();
        if self.exists("files.img") {
            for entry in self.read_all::<FileEntry>("files.img", magic::FILES)? {
                table.insert(entry);
            }
            return Ok(table);
        }
        self.legacy::<RegFileEntry>("reg-files.img", magic::REG_FILES, &mut table, |e| {
            file(FdTypes::Reg, e.id, |f| f.reg = Some(e))
        })?;
        self.legacy::<PipeEntry>("pipes.img", magic::PIPES, &mut table, |e| {
            file(FdTypes::Pipe, e.id, |f| f.pipe = Some(e))
        })?;
        self.legacy::<FifoEntry>("fifo.img", magic::FIFO, &mut table, |e| {
            file(FdTypes::Fifo, e.id, |f| f.fifo = Some(e))
        })?;
        self.legacy::<UnixSkEntry>("unixsk.img", magic::UNIXSK, &mut table, |e| {
            file(FdTypes::Unixsk, e.id, |f| f.usk = Some(e))
        })?;
        self.legacy::<InetSkEntry>("inetsk.img", magic::INETSK, &mut table, |e| {
            file(FdTypes::Inetsk, e.id, |f| f.isk = Some(e))
        })?;
        self.legacy::<PacketSockEntry>("packetsk.img", magic::PACKETSK, &mut table, |e| {
            file(FdTypes::Packetsk, e.id, |f| f.psk = Some(e))
        })?;
        self.legacy::<NetlinkSkEntry>("netlinksk.img", magic::NETLINK_SK, &mut table, |e| {
            file(FdTypes::Netlinksk, e.id, |f| f.nlsk = Some(e))
        })?;
        self.legacy::<EventfdFileEntry>("eventfd.img", magic::EVENTFD_FILE, &mut table, |e| {
            file(FdTypes::Eventfd, e.id, |f| f.efd = Some(e))
        })?;
        self.legacy::<EventpollFileEntry>(
            "eventpoll.img",
            magic::EVENTPOLL_FILE,
            &mut table,
            |e| file(FdTypes::Eventpoll, e.id, |f| f.epfd = Some(e)),
        )?;
        self.legacy::<SignalfdEntry>("signalfd.img", magic::SIGNALFD, &mut table, |e| {
            file(FdTypes::Signalfd, e.id, |f| f.sgfd = Some(e))
        })?;
        self.legacy::<TimerfdEntry>("timerfd.img", magic::TIMERFD, &mut table, |e| {
            file(FdTypes::Timerfd, e.id, |f| f.tfd = Some(e))
        })?;
        self.legacy::<TtyFileEntry>("tty.img", magic::TTY_FILES, &mut table, |e| {
            file(FdTypes::Tty, e.id, |f| f.tty = Some(e))
        })?;
        self.legacy::<ExtFileEntry>("ext-files.img", magic::EXT_FILES, &mut table, |e| {
            file(FdTypes::Ext, e.id, |f| f.ext = Some(e))
        })?;
        Ok(table)
    }

    /// memfd inodes (memfd.img) by inode id; empty when there is none.
    pub fn memfd_inodes(&self) -> Result<HashMap<u64, MemfdInodeEntry>> {
        Ok(self
            .optional_all::<MemfdInodeEntry>("memfd.img", magic::MEMFD_INODE)?
            .into_iter()
            .map(|e| (e.inode_id, e))
            .collect())
    }

    /// Terminals (tty-info.img) by id; empty when there is none.
    pub fn tty_infos(&self) -> Result<HashMap<u32, TtyInfoEntry>> {
        Ok(self
            .optional_all::<TtyInfoEntry>("tty-info.img", magic::TTY_INFO)?
            .into_iter()
            .map(|e| (e.id, e))
            .collect())
    }

    /// The TCP stream state of the socket with inode `ino`, if it was dumped
    /// (established connections only).
    pub fn tcp_stream(&self, ino: u32) -> Result<Option<TcpStreamEntry>> {
        match self.read_one(&format!("tcp-stream-{ino:x}.img"), magic::TCP_STREAM) {
            Ok(e) => Ok(Some(e)),
            Err(e) if e.is_missing() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Bytes queued on each socket (sk-queues.img), by socket id.
    pub fn socket_queues(&self) -> Result<HashMap<u32, u64>> {
        let mut out = HashMap::new();
        let opened = self
            .open_image("sk-queues.img")
            .and_then(|image| image.expect_magic(magic::SK_QUEUES));
        let mut image = match opened {
            Ok(image) => image,
            Err(e) if e.is_missing() => return Ok(out),
            Err(e) => return Err(e),
        };
        while let Some(entry) = image.read_entry::<SkPacketEntry>()? {
            image.skip(u64::from(entry.length))?;
            *out.entry(entry.id_for).or_insert(0) += u64::from(entry.length);
        }
        Ok(out)
    }

    /// CRIU's statistics: `stats-dump` or `stats-restore`; None when absent.
    pub fn stats(&self, which: &str) -> Result<Option<StatsEntry>> {
        match self.read_one(&format!("stats-{which}"), magic::STATS) {
            Ok(e) => Ok(Some(e)),
            Err(e) if e.is_missing() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The mounts of mount namespace `ns_id` (mountpoints-<id>.img); None when the
    /// image has none (the tree shared the host's mount namespace).
    pub fn mounts(&self, ns_id: u32) -> Result<Option<Vec<MntEntry>>> {
        match self.read_all(&format!("mountpoints-{ns_id}.img"), magic::MNTS) {
            Ok(e) => Ok(Some(e)),
            Err(e) if e.is_missing() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The names of the files in the directory, sorted.
    pub fn file_names(&self) -> Result<Vec<String>> {
        if let Some(files) = &self.memory {
            // The images themselves, not what is below them (gpu/...).
            return Ok(files
                .names()
                .filter(|n| !n.contains('/'))
                .map(str::to_string)
                .collect());
        }
        let err = |e| ImageError::io(&self.root, 0, e);
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&self.root).map_err(err)? {
            let entry = entry.map_err(err)?;
            if entry.file_type().map_err(err)?.is_file() {
                names.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        names.sort();
        Ok(names)
    }

    fn optional_all<M: Message + Name + Default>(&self, name: &str, magic: u32) -> Result<Vec<M>> {
        match self.read_all(name, magic) {
            Err(e) if e.is_missing() => Ok(Vec::new()),
            other => other,
        }
    }

    fn legacy<M: Message + Name + Default>(
        &self,
        name: &str,
        magic: u32,
        table: &mut FileTable,
        wrap: impl Fn(M) -> FileEntry,
    ) -> Result<()> {
        for entry in self.optional_all::<M>(name, magic)? {
            table.insert(wrap(entry));
        }
        Ok(())
    }
}

fn file(kind: FdTypes, id: u32, fill: impl FnOnce(&mut FileEntry)) -> FileEntry {
    let mut entry = FileEntry {
        r#type: kind as i32,
        id,
        ..Default::default()
    };
    fill(&mut entry);
    entry
}
