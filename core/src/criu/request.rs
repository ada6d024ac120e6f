//! Typed DUMP and RESTORE requests, turned into CRIU's `criu_opts`.

use std::fmt;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::Path;
use std::str::FromStr;

use super::rpc;

/// How CRIU locks the network while it dumps or restores TCP connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkLock {
    Iptables,
    Nftables,
    Skip,
}

impl NetworkLock {
    /// The name used on the command line and in the manifest.
    pub fn as_str(self) -> &'static str {
        match self {
            NetworkLock::Iptables => "iptables",
            NetworkLock::Nftables => "nftables",
            NetworkLock::Skip => "skip",
        }
    }

    /// What this machine has: iptables when `iptables-restore` is installed (CRIU's
    /// default method needs it), otherwise nftables (CRIU 4.2 is built with libnftables).
    pub fn detect() -> NetworkLock {
        let has_iptables = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .unwrap_or_default()
            .iter()
            .chain(
                [
                    Path::new("/usr/sbin").to_path_buf(),
                    Path::new("/sbin").to_path_buf(),
                ]
                .iter(),
            )
            .any(|d| d.join("iptables-restore").exists());
        if has_iptables {
            NetworkLock::Iptables
        } else {
            NetworkLock::Nftables
        }
    }

    /// The method for dumping `pid`: none when there is nothing to lock, else
    /// [`NetworkLock::detect`]. Nothing needs locking when connections are not dumped
    /// (without `tcp_established` CRIU refuses established TCP connections) and the tree
    /// shares gpucr's network namespace (there is no namespace of its own to lock).
    /// CRIU restores with the method recorded at dump, so this also spares the restore
    /// the cost of unlocking (about 30 ms for nftables).
    pub fn default_for(pid: i32, tcp_established: bool) -> NetworkLock {
        if !tcp_established && shares_my_network_namespace(pid) {
            NetworkLock::Skip
        } else {
            NetworkLock::detect()
        }
    }

    fn to_rpc(self) -> rpc::CriuNetworkLockMethod {
        match self {
            NetworkLock::Iptables => rpc::CriuNetworkLockMethod::Iptables,
            NetworkLock::Nftables => rpc::CriuNetworkLockMethod::Nftables,
            NetworkLock::Skip => rpc::CriuNetworkLockMethod::Skip,
        }
    }
}

/// True when `pid` is known to be in the caller's network namespace (false when either
/// namespace cannot be read: then the safe answer is to lock).
fn shares_my_network_namespace(pid: i32) -> bool {
    shares_my_namespace(pid, "net")
}

/// True when `pid` is known to be in the caller's namespace of `kind` ("net", "mnt").
fn shares_my_namespace(pid: i32, kind: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    let ns = |path: String| std::fs::metadata(path).map(|m| (m.dev(), m.ino()));
    match (
        ns(format!("/proc/self/ns/{kind}")),
        ns(format!("/proc/{pid}/ns/{kind}")),
    ) {
        (Ok(mine), Ok(theirs)) => mine == theirs,
        _ => false,
    }
}

/// True when `pid` has a mount namespace of its own (one gpucr's is not), so CRIU must
/// dump and restore it: see [`CommonOptions::own_mount_namespace`].
pub fn has_own_mount_namespace(pid: i32) -> bool {
    !shares_my_namespace(pid, "mnt")
}

impl fmt::Display for NetworkLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for NetworkLock {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "iptables" => Ok(NetworkLock::Iptables),
            "nftables" => Ok(NetworkLock::Nftables),
            "skip" => Ok(NetworkLock::Skip),
            other => Err(format!("unknown network lock method {other:?}")),
        }
    }
}

