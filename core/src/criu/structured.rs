//! The values with a structure that CRIU 4.2 takes apart while it reads its options
//! (`parse_options` in criu/config.c), checked as CRIU checks them: a value CRIU refuses
//! there, before it opens its log, or reads without a word as something else than
//! written (a missing name taken as an empty one, a part it drops). Values CRIU reads as
//! written are left to CRIU, which names what is wrong with them in its log: a
//! `cgroup-root`, `skip-mnt`, `enable-fs`, `irmap-scan-path` or `lsm-profile` (checked
//! when the dump or restore begins), and `external` keys other than mounts', which CRIU
//! matches as written.

/// The namespaces `join-ns` joins (`join_ns_add` in criu/namespaces.c; `pid` it refuses).
const JOIN_NS_TYPES: &[&str] = &["net", "uts", "time", "ipc", "user", "mnt"];

/// The names `feature` takes (`feature_list` in criu/cr-check.c).
const FEATURES: &[&str] = &[
    "mnt_id",
    "mem_dirty_track",
    "aio_remap",
    "timerfd",
    "tun",
    "tun_ns",
    "userns",
    "fdinfo_lock",
    "seccomp_suspend",
    "seccomp_filters",
    "loginuid",
    "cgroupns",
    "autofs",
    "tcp_half_closed",
    "compat_cr",
    "uffd",
    "uffd-noncoop",
    "can_map_vdso",
    "sk_ns",
    "sk_unix_file",
    "net_diag_raw",
    "nsid",
    "link_nsid",
    "kcmp_epoll",
    "timens",
    "external_net_ns",
    "clone3_set_tid",
    "newifindex",
    "nftables",
    "has_ipt_legacy",
    "pidfd_store",
    "ns_pid",
    "apparmor_stacking",
    "network_lock_nftables",
    "sockopt_buf_lock",
    "memfd_hugetlb",
    "move_mount_set_group",
    "openat2",
    "get_rseq_conf",
    "ipv6_freebind",
    "pagemap_scan",
    "timer_cr_ids",
    "overlayfs_maps",
    "breakpoints",
    "pagemap_scan_guard_pages",
];

/// Why CRIU would refuse or misread `value` for the option `full` (its full name); None
/// when CRIU reads it as written, or takes it apart later, in its log.
pub fn check(full: &str, value: &str) -> Option<String> {
    match full {
        "veth-pair" => veth_pair(value),
        "join-ns" => join_ns(value),
        "ext-mount-map" => ext_mount_map(value),
        "external" => external(value),
        "feature" => (!FEATURES.contains(&value)).then(|| {
            format!("`feature` takes the name of one of `criu check`'s features, not {value:?}")
        }),
        _ => None,
    }
}

const VETH_PAIR: &str = "`veth-pair` takes IN=OUT[@BRIDGE] (the device's name in the \
                         tree's namespace, `=`, its peer's name outside)";

/// `IN=OUT[@BRIDGE]`: CRIU refuses a value without `=` and stores an empty name as
/// written, so that `=eth0` names no device of the tree.
fn veth_pair(value: &str) -> Option<String> {
    let Some((inside, outside)) = value.split_once('=') else {
        return Some(format!("{VETH_PAIR}; {value:?} has no `=`"));
    };
    let peer = outside.split('@').next().unwrap_or_default();
    if inside.is_empty() || peer.is_empty() {
        return Some(format!("{VETH_PAIR}; {value:?} leaves a name empty"));
    }
    None
}

const JOIN_NS: &str = "`join-ns` takes NS:FILE, FILE a path or a pid, NS one of net, uts, \
                       time, ipc, mnt or user; user:FILE may add ,UID[,GID]";

/// `NS:FILE[,UID[,GID]]`. CRIU refuses a value without `:`, an unknown or `pid`
/// namespace, an empty FILE and a UID or GID that is not a number up to 65535; it cuts
/// FILE at the first `,` and drops what follows for any namespace but `user`.
fn join_ns(value: &str) -> Option<String> {
    let Some((ns, rest)) = value.split_once(':') else {
        return Some(format!("{JOIN_NS}; {value:?} has no `:`"));
    };
    if !JOIN_NS_TYPES.contains(&ns) {
        let why = if ns == "pid" {
            "CRIU cannot join a pid namespace".to_owned()
        } else {
            format!("{ns:?} is not a namespace it joins")
        };
        return Some(format!("{JOIN_NS}; {why}"));
    }
    let (file, ids) = match rest.split_once(',') {
        Some((file, ids)) => (file, Some(ids)),
        None => (rest, None),
    };
    if file.is_empty() {
        return Some(format!("{JOIN_NS}; {value:?} names no file"));
    }
    match ids {
        None => None,
        Some(ids) if ns != "user" => Some(format!(
            "{JOIN_NS}; CRIU would drop {ids:?} from {value:?} (a `,` in FILE ends it)"
        )),
        Some(ids) => {
            let (uid, gid) = ids.split_once(',').unwrap_or((ids, ""));
            (!is_id(uid) || !is_id(gid))
                .then(|| format!("{JOIN_NS}; UID and GID are numbers up to 65535, not {ids:?}"))
        }
    }
}

/// A UID or GID of `join-ns user:`, as CRIU's `check_int_str` takes it: none, or a
/// decimal number from 0 to 65535.
fn is_id(id: &str) -> bool {
    id.is_empty()
        || (id.len() <= 5
            && id.bytes().all(|b| b.is_ascii_digit())
            && id.parse::<u32>().is_ok_and(|n| n <= 65535))
}

