//! CRIU's page-server protocol, as CRIU's dump speaks it to a page server
//! (criu/page-xfer.c): a fixed-size header per command, the pages of an `ADD` after
//! its header, and three short answers.
//!
//! The header is CRIU's `struct page_server_iov`, sent as it lies in memory, so its
//! size is CRIU's: `{u32 cmd; u32 nr_pages; u64 vaddr; u64 dst_id}` (24 bytes) up to
//! CRIU 4.1, `{u32 cmd; u64 nr_pages; u64 vaddr; u64 dst_id}` (32 bytes, 4 of padding
//! after `cmd`) from 4.2 on ([`Layout`]). `cmd` holds the command in its low 16 bits
//! and, for `ADD_F`, the pagemap entry's flags in its high 16; `dst_id` names the
//! pagemap: its type in the low 8 bits (older CRIUs used other numbers for the same
//! two types, which CRIU's own server still accepts), the process or shared memory
//! segment above.

use crate::criu::CriuVersion;

/// `PS_IOV_ADD`: pages present, flags implied (`PE_PRESENT`).
const ADD: u32 = 1;
/// `PS_IOV_HOLE`: pages in the parent image (`PE_PARENT`), no data.
const HOLE: u32 = 2;
/// `PS_IOV_OPEN`: open a pagemap, no answer.
const OPEN: u32 = 3;
/// `PS_IOV_OPEN2`: open a pagemap; answered with one byte, whether it has a parent.
const OPEN2: u32 = 4;
/// `PS_IOV_PARENT`: whether a pagemap has a parent; answered with an `int`.
const PARENT: u32 = 5;
/// `PS_IOV_ADD_F`: a pagemap entry with its flags, then its data if `PE_PRESENT`.
const ADD_F: u32 = 6;
/// `PS_IOV_GET`: a lazy restore's request for pages (never sent by a dump).
const GET: u32 = 7;
/// `PS_IOV_CLOSE` and `PS_IOV_FORCE_CLOSE`: the dump is over; answered with an
/// `int32` status.
const CLOSE: u32 = 0x1023;
const FORCE_CLOSE: u32 = 0x1024;
const CMD_BITS: u32 = 16;
const TYPE_BITS: u32 = 8;

/// A pagemap entry's pages are in the parent image.
pub const PE_PARENT: u32 = 1 << 0;
/// A pagemap entry's pages follow it (and lie in the pages file).
pub const PE_PRESENT: u32 = 1 << 2;

/// The first CRIU whose header carries a 64-bit page count.
const WIDE_SINCE: CriuVersion = CriuVersion {
    major: 4,
    minor: 2,
    sublevel: 0,
};

/// The size of CRIU's header, which depends on its version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `u32 nr_pages` (CRIU 4.1 and older): 24 bytes.
    Narrow,
    /// `u64 nr_pages` after 4 bytes of padding (CRIU 4.2 on): 32 bytes.
    Wide,
}

impl Layout {
    pub fn of(version: CriuVersion) -> Layout {
        match version >= WIDE_SINCE {
            true => Layout::Wide,
            false => Layout::Narrow,
        }
    }

    pub const fn header_len(self) -> usize {
        match self {
            Layout::Narrow => 24,
            Layout::Wide => 32,
        }
    }

    /// The header of `command`, as CRIU sends it (tests play CRIU's part with it).
    pub fn encode(self, command: &Command) -> Vec<u8> {
        let (cmd, nr_pages, vaddr, dst_id) = match *command {
            Command::Open { target, answered } => {
                (if answered { OPEN2 } else { OPEN }, 0, 0, target.dst_id())
            }
            Command::Parent { target } => (PARENT, 0, 0, target.dst_id()),
            Command::Add {
                target,
                vaddr,
                nr_pages,
                flags,
            } => (flags << CMD_BITS | ADD_F, nr_pages, vaddr, target.dst_id()),
            Command::Close => (CLOSE, 0, 0, 0),
            Command::Get => (GET, 0, 0, 0),
        };
        let mut out = Vec::with_capacity(self.header_len());
        out.extend_from_slice(&cmd.to_le_bytes());
        match self {
            Layout::Narrow => out.extend_from_slice(&(nr_pages as u32).to_le_bytes()),
            Layout::Wide => {
                out.extend_from_slice(&[0; 4]);
                out.extend_from_slice(&nr_pages.to_le_bytes());
            }
        }
        out.extend_from_slice(&vaddr.to_le_bytes());
        out.extend_from_slice(&dst_id.to_le_bytes());
        out
    }