/// The CRIU flags a dump takes and its restore must repeat, declared once for the
/// dump, the restore, the request and the manifest (which records them under these
/// names).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CriuFlags {
    /// Established TCP connections (with their sequence numbers; needs a network lock).
    pub tcp_established: bool,
    /// The tree is a shell job: it shares a session or controlling terminal.
    pub shell_job: bool,
    /// Unix sockets connected to peers outside the tree.
    pub ext_unix_sk: bool,
    /// File locks (flock, POSIX and OFD locks).
    pub file_locks: bool,
}

impl CriuFlags {
    /// Every flag set in either.
    pub fn or(self, other: CriuFlags) -> CriuFlags {
        CriuFlags {
            tcp_established: self.tcp_established || other.tcp_established,
            shell_job: self.shell_job || other.shell_job,
            ext_unix_sk: self.ext_unix_sk || other.ext_unix_sk,
            file_locks: self.file_locks || other.file_locks,
        }
    }
}

/// The options common to DUMP and RESTORE.
#[derive(Debug, Clone, Copy)]
pub struct CommonOptions {
    pub flags: CriuFlags,
    pub network_lock: NetworkLock,
    /// CRIU's log level: 2 (errors and warnings) by default, 4 for debug.
    pub log_level: i32,
    /// The tree has a mount namespace of its own. CRIU then dumps and restores it, and
    /// the mounts that are binds of gpucr's own (the system's /dev, /proc, a data
    /// directory) are taken as external: at dump their sharing and masters are allowed
    /// (auto_ext_mnt, ext_sharing, ext_masters), at restore they are bound again from
    /// the restoring host's tree, with "/" as the root.
    pub own_mount_namespace: bool,
}

/// A DUMP request.
#[derive(Debug)]
pub struct DumpRequest<'a> {
    pub pid: i32,
    /// The image directory, an fd in gpucr's own table (CRIU opens it through /proc).
    pub images_dir: BorrowedFd<'a>,
    /// The log file name, relative to the image directory.
    pub log_file: &'a str,
    pub leave_running: bool,
    /// Give up freezing after this many seconds.
    pub timeout: Option<u32>,
    pub common: CommonOptions,
    /// CRIU options from `--criu-config`, checked (see [`super::CriuConfig`]): the path
    /// CRIU reads them from.
    pub config_file: Option<String>,
    /// The `--criu-config` file they came from, named when CRIU refuses the request.
    pub config_origin: Option<&'a Path>,
    /// CRIU sends the memory pages to a page server over this socket, inherited at
    /// this number (`dump::page_server`), instead of writing them.
    pub page_server_fd: Option<std::os::fd::RawFd>,
}

/// A RESTORE request.
#[derive(Debug)]
pub struct RestoreRequest<'a> {
    pub images_dir: BorrowedFd<'a>,
    /// Where CRIU writes its log and statistics (`work_dir_fd`), when not in the image
    /// directory (a read-only one).
    pub work_dir: Option<BorrowedFd<'a>>,
    /// The log file name, relative to the work directory (the image directory if none).
    pub log_file: &'a str,
    pub common: CommonOptions,
    /// Descriptors CRIU inherited from gpucr, by key and number in CRIU's table: CRIU
    /// keeps them in its fdstore, where its plugins find them (`inherit_fd_lookup_id`).
    pub inherit: Vec<(String, i32)>,
    /// As [`DumpRequest::config_file`].
    pub config_file: Option<String>,
    /// As [`DumpRequest::config_origin`].
    pub config_origin: Option<&'a Path>,
    /// Leave the tasks' lazy memory to a lazy-pages server on `lazy-pages.socket` in
    /// the work directory (`lazy_pages`).
    pub lazy_pages: bool,
}