const EXT_MOUNT_MAP: &str = "`ext-mount-map` takes KEY:VALUE (on dump the mount point and \
                             its name in the images, on restore the name and the path to \
                             mount), or `auto`";

/// `KEY:VALUE` or `auto`. CRIU refuses a value without `:`; with KEY empty it reads the
/// value as `external mnt[]:VALUE` (`:m...` turns on external masters, without a word),
/// and an empty VALUE is stored as written and names nothing.
fn ext_mount_map(value: &str) -> Option<String> {
    if value == "auto" {
        return None;
    }
    let Some((key, val)) = value.split_once(':') else {
        return Some(format!("{EXT_MOUNT_MAP}; {value:?} has no `:`"));
    };
    (key.is_empty() || val.is_empty())
        .then(|| format!("{EXT_MOUNT_MAP}; {value:?} leaves KEY or VALUE empty"))
}

const EXTERNAL_MNT: &str = "`external` takes a mount as mnt[KEY]:VALUE, or mnt[] for every \
                            external mount, mnt[]:m or mnt[]:s with their masters or sharing";

/// The mount forms of `external`: `mnt[]`, `mnt[]:m`, `mnt[]:s` and `mnt[KEY]:VALUE`.
/// CRIU refuses `mnt[]:` with another flag, reads anything else after `mnt[]` as `mnt[]`
/// and any flag by its first letter (`mnt[]:mine` as `mnt[]:m`; `:master` and `:shared`
/// mean what they say), and stores `mnt[KEY]` without
/// a VALUE as written, where it finds no mount's name. Other keys (`dev[...]`,
/// `veth[...]`, `tty[...]`, a plugin's) CRIU matches as written.
fn external(value: &str) -> Option<String> {
    let mount = value.strip_prefix("mnt[")?;
    if let Some(flags) = mount.strip_prefix(']') {
        return (!["", ":", ":m", ":s", ":master", ":shared"].contains(&flags))
            .then(|| format!("{EXTERNAL_MNT}; not {value:?}"));
    }
    let Some((_key, val)) = mount.split_once("]:") else {
        return Some(format!("{EXTERNAL_MNT}; {value:?} has no `]:VALUE`"));
    };
    val.is_empty()
        .then(|| format!("{EXTERNAL_MNT}; {value:?} has an empty VALUE"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_criu_reads_as_written_pass() {
        for (name, value) in [
            ("veth-pair", "eth0=veth0"),
            ("veth-pair", "eth0=veth0@br0"),
            ("join-ns", "net:/var/run/netns/x"),
            ("join-ns", "uts:1234"),
            ("join-ns", "user:/proc/1/ns/user,0,0"),
            ("join-ns", "user:1,1000"),
            ("join-ns", "user:1,,65535"),
            ("join-ns", "time:1"),
            ("ext-mount-map", "auto"),
            ("ext-mount-map", "/data:data"),
            ("ext-mount-map", "data:/srv/data"),
            ("external", "mnt[]"),
            ("external", "mnt[]:m"),
            ("external", "mnt[]:s"),
            ("external", "mnt[]:master"),
            ("external", "mnt[/data]:data"),
            ("external", "mnt[data]:/srv/a:b"),
            ("external", "dev[8/1]:disk"),
            ("external", "veth[eth0]:veth0@br0"),
            ("external", "tty[88:1a]"),
            ("feature", "timens"),
            ("feature", "uffd-noncoop"),
            ("cgroup-root", "cpu:/x"),
            ("cgroup-root", "/x"),
            ("skip-mnt", "/proc/sys"),
            ("enable-fs", "fuse,nfs"),
            ("lsm-profile", "anything"),
            ("irmap-scan-path", "/usr"),
        ] {
            assert_eq!(check(name, value), None, "{name} {value:?}");
        }
    }

    #[test]
    fn values_criu_refuses_or_misreads_name_the_form() {
        for (name, value, why) in [
            ("veth-pair", "eth0", "has no `=`"),
            ("veth-pair", "=veth0", "leaves a name empty"),
            ("veth-pair", "eth0=", "leaves a name empty"),
            ("veth-pair", "eth0=@br0", "leaves a name empty"),
            ("join-ns", "net", "has no `:`"),
            ("join-ns", "pid:1", "cannot join a pid namespace"),
            ("join-ns", "cgroup:1", "not a namespace it joins"),
            ("join-ns", "net:", "names no file"),
            ("join-ns", "net:1,5", "would drop \"5\""),
            ("join-ns", "user:1,abc", "numbers up to 65535"),
            ("join-ns", "user:1,0,70000", "numbers up to 65535"),
            ("join-ns", "user:1,0,0,0", "numbers up to 65535"),
            ("join-ns", "user:1,-1", "numbers up to 65535"),
            ("ext-mount-map", "data", "has no `:`"),
            ("ext-mount-map", ":data", "leaves KEY or VALUE empty"),
            ("ext-mount-map", ":mdata", "leaves KEY or VALUE empty"),
            ("ext-mount-map", "/data:", "leaves KEY or VALUE empty"),
            ("external", "mnt[]:x", "mnt[]:m or mnt[]:s"),
            ("external", "mnt[]x", "not \"mnt[]x\""),
            ("external", "mnt[]:mine", "mnt[]:m"),
            ("external", "mnt[/data]", "has no `]:VALUE`"),
            ("external", "mnt[/data:d", "has no `]:VALUE`"),
            ("external", "mnt[/data]:", "empty VALUE"),
            ("feature", "bogus", "`criu check`'s features"),
        ] {
            let got = check(name, value).unwrap_or_default();
            assert!(
                got.contains(why) && got.contains(&format!("`{name}` takes")),
                "{name} {value:?}: {got:?}"
            );
        }
    }
}