    /// The command in one header of [`Layout::header_len`] bytes.
    pub fn decode(self, header: &[u8]) -> Result<Command, WireError> {
        let word = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().expect("8"));
        let cmd = u32::from_le_bytes(header[..4].try_into().expect("4"));
        let (nr_pages, vaddr, dst_id) = match self {
            Layout::Narrow => (
                u64::from(u32::from_le_bytes(header[4..8].try_into().expect("4"))),
                word(8),
                word(16),
            ),
            Layout::Wide => (word(8), word(16), word(24)),
        };
        let target = || Target::of(dst_id).ok_or(WireError::UnknownTarget { dst_id });
        let add = |flags| {
            Ok(Command::Add {
                target: target()?,
                vaddr,
                nr_pages,
                flags,
            })
        };
        match cmd & ((1 << CMD_BITS) - 1) {
            OPEN | OPEN2 => Ok(Command::Open {
                target: target()?,
                answered: cmd == OPEN2,
            }),
            PARENT => Ok(Command::Parent { target: target()? }),
            ADD_F => add(cmd >> CMD_BITS),
            ADD => add(PE_PRESENT),
            HOLE => add(PE_PARENT),
            CLOSE | FORCE_CLOSE => Ok(Command::Close),
            GET => Ok(Command::Get),
            _ => Err(WireError::UnknownCommand { cmd }),
        }
    }
}

/// What a header asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Open `target`'s pagemap (and a new pages file); `answered`: CRIU waits for
    /// one byte saying whether it has a parent image.
    Open { target: Target, answered: bool },
    /// Whether `target` has a parent image: answered with an `int`.
    Parent { target: Target },
    /// One pagemap entry of `target`; `nr_pages` pages of data follow when `flags`
    /// holds [`PE_PRESENT`].
    Add {
        target: Target,
        vaddr: u64,
        nr_pages: u64,
        flags: u32,
    },
    /// The dump is over: answered with an `int32` status.
    Close,
    /// A lazy restore's request, which a dump never sends.
    Get,
}

/// The pagemap a command is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// A process's private memory, by its pid in the tree's own namespace
    /// (`pagemap-PID.img`).
    Task(u64),
    /// A shared memory segment (`pagemap-shmem-ID.img`).
    Shmem(u64),
}

impl Target {
    fn of(dst_id: u64) -> Option<Target> {
        let id = dst_id >> TYPE_BITS;
        // CRIU's `decode_pm`: 1 and 2 today, the rest from CRIUs before 3.3.
        match dst_id & ((1 << TYPE_BITS) - 1) {
            1 | 10 | 11 | 16 | 17 => Some(Target::Task(id)),
            2 | 27 | 28 | 29 | 32 | 33 | 34 => Some(Target::Shmem(id)),
            _ => None,
        }
    }

    fn dst_id(self) -> u64 {
        match self {
            Target::Task(id) => id << TYPE_BITS | 1,
            Target::Shmem(id) => id << TYPE_BITS | 2,
        }
    }

    /// The pagemap image CRIU would write for it.
    pub fn pagemap_name(self) -> String {
        match self {
            Target::Task(pid) => format!("pagemap-{pid}.img"),
            Target::Shmem(id) => format!("pagemap-shmem-{id}.img"),
        }
    }
}

