//! CRIU's image magics (criu/include/magic.h) and the file names they go with.

/// The head magic of ordinary images (images v1.1).
pub const IMG_COMMON: u32 = 0x5456_4319;
/// The head magic of service files: stats-dump, stats-restore, irmap-cache.
pub const IMG_SERVICE: u32 = 0x5510_5940;

pub const INVENTORY: u32 = 0x5831_3116;
pub const PSTREE: u32 = 0x5027_3030;
pub const FDINFO: u32 = 0x5621_3732;
pub const PAGEMAP: u32 = 0x5608_4025;
pub const CORE: u32 = 0x5505_3847;
pub const IDS: u32 = 0x5443_2030;
pub const VMAS: u32 = 0x5412_3737;
pub const PIPES: u32 = 0x5651_3555;
pub const PIPES_DATA: u32 = 0x5645_3709;
pub const FIFO: u32 = 0x5836_4939;
pub const FIFO_DATA: u32 = 0x5933_3054;
pub const SIGACT: u32 = 0x5534_4201;
pub const UNIXSK: u32 = 0x5437_3943;
pub const INETSK: u32 = 0x5644_3851;
pub const PACKETSK: u32 = 0x6045_4618;
pub const ITIMERS: u32 = 0x5746_4056;
pub const POSIX_TIMERS: u32 = 0x5260_3957;
pub const SK_QUEUES: u32 = 0x5626_4026;
pub const UTSNS: u32 = 0x5447_3203;
pub const CREDS: u32 = 0x5402_3547;
pub const IPC_VAR: u32 = 0x5311_5007;
pub const IPCNS_SHM: u32 = 0x4628_3044;
pub const IPCNS_MSG: u32 = 0x5545_3737;
pub const IPCNS_SEM: u32 = 0x5957_3019;
pub const REG_FILES: u32 = 0x5036_3636;
pub const EXT_FILES: u32 = 0x5925_5641;
pub const FS: u32 = 0x5140_3912;
pub const MM: u32 = 0x5749_2820;
pub const REMAP_FPATH: u32 = 0x5913_3954;
pub const GHOST_FILE: u32 = 0x5258_3605;
pub const TCP_STREAM: u32 = 0x5146_5506;
pub const EVENTFD_FILE: u32 = 0x4452_3722;
pub const EVENTPOLL_FILE: u32 = 0x4502_3858;
pub const EVENTPOLL_TFD: u32 = 0x4443_3746;
pub const SIGNALFD: u32 = 0x5732_3820;
pub const INOTIFY_FILE: u32 = 0x4842_4431;
pub const INOTIFY_WD: u32 = 0x5456_2009;
pub const MNTS: u32 = 0x5556_3928;
pub const NETDEV: u32 = 0x5737_3951;
pub const NETNS: u32 = 0x5593_3752;
pub const TTY_FILES: u32 = 0x5943_3025;
pub const TTY_INFO: u32 = 0x5945_3036;
pub const TTY_DATA: u32 = 0x5941_3026;
pub const FILE_LOCKS: u32 = 0x5432_3616;
pub const RLIMIT: u32 = 0x5711_3925;
pub const FANOTIFY_FILE: u32 = 0x5509_6122;
pub const FANOTIFY_MARK: u32 = 0x5650_6035;
pub const SIGNAL: u32 = 0x5925_5647;
pub const NETLINK_SK: u32 = 0x5800_5614;
pub const NS_FILES: u32 = 0x6139_4011;
pub const TUNFILE: u32 = 0x5714_3751;
pub const CGROUP: u32 = 0x5938_3330;
pub const TIMERFD: u32 = 0x5049_3712;
pub const CPUINFO: u32 = 0x6140_4013;
pub const USERNS: u32 = 0x5547_4906;
pub const SECCOMP: u32 = 0x6441_3049;
pub const BINFMT_MISC: u32 = 0x6734_3323;
pub const AUTOFS: u32 = 0x4935_3943;
pub const FILES: u32 = 0x5630_3138;
pub const MEMFD_INODE: u32 = 0x4845_3499;
pub const TIMENS: u32 = 0x4311_4433;
pub const PIDNS: u32 = 0x6115_7326;
pub const BPFMAP_FILE: u32 = 0x5750_6142;
pub const BPFMAP_DATA: u32 = 0x6432_4033;
pub const APPARMOR: u32 = 0x5942_3047;
pub const PIDFD: u32 = 0x5443_5556;
pub const STATS: u32 = 0x5709_3306;
pub const IRMAP_CACHE: u32 = 0x5700_4059;

