//! Mounts of the dumped tree's mount namespaces (mountpoints-<ns id>.img).

use std::collections::BTreeSet;

use crate::dir::ImageDir;
use crate::error::Result;
use crate::explore::ps::ProcessTree;

/// One mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The mount namespace id (from ids-<pid>.img).
    pub ns_id: u32,
    pub mnt_id: u32,
    pub parent_mnt_id: u32,
    pub mountpoint: String,
    /// The mounted directory of the source file system.
    pub root: String,
    pub source: String,
    pub fstype: String,
    pub options: String,
}

/// Every mount recorded for the tree's mount namespaces; None when the image records
/// none (the tree shared the dumping host's mount namespace).
pub fn explore_mounts(dir: &ImageDir, tree: &ProcessTree) -> Result<Option<Vec<Mount>>> {
    let mut namespaces = BTreeSet::new();
    for p in tree.processes() {
        if p.state.has_resources() {
            if let Some(ns) = dir.ids(p.pid)?.mnt_ns_id {
                namespaces.insert(ns);
            }
        }
    }
    let mut out: Option<Vec<Mount>> = None;
    for ns_id in namespaces {
        let Some(entries) = dir.mounts(ns_id)? else {
            continue;
        };
        let list = out.get_or_insert_with(Vec::new);
        for m in entries {
            list.push(Mount {
                ns_id,
                mnt_id: m.mnt_id,
                parent_mnt_id: m.parent_mnt_id,
                fstype: fstype_name(m.fstype, m.fsname.as_deref()),
                mountpoint: m.mountpoint,
                root: m.root,
                source: m.source,
                options: m.options,
            });
        }
    }
    Ok(out)
}

/// CRIU's fstype numbers (images/mnt.proto); `fsname` names the others.
fn fstype_name(fstype: u32, fsname: Option<&str>) -> String {
    let known = match fstype {
        1 => "proc",
        2 => "sysfs",
        3 => "devtmpfs",
        4 => "binfmt_misc",
        5 => "tmpfs",
        6 => "devpts",
        7 => "simfs",
        8 => "pstore",
        9 => "securityfs",
        10 => "fusectl",
        11 => "debugfs",
        12 => "cgroup",
        13 => "aufs",
        14 => "mqueue",
        15 => "fuse",
        17 => "overlay",
        18 => "autofs",
        19 => "tracefs",
        23 => "cgroup2",
        _ => "",
    };
    match (known, fsname) {
        ("", Some(name)) if !name.is_empty() => name.to_string(),
        ("", _) => format!("fstype-{fstype}"),
        (k, _) => k.to_string(),
    }
}
