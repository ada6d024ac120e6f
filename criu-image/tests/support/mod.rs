//! A small but complete synthetic CRIU image directory, written with the crate's own
//! encoder: two processes (one with a second thread), regular files, a pipe, a unix
//! socket, a TCP socket with queued data, a memfd, argv/environment in dumped memory,
//! pipe data, mounts and dump statistics.

#![allow(dead_code)]

use std::path::Path;

use gpucr_criu_image::encode::{image_bytes, push_entry, write_image};
use gpucr_criu_image::framing::Head;
use gpucr_criu_image::magic;
use gpucr_criu_image::pagemap::{PE_LAZY, PE_PRESENT};
use gpucr_criu_image::proto::*;

pub const PAGE: u64 = 4096;
pub const ARG_START: u64 = 0x7000_0000_0000;
pub const ARGV: &[u8] = b"prog\0--flag\0value\0";
pub const ENVIRON: &[u8] = b"A=1\0B=two\0";

fn fown() -> FownEntry {
    FownEntry::default()
}

fn reg(id: u32, name: &str, pos: u64) -> FileEntry {
    FileEntry {
        r#type: FdTypes::Reg as i32,
        id,
        reg: Some(RegFileEntry {
            id,
            name: name.into(),
            pos,
            fown: fown(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn sk_opts() -> SkOptsEntry {
    SkOptsEntry {
        so_sndbuf: 16384,
        so_rcvbuf: 131072,
        ..Default::default()
    }
}

/// Write the image set into `dir`.
pub fn write_image_dir(dir: &Path) {
    let w = |name: &str, bytes: Vec<u8>| std::fs::write(dir.join(name), bytes).unwrap();
    w(
        "inventory.img",
        image_bytes(
            Head::Bare,
            magic::INVENTORY,
            &[InventoryEntry {
                img_version: 2,
                fdinfo_per_id: Some(true),
                ..Default::default()
            }],
        ),
    );
    w(
        "pstree.img",
        image_bytes(
            Head::Common,
            magic::PSTREE,
            &[
                PstreeEntry {
                    pid: 1,
                    ppid: 0,
                    pgid: 1,
                    sid: 1,
                    threads: vec![1, 3],
                },
                PstreeEntry {
                    pid: 2,
                    ppid: 1,
                    pgid: 1,
                    sid: 1,
                    threads: vec![2],
                },
            ],
        ),
    );
    for (tid, comm, task) in [
        (1, "parent", true),
        (2, "child", true),
        (3, "worker", false),
    ] {
        let core = CoreEntry {
            mtype: 1,
            tc: task.then(|| TaskCoreEntry {
                task_state: 1,
                comm: comm.into(),
                ..Default::default()
            }),
            ids: None,
            thread_core: Some(ThreadCoreEntry {
                comm: Some(comm.into()),
                ..Default::default()
            }),
        };
        w(
            &format!("core-{tid}.img"),
            image_bytes(Head::Common, magic::CORE, &[core]),
        );
    }
    for pid in [1u32, 2] {
        let ids = TaskKobjIdsEntry {
            vm_id: pid,
            files_id: pid,
            fs_id: pid,
            mnt_ns_id: Some(5),
            ..Default::default()
        };
        w(
            &format!("ids-{pid}.img"),
            image_bytes(Head::Common, magic::IDS, &[ids]),
        );
        let fs = FsEntry {
            cwd_id: 10,
            root_id: 11,
            umask: None,
        };
        w(
            &format!("fs-{pid}.img"),
            image_bytes(Head::Common, magic::FS, &[fs]),
        );
    }
    let fd = |fd: u32, id: u32, t: FdTypes| FdinfoEntry {
        id,
        flags: 0,
        r#type: t as i32,
        fd,
    };
    w(
        "fdinfo-1.img",
        image_bytes(
            Head::Common,
            magic::FDINFO,
            &[
                fd(0, 12, FdTypes::Reg),
                fd(3, 20, FdTypes::Pipe),
                fd(4, 30, FdTypes::Unixsk),
                fd(5, 40, FdTypes::Inetsk),
                fd(6, 50, FdTypes::Memfd),
            ],
        ),
    );
    w(
        "fdinfo-2.img",
        image_bytes(Head::Common, magic::FDINFO, &[fd(0, 21, FdTypes::Pipe)]),
    );
    let files = vec![
        reg(10, "/work", 0),
        reg(11, "/", 0),
        reg(12, "/data/log", 1234),
        reg(13, "/usr/bin/prog", 0),
        FileEntry {
            r#type: FdTypes::Pipe as i32,
            id: 20,
            pipe: Some(PipeEntry {
                id: 20,
                pipe_id: 777,
                flags: 1,
                fown: fown(),
            }),
            ..Default::default()
        },
        FileEntry {
            r#type: FdTypes::Pipe as i32,
            id: 21,
            pipe: Some(PipeEntry {
                id: 21,
                pipe_id: 777,
                flags: 0,
                fown: fown(),
            }),
            ..Default::default()
        },
        FileEntry {
            r#type: FdTypes::Unixsk as i32,
            id: 30,
            usk: Some(UnixSkEntry {
                id: 30,
                ino: 900,
                r#type: 1,
                state: 10,
                peer: 0,
                name: b"\0abstract".to_vec(),
                opts: sk_opts(),
                fown: fown(),
                ..Default::default()
            }),
            ..Default::default()
        },
        FileEntry {
            r#type: FdTypes::Inetsk as i32,
            id: 40,
            isk: Some(InetSkEntry {
                id: 40,
                ino: 0x1234,
                family: 2,
                r#type: 1,
                proto: 6,
                state: 1,
                src_port: 8080,
                dst_port: 51000,
                src_addr: vec![u32::from_le_bytes([127, 0, 0, 1])],
                dst_addr: vec![u32::from_le_bytes([127, 0, 0, 2])],
                opts: sk_opts(),
                fown: fown(),
                ..Default::default()
            }),
            ..Default::default()
        },
        FileEntry {
            r#type: FdTypes::Memfd as i32,
            id: 50,
            memfd: Some(MemfdFileEntry {
                id: 50,
                flags: 2,
                pos: 8,
                fown: fown(),
                inode_id: 1,
            }),
            ..Default::default()
        },
    ];
    w("files.img", image_bytes(Head::Common, magic::FILES, &files));
    w(
        "memfd.img",
        image_bytes(
            Head::Common,
            magic::MEMFD_INODE,
            &[MemfdInodeEntry {
                name: "buf".into(),
                size: 8192,
                inode_id: 1,
                ..Default::default()
            }],
        ),
    );
    // TCP queues: 3 bytes in, 2 bytes out.
    let mut tcp = image_bytes(
        Head::Common,
        magic::TCP_STREAM,
        &[TcpStreamEntry {
            inq_len: 3,
            outq_len: 2,
            ..Default::default()
        }],
    );
    tcp.extend_from_slice(b"abcde");
    w("tcp-stream-1234.img", tcp);
    let mut pipes = image_bytes(
        Head::Common,
        magic::PIPES_DATA,
        &[PipeDataEntry {
            pipe_id: 777,
            bytes: 4,
            size: None,
        }],
    );
    pipes.extend_from_slice(b"data");
    w("pipes-data.img", pipes);
    for pid in [1u32, 2] {
        let mm = MmEntry {
            mm_arg_start: ARG_START,
            mm_arg_end: ARG_START + ARGV.len() as u64,
            mm_env_start: ARG_START + ARGV.len() as u64,
            mm_env_end: ARG_START + (ARGV.len() + ENVIRON.len()) as u64,
            exe_file_id: 13,
            vmas: vec![
                VmaEntry {
                    start: 0x40_0000,
                    end: 0x40_2000,
                    pgoff: 0,
                    shmid: 13,
                    prot: 5,
                    flags: 2,
                    status: 1 | (1 << 6),
                    fd: -1,
                    ..Default::default()
                },
                VmaEntry {
                    start: ARG_START,
                    end: ARG_START + 2 * PAGE,
                    prot: 3,
                    flags: 0x22,
                    status: 1 | (1 << 9),
                    fd: -1,
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        w(
            &format!("mm-{pid}.img"),
            image_bytes(Head::Common, magic::MM, &[mm]),
        );
        let mut pagemap = image_bytes(
            Head::Common,
            magic::PAGEMAP,
            &[PagemapHead { pages_id: pid + 10 }],
        );
        push_entry(
            &mut pagemap,
            &PagemapEntry {
                vaddr: ARG_START,
                compat_nr_pages: 0,
                in_parent: None,
                flags: Some(PE_PRESENT | PE_LAZY),
                nr_pages: Some(2),
            },
        );
        w(&format!("pagemap-{pid}.img"), pagemap);
        let mut pages = vec![0u8; 2 * PAGE as usize];
        pages[..ARGV.len()].copy_from_slice(ARGV);
        pages[ARGV.len()..ARGV.len() + ENVIRON.len()].copy_from_slice(ENVIRON);
        w(&format!("pages-{}.img", pid + 10), pages);
    }
    write_image(
        &dir.join("mountpoints-5.img"),
        Head::Common,
        magic::MNTS,
        &[MntEntry {
            fstype: 1,
            mnt_id: 1,
            mountpoint: "/proc".into(),
            source: "proc".into(),
            root: "/".into(),
            ..Default::default()
        }],
    )
    .unwrap();
    w(
        "stats-dump",
        image_bytes(
            Head::Service,
            magic::STATS,
            &[StatsEntry {
                dump: Some(DumpStatsEntry {
                    frozen_time: 1500,
                    pages_written: 4,
                    ..Default::default()
                }),
                restore: None,
            }],
        ),
    );
}