impl CommonOptions {
    fn opts(&self, images_dir: BorrowedFd<'_>, log_file: &str) -> rpc::CriuOpts {
        rpc::CriuOpts {
            images_dir_fd: images_dir.as_raw_fd(),
            log_level: Some(self.log_level),
            log_file: Some(log_file.to_owned()),
            notify_scripts: Some(true),
            tcp_established: Some(self.flags.tcp_established),
            shell_job: Some(self.flags.shell_job),
            ext_unix_sk: Some(self.flags.ext_unix_sk),
            file_locks: Some(self.flags.file_locks),
            network_lock: Some(self.network_lock.to_rpc() as i32),
            auto_ext_mnt: self.own_mount_namespace.then_some(true),
            ext_sharing: self.own_mount_namespace.then_some(true),
            ext_masters: self.own_mount_namespace.then_some(true),
            ..Default::default()
        }
    }
}

impl DumpRequest<'_> {
    pub fn to_rpc(&self) -> rpc::CriuReq {
        let mut opts = self.common.opts(self.images_dir, self.log_file);
        opts.pid = Some(self.pid);
        opts.leave_running = Some(self.leave_running);
        opts.timeout = self.timeout;
        opts.config_file = self.config_file.clone();
        opts.ps = self.page_server_fd.map(|fd| rpc::CriuPageServerInfo {
            fd: Some(fd),
            // CRIU reads the port whatever the socket; it connects nowhere.
            port: Some(0),
            ..Default::default()
        });
        request(rpc::CriuReqType::Dump, Some(opts))
    }
}

impl RestoreRequest<'_> {
    pub fn to_rpc(&self) -> rpc::CriuReq {
        let mut opts = self.common.opts(self.images_dir, self.log_file);
        // The restored root becomes gpucr's child, so gpucr can wait for it.
        opts.rst_sibling = Some(true);
        if self.common.own_mount_namespace {
            opts.root = Some("/".into());
        }
        opts.inherit_fd = self
            .inherit
            .iter()
            .map(|(key, fd)| rpc::InheritFd {
                key: key.clone(),
                fd: *fd,
            })
            .collect();
        opts.config_file = self.config_file.clone();
        opts.work_dir_fd = self.work_dir.map(|fd| fd.as_raw_fd());
        opts.lazy_pages = self.lazy_pages.then_some(true);
        request(rpc::CriuReqType::Restore, Some(opts))
    }
}

