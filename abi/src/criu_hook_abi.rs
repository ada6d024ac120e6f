//! Which plugin hook ABI ([`HookAbi`]) a CRIU binary has, told from the binary itself.
//!
//! CRIU's version string cannot tell it: criu-dev, whose RESTORE_EXT_FILE takes a second
//! argument, calls itself 4.2 like the release whose RESTORE_EXT_FILE takes one, and
//! `CRIU_PLUGIN_VERSION` did not change either. What does change with the hook ABI is
//! the list of hooks CRIU knows: for every hook `criu/plugin.c` looks up a legacy
//! plugin's function by name (`__assign_hook(RESTORE_INIT, "cr_plugin_restore_init")`),
//! so the binary's read-only data holds one such name for each hook below its
//! `CR_PLUGIN_HOOK__MAX`, and no other. The names are read from the ELF's `.rodata`
//! only (not from debug information, which names types and variables too):
//!
//! | names present                                   | ABI                      |
//! |-------------------------------------------------|--------------------------|
//! | the 12 of hooks 0-11                            | [`HookAbi::Criu41`]      |
//! | those and `cr_plugin_post_forking`              | [`HookAbi::Criu42`]      |
//! | those, `cr_plugin_restore_init` and `cr_plugin_dump_devices_late` | [`HookAbi::Criu43`] |
//!
//! Anything else (a hook of 0-11 missing, RESTORE_INIT without DUMP_DEVICES_LATE or the
//! other way round) is not a CRIU gpucr knows, and is an error, never a guess. CRIU took
//! the second RESTORE_EXT_FILE argument (fb02dbf68) in the same series that added
//! RESTORE_INIT (db0ec806d) and DUMP_DEVICES_LATE (d43217dad); no release has one
//! without the others.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::plugin_abi::{hook, HookAbi};

/// The names `criu/plugin.c` looks legacy hooks up by, indexed by hook number.
pub const HOOK_NAMES: [&str; hook::MAX_KNOWN] = [
    "cr_plugin_dump_unix_sk",
    "cr_plugin_restore_unix_sk",
    "cr_plugin_dump_file",
    "cr_plugin_restore_file",
    "cr_plugin_dump_ext_mount",
    "cr_plugin_restore_ext_mount",
    "cr_plugin_dump_ext_link",
    "cr_plugin_handle_device_vma",
    "cr_plugin_update_vma_map",
    "cr_plugin_resume_devices_late",
    "cr_plugin_pause_devices",
    "cr_plugin_checkpoint_devices",
    "cr_plugin_post_forking",
    "cr_plugin_restore_init",
    "cr_plugin_dump_devices_late",
];

/// Why a binary's hook ABI could not be told.
#[derive(Debug, thiserror::Error)]
pub enum DetectError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not a 64-bit little-endian ELF file with sections ({why})")]
    NotElf { path: PathBuf, why: &'static str },
    #[error("{path} has no .rodata section")]
    NoRodata { path: PathBuf },
    #[error(
        "{path} is not a CRIU binary gpucr knows: it does not name the plugin hooks {missing:?}"
    )]
    NotCriu {
        path: PathBuf,
        missing: Vec<&'static str>,
    },
    #[error(
        "{path} names a set of plugin hooks no CRIU gpucr knows has (of 12-14: {found:?}); \
         gpucr knows CRIU 4.1, 4.2, 4.3 and criu-dev"
    )]
    UnknownHooks {
        path: PathBuf,
        found: Vec<&'static str>,
    },
}

/// The hook ABI of the CRIU running this code (the plugin, inside CRIU).
pub fn of_running_criu() -> Result<HookAbi, DetectError> {
    of_file(Path::new("/proc/self/exe"))
}

/// The hook ABI of the CRIU binary at `path`.
pub fn of_file(path: &Path) -> Result<HookAbi, DetectError> {
    let read = |source| DetectError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(read)?;
    let rodata = read_rodata(path, |offset, len| {
        let mut buf = vec![0; len];
        file.read_exact_at(&mut buf, offset).map(|()| buf)
    })?;
    of_rodata(path, &rodata)
}

/// The hook ABI of a CRIU binary held in memory (`path` names it in errors).
pub fn of_bytes(path: &Path, elf: &[u8]) -> Result<HookAbi, DetectError> {
    let rodata = read_rodata(path, |offset, len| {
        usize::try_from(offset)
            .ok()
            .and_then(|start| elf.get(start..start.checked_add(len)?))
            .map(<[u8]>::to_vec)
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))
    })?;
    of_rodata(path, &rodata)
}