/// A header that is not CRIU's.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("unknown page-server command {cmd:#x}")]
    UnknownCommand { cmd: u32 },
    #[error("a pagemap of unknown type (dst_id {dst_id:#x})")]
    UnknownTarget { dst_id: u64 },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_is_as_long_as_the_criu_that_sends_it() {
        let v = |minor| CriuVersion {
            major: 4,
            minor,
            sublevel: 1,
        };
        assert_eq!(Layout::of(v(1)), Layout::Narrow);
        assert_eq!(Layout::of(v(2)), Layout::Wide);
        assert_eq!(Layout::of(v(3)), Layout::Wide);
        assert_eq!(Layout::Narrow.header_len(), 24);
        assert_eq!(Layout::Wide.header_len(), 32);
    }

    #[test]
    fn headers_read_as_criu_lays_them_out() {
        // CRIU 4.2's `struct page_server_iov` for ADD_F of 3 pages of pid 7, flags
        // PE_PRESENT, at 0x7f0000001000: cmd, padding, nr_pages, vaddr, dst_id.
        let mut wide = Vec::new();
        wide.extend_from_slice(&(4u32 << 16 | 6).to_le_bytes());
        wide.extend_from_slice(&[0xaa; 4]);
        wide.extend_from_slice(&3u64.to_le_bytes());
        wide.extend_from_slice(&0x7f00_0000_1000u64.to_le_bytes());
        wide.extend_from_slice(&(7u64 << 8 | 1).to_le_bytes());
        let add = Command::Add {
            target: Target::Task(7),
            vaddr: 0x7f00_0000_1000,
            nr_pages: 3,
            flags: PE_PRESENT,
        };
        assert_eq!(Layout::Wide.decode(&wide), Ok(add));
        // CRIU 4.1's: no padding, a 32-bit count.
        let mut narrow = Vec::new();
        narrow.extend_from_slice(&(4u32 << 16 | 6).to_le_bytes());
        narrow.extend_from_slice(&3u32.to_le_bytes());
        narrow.extend_from_slice(&0x7f00_0000_1000u64.to_le_bytes());
        narrow.extend_from_slice(&(7u64 << 8 | 1).to_le_bytes());
        assert_eq!(Layout::Narrow.decode(&narrow), Ok(add));
        for layout in [Layout::Narrow, Layout::Wide] {
            for command in [
                add,
                Command::Open {
                    target: Target::Shmem(0x1234),
                    answered: true,
                },
                Command::Open {
                    target: Target::Task(1),
                    answered: false,
                },
                Command::Parent {
                    target: Target::Task(9),
                },
                Command::Close,
            ] {
                let bytes = layout.encode(&command);
                assert_eq!(bytes.len(), layout.header_len());
                assert_eq!(layout.decode(&bytes), Ok(command));
            }
        }
    }

    #[test]
    fn old_names_for_the_two_pagemap_types_are_understood() {
        assert_eq!(Target::of(5 << 8 | 11), Some(Target::Task(5)));
        assert_eq!(Target::of(5 << 8 | 34), Some(Target::Shmem(5)));
        assert_eq!(Target::of(5 << 8 | 3), None);
        assert_eq!(Target::Task(12).pagemap_name(), "pagemap-12.img");
        assert_eq!(Target::Shmem(12).pagemap_name(), "pagemap-shmem-12.img");
    }

    #[test]
    fn what_is_not_criu_s_is_named() {
        let mut bytes = Layout::Wide.encode(&Command::Close);
        bytes[..4].copy_from_slice(&0x99u32.to_le_bytes());
        assert_eq!(
            Layout::Wide.decode(&bytes),
            Err(WireError::UnknownCommand { cmd: 0x99 })
        );
        let mut bytes = Layout::Wide.encode(&Command::Parent {
            target: Target::Task(1),
        });
        bytes[24] = 3;
        assert_eq!(
            Layout::Wide.decode(&bytes),
            Err(WireError::UnknownTarget { dst_id: 1 << 8 | 3 })
        );
        // HOLE and plain ADD carry their flags in the command.
        let hole = 2u32.to_le_bytes();
        let mut bytes = Layout::Narrow.encode(&Command::Close);
        bytes[..4].copy_from_slice(&hole);
        bytes[16..24].copy_from_slice(&(3u64 << 8 | 1).to_le_bytes());
        assert!(matches!(
            Layout::Narrow.decode(&bytes),
            Ok(Command::Add {
                flags: PE_PARENT,
                ..
            })
        ));
    }
}