pub(super) fn request(kind: rpc::CriuReqType, opts: Option<rpc::CriuOpts>) -> rpc::CriuReq {
    rpc::CriuReq {
        r#type: kind as i32,
        opts,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn nothing_to_lock_means_no_lock() {
        let me = std::process::id() as i32;
        assert_eq!(NetworkLock::default_for(me, false), NetworkLock::Skip);
        assert_eq!(NetworkLock::default_for(me, true), NetworkLock::detect());
        // A namespace that cannot be read is not assumed to be ours.
        assert_eq!(
            NetworkLock::default_for(i32::MAX, false),
            NetworkLock::detect()
        );
    }

    use std::fs::File;
    use std::os::fd::AsFd;

    use super::*;

    fn common() -> CommonOptions {
        CommonOptions {
            flags: CriuFlags {
                tcp_established: true,
                shell_job: false,
                ext_unix_sk: false,
                file_locks: true,
            },
            network_lock: NetworkLock::Nftables,
            log_level: 2,
            own_mount_namespace: false,
        }
    }

    #[test]
    fn own_mount_namespace_takes_binds_as_external_and_restores_under_slash() {
        let dir = File::open("/").unwrap();
        let mut common = common();
        common.own_mount_namespace = true;
        let req = RestoreRequest {
            images_dir: dir.as_fd(),
            log_file: "restore.log",
            common,
            inherit: vec![],
            config_file: None,
            config_origin: None,
            work_dir: None,
            lazy_pages: false,
        }
        .to_rpc();
        let o = req.opts.unwrap();
        assert_eq!(o.auto_ext_mnt, Some(true));
        assert_eq!(o.ext_sharing, Some(true));
        assert_eq!(o.ext_masters, Some(true));
        assert_eq!(o.root.as_deref(), Some("/"));
        let plain = RestoreRequest {
            images_dir: dir.as_fd(),
            log_file: "restore.log",
            common: super::tests::common(),
            inherit: vec![],
            config_file: None,
            config_origin: None,
            work_dir: None,
            lazy_pages: false,
        }
        .to_rpc()
        .opts
        .unwrap();
        assert_eq!(plain.root, None);
        assert_eq!(plain.auto_ext_mnt, None);
        assert!(!has_own_mount_namespace(std::process::id() as i32));
    }

    #[test]
    fn dump_request_carries_every_option() {
        let dir = File::open("/").unwrap();
        let req = DumpRequest {
            pid: 42,
            images_dir: dir.as_fd(),
            log_file: "dump.log",
            leave_running: true,
            timeout: Some(7),
            common: common(),
            config_file: Some("/proc/self/fd/9".into()),
            config_origin: None,
            page_server_fd: Some(11),
        }
        .to_rpc();
        assert_eq!(req.r#type, rpc::CriuReqType::Dump as i32);
        let o = req.opts.unwrap();
        let ps = o.ps.clone().unwrap();
        assert_eq!((ps.fd, ps.address), (Some(11), None));
        assert_eq!(o.images_dir_fd, dir.as_raw_fd());
        assert_eq!(o.pid, Some(42));
        assert_eq!(o.leave_running, Some(true));
        assert_eq!(o.tcp_established, Some(true));
        assert_eq!(o.file_locks, Some(true));
        assert_eq!(o.timeout, Some(7));
        assert_eq!(
            o.network_lock,
            Some(rpc::CriuNetworkLockMethod::Nftables as i32)
        );
        assert_eq!(o.notify_scripts, Some(true));
        assert_eq!(o.log_file.as_deref(), Some("dump.log"));
        assert_eq!(o.config_file.as_deref(), Some("/proc/self/fd/9"));
    }

    #[test]
    fn restore_request_makes_the_root_our_child() {
        let dir = File::open("/").unwrap();
        let req = RestoreRequest {
            images_dir: dir.as_fd(),
            log_file: "restore.log",
            common: common(),
            inherit: vec![("gpucr-helper".into(), 7)],
            config_file: Some("/proc/self/fd/8".into()),
            config_origin: None,
            work_dir: None,
            lazy_pages: false,
        }
        .to_rpc();
        let o = req.opts.unwrap();
        assert_eq!(o.work_dir_fd, None);
        assert_eq!(o.rst_sibling, Some(true));
        assert_eq!(o.pid, None);
        assert_eq!(o.inherit_fd.len(), 1);
        assert_eq!(o.inherit_fd[0].key, "gpucr-helper");
        assert_eq!(o.inherit_fd[0].fd, 7);
        assert_eq!(o.config_file.as_deref(), Some("/proc/self/fd/8"));
    }

    /// A read-only image directory: CRIU writes its log and statistics into the work
    /// directory gpucr names.
    #[test]
    fn restore_request_names_a_work_dir_when_given_one() {
        let (images, work) = (File::open("/").unwrap(), File::open("/tmp").unwrap());
        let o = RestoreRequest {
            images_dir: images.as_fd(),
            work_dir: Some(work.as_fd()),
            log_file: "restore.log",
            common: common(),
            inherit: vec![],
            config_file: None,
            config_origin: None,
            lazy_pages: false,
        }
        .to_rpc()
        .opts
        .unwrap();
        assert_eq!(o.images_dir_fd, images.as_raw_fd());
        assert_eq!(o.work_dir_fd, Some(work.as_raw_fd()));
    }

    #[test]
    fn network_lock_names_round_trip() {
        for m in [
            NetworkLock::Iptables,
            NetworkLock::Nftables,
            NetworkLock::Skip,
        ] {
            assert_eq!(m.as_str().parse::<NetworkLock>().unwrap(), m);
        }
        assert!("bogus".parse::<NetworkLock>().is_err());
    }
}