/// The ABI whose hook names `rodata` holds.
fn of_rodata(path: &Path, rodata: &[u8]) -> Result<HookAbi, DetectError> {
    let named: Vec<bool> = HOOK_NAMES
        .iter()
        .map(|name| {
            let mut needle = name.as_bytes().to_vec();
            needle.push(0);
            memchr::memmem::find(rodata, &needle).is_some()
        })
        .collect();
    let missing: Vec<&'static str> = HOOK_NAMES[..hook::POST_FORKING]
        .iter()
        .zip(&named)
        .filter(|(_, &present)| !present)
        .map(|(name, _)| *name)
        .collect();
    if !missing.is_empty() {
        return Err(DetectError::NotCriu {
            path: path.to_path_buf(),
            missing,
        });
    }
    match (
        named[hook::POST_FORKING],
        named[hook::RESTORE_INIT],
        named[hook::DUMP_DEVICES_LATE],
    ) {
        (false, false, false) => Ok(HookAbi::Criu41),
        (true, false, false) => Ok(HookAbi::Criu42),
        (true, true, true) => Ok(HookAbi::Criu43),
        _ => Err(DetectError::UnknownHooks {
            path: path.to_path_buf(),
            found: (hook::POST_FORKING..hook::MAX_KNOWN)
                .filter(|&i| named[i])
                .map(|i| HOOK_NAMES[i])
                .collect(),
        }),
    }
}

/// The `.rodata` section of the ELF file read through `read_at(offset, len)`.
fn read_rodata(
    path: &Path,
    read_at: impl Fn(u64, usize) -> io::Result<Vec<u8>>,
) -> Result<Vec<u8>, DetectError> {
    let not_elf = |why| DetectError::NotElf {
        path: path.to_path_buf(),
        why,
    };
    let header = read_at(0, ELF_HEADER_LEN).map_err(|_| not_elf("shorter than an ELF header"))?;
    if header[..4] != *b"\x7fELF" {
        return Err(not_elf("no ELF magic"));
    }
    if header[4] != ELFCLASS64 || header[5] != ELFDATA2LSB {
        return Err(not_elf("not 64-bit little-endian"));
    }
    let shoff = u64_at(&header, 0x28);
    let shentsize = usize::from(u16_at(&header, 0x3a));
    let shnum = usize::from(u16_at(&header, 0x3c));
    let shstrndx = usize::from(u16_at(&header, 0x3e));
    if shentsize < SECTION_HEADER_LEN || shnum == 0 || shstrndx >= shnum {
        return Err(not_elf("no usable section header table"));
    }
    let table = read_at(shoff, shentsize * shnum)
        .map_err(|_| not_elf("section header table past the end of the file"))?;
    let section = |i: usize| Section::parse(&table[i * shentsize..][..SECTION_HEADER_LEN]);
    let names = section(shstrndx);
    let names = read_at(names.offset, names.size)
        .map_err(|_| not_elf("section names past the end of the file"))?;
    let rodata = (0..shnum)
        .map(section)
        .find(|s| {
            names
                .get(s.name as usize..)
                .is_some_and(|n| n.starts_with(b".rodata\0"))
        })
        .ok_or_else(|| DetectError::NoRodata {
            path: path.to_path_buf(),
        })?;
    read_at(rodata.offset, rodata.size).map_err(|_| not_elf(".rodata past the end of the file"))
}

const ELF_HEADER_LEN: usize = 64;
const SECTION_HEADER_LEN: usize = 64;
const ELFCLASS64: u8 = 2;
const ELFDATA2LSB: u8 = 1;

/// The fields of an `Elf64_Shdr` this reader needs.
struct Section {
    name: u32,
    offset: u64,
    size: usize,
}