const NAMES: &[(u32, &str)] = &[
    (INVENTORY, "INVENTORY"),
    (PSTREE, "PSTREE"),
    (FDINFO, "FDINFO"),
    (PAGEMAP, "PAGEMAP"),
    (CORE, "CORE"),
    (IDS, "IDS"),
    (VMAS, "VMAS"),
    (PIPES, "PIPES"),
    (PIPES_DATA, "PIPES_DATA"),
    (FIFO, "FIFO"),
    (FIFO_DATA, "FIFO_DATA"),
    (SIGACT, "SIGACT"),
    (UNIXSK, "UNIXSK"),
    (INETSK, "INETSK"),
    (PACKETSK, "PACKETSK"),
    (ITIMERS, "ITIMERS"),
    (POSIX_TIMERS, "POSIX_TIMERS"),
    (SK_QUEUES, "SK_QUEUES"),
    (UTSNS, "UTSNS"),
    (CREDS, "CREDS"),
    (IPC_VAR, "IPC_VAR"),
    (IPCNS_SHM, "IPCNS_SHM"),
    (IPCNS_MSG, "IPCNS_MSG"),
    (IPCNS_SEM, "IPCNS_SEM"),
    (REG_FILES, "REG_FILES"),
    (EXT_FILES, "EXT_FILES"),
    (FS, "FS"),
    (MM, "MM"),
    (REMAP_FPATH, "REMAP_FPATH"),
    (GHOST_FILE, "GHOST_FILE"),
    (TCP_STREAM, "TCP_STREAM"),
    (EVENTFD_FILE, "EVENTFD_FILE"),
    (EVENTPOLL_FILE, "EVENTPOLL_FILE"),
    (EVENTPOLL_TFD, "EVENTPOLL_TFD"),
    (SIGNALFD, "SIGNALFD"),
    (INOTIFY_FILE, "INOTIFY_FILE"),
    (INOTIFY_WD, "INOTIFY_WD"),
    (MNTS, "MNTS"),
    (NETDEV, "NETDEV"),
    (NETNS, "NETNS"),
    (TTY_FILES, "TTY_FILES"),
    (TTY_INFO, "TTY_INFO"),
    (TTY_DATA, "TTY_DATA"),
    (FILE_LOCKS, "FILE_LOCKS"),
    (RLIMIT, "RLIMIT"),
    (FANOTIFY_FILE, "FANOTIFY_FILE"),
    (FANOTIFY_MARK, "FANOTIFY_MARK"),
    (SIGNAL, "SIGNAL"),
    (NETLINK_SK, "NETLINK_SK"),
    (NS_FILES, "NS_FILES"),
    (TUNFILE, "TUNFILE"),
    (CGROUP, "CGROUP"),
    (TIMERFD, "TIMERFD"),
    (CPUINFO, "CPUINFO"),
    (USERNS, "USERNS"),
    (SECCOMP, "SECCOMP"),
    (BINFMT_MISC, "BINFMT_MISC"),
    (AUTOFS, "AUTOFS"),
    (FILES, "FILES"),
    (MEMFD_INODE, "MEMFD_INODE"),
    (TIMENS, "TIMENS"),
    (PIDNS, "PIDNS"),
    (BPFMAP_FILE, "BPFMAP_FILE"),
    (BPFMAP_DATA, "BPFMAP_DATA"),
    (APPARMOR, "APPARMOR"),
    (PIDFD, "PIDFD"),
    (STATS, "STATS"),
    (IRMAP_CACHE, "IRMAP_CACHE"),
];

/// The name of an image magic ("CORE"), or None for a magic CRIU 4.2 does not define.
pub fn name(magic: u32) -> Option<&'static str> {
    NAMES.iter().find(|(m, _)| *m == magic).map(|(_, n)| *n)
}

/// File name prefixes of raw images: no magic, no entries (pages, network dumps,
/// tarballs). Their content is checked, if at all, through the images that describe
/// them.
const RAW_PREFIXES: &[&str] = &[
    "pages-",
    "ifaddr-",
    "route-",
    "route6-",
    "rule-",
    "iptables-",
    "ip6tables-",
    "nftables-",
    "netns-ct-",
    "netns-exp-",
    "tmpfs-",
];

/// Whether the file `name` (no directory) is a raw image.
pub fn is_raw_image(name: &str) -> bool {
    RAW_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Whether the file `name` (no directory) is a CRIU image with magic and entries:
/// `*.img` that is not raw, `stats-*` or `irmap-cache`.
pub fn is_framed_image(name: &str) -> bool {
    if is_raw_image(name) {
        return false;
    }
    name.ends_with(".img") || name.starts_with("stats-") || name == "irmap-cache"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_per_magic() {
        for (i, (m, n)) in NAMES.iter().enumerate() {
            assert_eq!(name(*m), Some(*n));
            assert!(
                NAMES[i + 1..].iter().all(|(m2, _)| m2 != m),
                "{n} listed twice"
            );
        }
        assert_eq!(name(0x1234), None);
    }

    #[test]
    fn classifies_file_names() {
        assert!(is_raw_image("pages-1.img"));
        assert!(!is_framed_image("pages-12.img"));
        assert!(is_framed_image("pagemap-1.img"));
        assert!(is_framed_image("stats-dump"));
        assert!(is_framed_image("inventory.img"));
        assert!(!is_framed_image("dump.log"));
        assert!(!is_framed_image("gpucr.json"));
        assert!(!is_framed_image("tmpfs-dev-5.tar.gz.img"));
    }
}