impl Section {
    fn parse(raw: &[u8]) -> Section {
        Section {
            name: u32::from_le_bytes(raw[0..4].try_into().expect("4 bytes")),
            offset: u64_at(raw, 24),
            size: usize::try_from(u64_at(raw, 32)).unwrap_or(usize::MAX),
        }
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF file: header, section names, a `.rodata` holding `rodata`, and the
    /// section header table (null, .shstrtab, .rodata).
    fn elf_with_rodata(rodata: &[u8]) -> Vec<u8> {
        let shstrtab = b"\0.shstrtab\0.rodata\0";
        let shstrtab_off = ELF_HEADER_LEN;
        let rodata_off = shstrtab_off + shstrtab.len();
        let shoff = rodata_off + rodata.len();
        let mut elf = vec![0u8; ELF_HEADER_LEN];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = ELFCLASS64;
        elf[5] = ELFDATA2LSB;
        elf[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        elf[0x3a..0x3c].copy_from_slice(&(SECTION_HEADER_LEN as u16).to_le_bytes());
        elf[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        elf[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
        elf.extend_from_slice(shstrtab);
        elf.extend_from_slice(rodata);
        let header = |name: u32, off: usize, size: usize| {
            let mut h = vec![0u8; SECTION_HEADER_LEN];
            h[0..4].copy_from_slice(&name.to_le_bytes());
            h[24..32].copy_from_slice(&(off as u64).to_le_bytes());
            h[32..40].copy_from_slice(&(size as u64).to_le_bytes());
            h
        };
        elf.extend(header(0, 0, 0));
        elf.extend(header(1, shstrtab_off, shstrtab.len()));
        elf.extend(header(11, rodata_off, rodata.len()));
        elf
    }

    /// `.rodata` naming the hooks `hooks` among other strings, as CRIU's does.
    fn rodata_naming(hooks: impl IntoIterator<Item = usize>) -> Vec<u8> {
        let mut rodata = b"Plugin %s has %u assigned while max %u supported\n\0".to_vec();
        for i in hooks {
            rodata.extend_from_slice(HOOK_NAMES[i].as_bytes());
            rodata.push(0);
            rodata.extend_from_slice(b"unrelated\0");
        }
        rodata
    }

    fn detect(hooks: impl IntoIterator<Item = usize>) -> Result<HookAbi, DetectError> {
        of_bytes(Path::new("criu"), &elf_with_rodata(&rodata_naming(hooks)))
    }

    #[test]
    fn each_criu_is_told_by_the_hooks_it_names() {
        assert_eq!(detect(0..12).unwrap(), HookAbi::Criu41);
        assert_eq!(detect(0..13).unwrap(), HookAbi::Criu42);
        assert_eq!(detect(0..15).unwrap(), HookAbi::Criu43);
        // The order of the strings is the linker's business.
        assert_eq!(detect((0..15).rev()).unwrap(), HookAbi::Criu43);
        for abi in HookAbi::ALL {
            assert_eq!(detect(0..abi.max_hooks()).unwrap(), abi);
        }
    }

    #[test]
    fn half_a_new_abi_is_refused_not_guessed() {
        // RESTORE_INIT without DUMP_DEVICES_LATE, and the other way round, and the
        // 4.3 hooks without 4.2's: no CRIU gpucr knows.
        for hooks in [
            (0..14).collect::<Vec<_>>(),
            (0..13).chain([14]).collect(),
            (0..12).chain([13, 14]).collect(),
            (0..12).chain([14]).collect(),
        ] {
            let err = detect(hooks.clone()).unwrap_err();
            assert!(
                matches!(err, DetectError::UnknownHooks { .. }),
                "{hooks:?}: {err}"
            );
        }
    }

    #[test]
    fn a_binary_without_criu_hooks_is_not_criu() {
        let err = detect((0..15).filter(|&i| i != hook::RESTORE_EXT_FILE)).unwrap_err();
        match err {
            DetectError::NotCriu { missing, .. } => assert_eq!(missing, ["cr_plugin_restore_file"]),
            other => panic!("{other}"),
        }
        // The test binary itself is an ELF file that names no hook.
        let err = of_file(Path::new("/proc/self/exe")).unwrap_err();
        assert!(matches!(err, DetectError::NotCriu { .. }), "{err}");
    }

    #[test]
    fn names_must_end_where_criu_s_do() {
        // "cr_plugin_restore_init_x" is not RESTORE_INIT's name; a name sharing its
        // tail with a longer string (the linker merges those) still counts.
        let mut rodata = rodata_naming(0..13);
        rodata.extend_from_slice(b"cr_plugin_restore_init_x\0cr_plugin_dump_devices_later\0");
        let elf = elf_with_rodata(&rodata);
        assert_eq!(of_bytes(Path::new("criu"), &elf).unwrap(), HookAbi::Criu42);
        let mut rodata = rodata_naming(0..13);
        rodata.extend_from_slice(b"xcr_plugin_restore_init\0xcr_plugin_dump_devices_late\0");
        let elf = elf_with_rodata(&rodata);
        assert_eq!(of_bytes(Path::new("criu"), &elf).unwrap(), HookAbi::Criu43);
    }

    #[test]
    fn names_outside_rodata_do_not_count() {
        // Debug information names the same functions; only .rodata is read.
        let mut elf = elf_with_rodata(&rodata_naming(0..13));
        elf.extend_from_slice(&rodata_naming(13..15));
        assert_eq!(of_bytes(Path::new("criu"), &elf).unwrap(), HookAbi::Criu42);
    }

    #[test]
    fn broken_files_are_named_errors() {
        let path = Path::new("criu");
        for (bytes, expect) in [
            (b"#!/bin/sh\n".to_vec(), "shorter than an ELF header"),
            (vec![0u8; 64], "no ELF magic"),
        ] {
            let err = of_bytes(path, &bytes).unwrap_err();
            assert!(err.to_string().contains(expect), "{err}");
        }
        let mut elf = elf_with_rodata(b"x\0");
        let len = elf.len();
        elf.truncate(len - 10);
        let err = of_bytes(path, &elf).unwrap_err();
        assert!(err.to_string().contains("section header table"), "{err}");
        let err = of_file(Path::new("/nonexistent/criu")).unwrap_err();
        assert!(
            err.to_string().starts_with("cannot read /nonexistent/criu"),
            "{err}"
        );
    }
}
