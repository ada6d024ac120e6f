//! `--criu-config FILE`: CRIU options gpucr has no flag for, from a file in CRIU's own
//! configuration format (criu(8), "CONFIGURATION FILES").
//!
//! The file is read and checked before anything is touched, and CRIU gets the checked
//! options (RPC `config_file`), never the file itself:
//! - its syntax is CRIU's: one option per line, its long name without dashes, then at
//!   most one value (in double quotes when it holds spaces), `#` comments. What CRIU
//!   would refuse (CRIU 4.2 exits on a malformed line) or silently misread (a `#` inside
//!   a value cuts it) is refused here with the line number;
//! - options gpucr sets itself, or whose effect would make gpucr's image or bookkeeping
//!   wrong (the image directory, CRIU's log, whether the tree lives on, the network
//!   lock, page servers, incremental dumps, ...), are refused with the gpucr flag to use
//!   instead. CRIU applies a config file over every RPC setting, so one such line would
//!   quietly override gpucr's;
//! - every option must be one of CRIU 4.2's (`criu::options`), with a value where CRIU
//!   needs one and none where it takes none, and a value of the form CRIU parses where
//!   it parses a number or one of a set of words;
//! - CRIU itself ignores a config file that does not exist; gpucr names it.
//!
//! What is left (`ghost-limit`, `tcp-close`, `link-remap`, `external`,
//! `manage-cgroups`, `skip-in-flight`, ...) goes to CRIU as written, through a sealed
//! in-memory copy that CRIU reads as `/proc/self/fd/N`.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use super::options;
use crate::exit_code::{self, ExitCode};

/// Why a `--criu-config` file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CriuConfigError {
    #[error("--criu-config {path}: cannot read it")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("--criu-config {path}, line {line}: {reason}")]
    Syntax {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("--criu-config {path}, line {line}: `{option}` is set by gpucr: {instead}")]
    Managed {
        path: PathBuf,
        line: usize,
        option: String,
        instead: &'static str,
    },
    #[error("cannot hand the CRIU options of {path} to CRIU")]
    Handover {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl ExitCode for CriuConfigError {
    /// A file that cannot be read or used is a bad argument; the machine failing to hand
    /// it over is not.
    fn exit_code(&self) -> u8 {
        match self {
            CriuConfigError::Handover { .. } => exit_code::FAILURE,
            _ => exit_code::USAGE,
        }
    }
}

/// The largest config file read (CRIU's own are a few lines).
const MAX_FILE_BYTES: u64 = 1 << 20;

/// One option of a config file: CRIU's long name and its value, if it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CriuOption {
    pub name: String,
    pub value: Option<String>,
}

impl CriuOption {
    /// The option as one line of a CRIU config file: `name=value`, which getopt reads
    /// for every option (`name value` leaves the value behind for the options whose
    /// value is optional: CRIU would read `manage-cgroups full` as `manage-cgroups`),
    /// or `name "value"` for a value with blanks or quotes, which only options whose
    /// value is required may have (see [`parse_line`]).
    pub fn to_line(&self) -> String {
        match &self.value {
            None => self.name.clone(),
            Some(v) if needs_quotes(v) => {
                format!("{} \"{}\"", self.name, v.replace('"', "\\\""))
            }
            Some(v) => format!("{}={v}", self.name),
        }
    }
}

/// A value CRIU reads only in double quotes.
fn needs_quotes(value: &str) -> bool {
    value.is_empty() || value.contains([' ', '\t', '"'])
}

/// True when `name` (or the option it abbreviates) takes an optional value (getopt's
/// `optional_argument`): such a value must follow `=`, so it cannot be quoted.
fn takes_optional_value(name: &str) -> bool {
    matches!(options::resolve(name), Ok((_, options::Arg::Optional)))
}

/// A checked `--criu-config` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CriuConfig {
    /// The file as given.
    pub path: PathBuf,
    pub options: Vec<CriuOption>,
}

const DUMP_DIR: &str = "gpucr writes the image into DIR and checksums every file of it";
const WHOLE: &str =
    "the image is written whole into DIR, where gpucr checksums it (no page server, lazy \
     pages or streaming)";
const INCREMENTAL: &str = "gpucr writes whole images (no pre-dumps or parent images)";
const LOG: &str = "gpucr keeps CRIU's log in DIR (dump.log, restore.log) and reads it";
const RECORDED: &str =
    "use gpucr's flag of the same name (the image records it, and the restore reuses it)";

/// CRIU's options that a config file may not set (CRIU 4.2's long names), each with
/// what to use instead.
const MANAGED: &[(&str, &str)] = &[
    ("tree", "give the tree's root as `gpucr dump PID`"),
    (
        "leave-running",
        "use `gpucr dump --leave-running` (gpucr must know whether the tree lives on)",
    ),
    (
        "leave-stopped",
        "gpucr either kills the tree or lets it run on (`--leave-running`)",
    ),
    ("restore-detached", "use `gpucr restore --detach`"),
    (
        "restore-sibling",
        "gpucr restores the tree as its own child",
    ),
    ("daemon", "use `gpucr restore --detach`"),
    (
        "pidfile",
        "`gpucr restore --detach` prints the restored root's pid",
    ),
    ("exec-cmd", "gpucr waits for the restored tree itself"),
    ("images-dir", DUMP_DIR),
    ("work-dir", DUMP_DIR),
    ("log-file", LOG),
    ("log-pid", LOG),
    ("status-fd", "gpucr follows CRIU over its RPC socket"),
    (
        "root",
        "gpucr sets CRIU's root for trees with a mount namespace of their own",
    ),
    (
        "libdir",
        "gpucr chooses CRIU's plugins (its own must load for GPU trees)",
    ),
    (
        "inherit-fd",
        "gpucr hands CRIU the descriptors its plugin needs",
    ),
    ("page-server", WHOLE),
    ("address", WHOLE),
    ("port", WHOLE),
    ("ps-socket", WHOLE),
    ("lazy-pages", WHOLE),
    ("stream", WHOLE),
    ("prev-images-dir", INCREMENTAL),
    ("track-mem", INCREMENTAL),
    ("auto-dedup", INCREMENTAL),
    ("pre-dump-mode", INCREMENTAL),
    ("network-lock", RECORDED),
    ("tcp-established", RECORDED),
    ("shell-job", RECORDED),
    ("ext-unix-sk", RECORDED),
    ("file-locks", RECORDED),
    ("timeout", "use `gpucr dump --timeout`"),
    (
        "verbosity",
        "use `gpucr -v`, with which CRIU logs at debug level (CRIU takes no log level \
         from an RPC config file)",
    ),
    ("config", "give one file, with --criu-config"),
    ("no-default-config", "give one file, with --criu-config"),
    ("help", "not an option of a dump or restore"),
    ("version", "not an option of a dump or restore"),
];

/// The variable naming a config file every CRIU run reads (CRIU's own).
pub const CRIU_CONFIG_ENV: &str = "CRIU_CONFIG_FILE";

/// The config files CRIU reads by itself (criu(8)): the system's, the user's and the
/// one `CRIU_CONFIG_FILE` names. The CRIU gpucr runs reads none of them.
pub fn default_config_files() -> Vec<PathBuf> {
    let mut files = vec![PathBuf::from("/etc/criu/default.conf")];
    if let Some(home) = std::env::var_os("HOME") {
        files.push(Path::new(&home).join(".criu/default.conf"));
    }
    if let Some(file) = std::env::var_os(CRIU_CONFIG_ENV) {
        files.push(PathBuf::from(file));
    }
    files
}

/// A note for those of `files` that hold options, which the CRIU gpucr runs does not
/// read (it would take them beneath gpucr's settings, unchecked); None when none does.
pub fn unread_config_note(files: &[PathBuf]) -> Option<String> {
    let with_options: Vec<String> = files
        .iter()
        .filter(|path| {
            read_bounded(path).is_ok_and(|bytes| {
                String::from_utf8_lossy(&bytes)
                    .lines()
                    .any(|line| !matches!(parse_line(line), Ok(None)))
            })
        })
        .map(|path| path.display().to_string())
        .collect();
    (!with_options.is_empty()).then(|| {
        format!(
            "CRIU's config {} not read by the CRIU gpucr runs: give the options it needs \
             with --criu-config FILE (or GPUCR_CRIU_CONFIG), where gpucr checks them",
            match with_options.as_slice() {
                [one] => format!("file {one} is"),
                many => format!("files {} are", many.join(", ")),
            }
        )
    })
}

/// CRIU failures that an option gpucr has no flag for overcomes: a fragment of CRIU's
/// message, and the line to put in a `--criu-config` file, with why.
const ADVICE: &[(&str, &str)] = &[
    (
        "Can't dump ghost file",
        "`ghost-limit SIZE` (e.g. `ghost-limit 64M`): the tree holds a deleted file larger \
         than CRIU's ghost-limit (1 MiB), whose contents go into the image",
    ),
    (
        "Use link-remap option",
        "`link-remap`: the tree holds a file whose last name was removed, which CRIU can \
         keep with a temporary hard link",
    ),
    (
        "In-flight connections can be ignored",
        "`skip-in-flight`: a listening socket has connections not yet accepted, which \
         CRIU can leave out",
    ),
    (
        "Need to set the --tcp-close",
        "`tcp-close`: the image was dumped with tcp-close, and its TCP connections are \
         restored closed only with it",
    ),
];

/// What to put in a `--criu-config` file for a CRIU failure such an option overcomes
/// (`failure` is CRIU's error, with the tail of its log).
pub fn advice_for(failure: &str) -> Option<String> {
    ADVICE
        .iter()
        .find(|(fragment, _)| failure.contains(fragment))
        .map(|(_, line)| format!("a file given with --criu-config may hold the line {line}"))
}

/// The bytes of a config file. A FIFO or a device would block or never end: only a
/// regular file of at most [`MAX_FILE_BYTES`] is read.
fn read_bounded(path: &Path) -> io::Result<Vec<u8>> {
    let file = gpucr_criu_image::store::open_regular(path)?;
    let mut bytes = Vec::new();
    (&file).take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "larger than {} KiB: not a CRIU config file",
                MAX_FILE_BYTES >> 10
            ),
        ));
    }
    Ok(bytes)
}

/// The managed option `name` would select in CRIU, if any. CRIU reads its options with
/// getopt_long, which takes any unambiguous prefix of a long name and, for a boolean
/// option, its `no-` form as well: a prefix of a managed name (or of its `no-` form) is
/// refused like the name itself.
fn managed(name: &str) -> Option<&'static (&'static str, &'static str)> {
    MANAGED.iter().find(|(managed, _)| {
        managed.starts_with(name)
            || name
                .strip_prefix("no-")
                .is_some_and(|rest| !rest.is_empty() && managed.starts_with(rest))
    })
}

impl CriuConfig {
    /// Read and check `path`.
    pub fn read(path: &Path) -> Result<CriuConfig, CriuConfigError> {
        let read_error = |source| CriuConfigError::Read {
            path: path.to_path_buf(),
            source,
        };
        let bytes = read_bounded(path).map_err(read_error)?;
        let text = String::from_utf8(bytes).map_err(|e| {
            let before = &e.as_bytes()[..e.utf8_error().valid_up_to()];
            CriuConfigError::Syntax {
                path: path.to_path_buf(),
                line: before.iter().filter(|b| **b == b'\n').count() + 1,
                reason: "not UTF-8 text".into(),
            }
        })?;
        Self::parse(path, &text)
    }

    /// Check the text of a config file read from `path`.
    pub fn parse(path: &Path, text: &str) -> Result<CriuConfig, CriuConfigError> {
        let mut options = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let syntax = |reason: &str| CriuConfigError::Syntax {
                path: path.to_path_buf(),
                line: index + 1,
                reason: reason.to_owned(),
            };
            let Some(option) = parse_line(line).map_err(syntax)? else {
                continue;
            };
            if let Some((_, instead)) = managed(&option.name) {
                return Err(CriuConfigError::Managed {
                    path: path.to_path_buf(),
                    line: index + 1,
                    option: option.name,
                    instead,
                });
            }
            // CRIU refuses an option it does not know, or a value where it takes none or
            // none where it needs one, before it opens its log; it reads some malformed
            // values without a word (`ghost-limit abc`: a limit of 0).
            if let Some(reason) = options::check(&option.name, option.value.as_deref()) {
                return Err(syntax(&reason));
            }
            options.push(option);
        }
        Ok(CriuConfig {
            path: path.to_path_buf(),
            options,
        })
    }

    /// The options as a CRIU config file, one per line.
    pub fn to_text(&self) -> String {
        self.options.iter().map(|o| o.to_line() + "\n").collect()
    }

    /// The options in a sealed in-memory file, for CRIU to read.
    pub fn handover(&self) -> Result<ConfigHandover, CriuConfigError> {
        let handover_error = |source: io::Error| CriuConfigError::Handover {
            path: self.path.clone(),
            source,
        };
        use nix::sys::memfd::{memfd_create, MFdFlags};
        let fd = memfd_create(
            c"gpucr-criu-config",
            MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
        )
        .map_err(|e| handover_error(e.into()))?;
        let mut file = std::fs::File::from(fd);
        file.write_all(self.to_text().as_bytes())
            .map_err(handover_error)?;
        use nix::fcntl::{fcntl, FcntlArg, SealFlag};
        let seals = SealFlag::F_SEAL_SEAL
            | SealFlag::F_SEAL_SHRINK
            | SealFlag::F_SEAL_GROW
            | SealFlag::F_SEAL_WRITE;
        fcntl(&file, FcntlArg::F_ADD_SEALS(seals)).map_err(|e| handover_error(e.into()))?;
        Ok(ConfigHandover { fd: file.into() })
    }
}

/// The checked options in a sealed memfd. CRIU inherits it at the same number (see
/// [`crate::criu::start_criu`]'s `inherit`) and reads it as [`ConfigHandover::criu_path`].
#[derive(Debug)]
pub struct ConfigHandover {
    fd: OwnedFd,
}

impl ConfigHandover {
    /// The descriptor CRIU must inherit.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The path of the options in CRIU's process (RPC `config_file`).
    pub fn criu_path(&self) -> String {
        format!("/proc/self/fd/{}", self.fd.as_raw_fd())
    }
}

/// One line of a config file, read as CRIU 4.2's `parse_statement` reads it: `None` for
/// a blank or comment line, the option otherwise; a line CRIU would refuse or misread is
/// an error.
fn parse_line(line: &str) -> Result<Option<CriuOption>, &'static str> {
    let line = line.trim_start();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    // CRIU splits the name at the first space (at a tab only when there is no space).
    let split = line.find(' ').or_else(|| line.find('\t'));
    let (word, rest) = match split {
        Some(at) => (&line[..at], &line[at + 1..]),
        None => (line, ""),
    };
    // getopt_long also reads `--name=value`.
    let (name, inline_value) = match word.split_once('=') {
        Some((name, value)) => (name, Some(value)),
        None => (word, None),
    };
    if name.starts_with('-') {
        return Err("write the option's long name without dashes (CRIU adds them)");
    }
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err("an option name is CRIU's long name: lower-case letters, digits and dashes");
    }
    let rest = rest.trim_start();
    let value = match (inline_value, rest) {
        (Some(_), r) if !r.is_empty() && !r.starts_with('#') => {
            return Err("an option has at most one value")
        }
        (Some(v), _) => {
            if v.contains(['#', '"']) {
                return Err("write a value with `#` or `\"` in double quotes, after a space");
            }
            Some(v.to_owned())
        }
        (None, "") => None,
        (None, r) if r.starts_with('#') => None,
        (None, r) if r.starts_with('"') => Some(quoted(&r[1..])?),
        (None, r) => {
            let value = r.split('#').next().unwrap_or_default().trim_end();
            if value.contains(char::is_whitespace) {
                return Err("an option has at most one value (quote a value with spaces)");
            }
            if value.contains('"') {
                return Err("a value with `\"` must be quoted as a whole");
            }
            Some(value.to_owned())
        }
    };
    if value.as_deref().is_some_and(needs_quotes) && takes_optional_value(name) {
        return Err("this option's value is optional, which CRIU reads only after `=`: it cannot be empty, quoted or hold blanks");
    }
    Ok(Some(CriuOption {
        name: name.to_owned(),
        value,
    }))
}

/// The value of a quoted string whose opening quote has been read: up to the next `"`
/// not escaped as `\"`, followed by nothing but blanks or a comment.
fn quoted(text: &str) -> Result<String, &'static str> {
    let mut value = String::new();
    let mut chars = text.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match c {
            '\\' if chars.peek().is_some_and(|(_, next)| *next == '"') => {
                chars.next();
                value.push('"');
            }
            '"' => {
                let after = text[at + 1..].trim_start();
                if !after.is_empty() && !after.starts_with('#') {
                    return Err("nothing but a comment may follow a quoted value");
                }
                if value.contains('#') {
                    // CRIU cuts every value at its first `#`, quoted or not.
                    return Err("CRIU cuts a value at `#`, even in quotes");
                }
                return Ok(value);
            }
            c => value.push(c),
        }
    }
    Err("a quoted value has no closing `\"`")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<CriuConfig, CriuConfigError> {
        CriuConfig::parse(Path::new("/etc/x.conf"), text)
    }

    fn option(name: &str, value: Option<&str>) -> CriuOption {
        CriuOption {
            name: name.into(),
            value: value.map(Into::into),
        }
    }

    #[test]
    fn reads_criu_syntax() {
        let config = parse(
            "# a comment\n\
             \n\
             \x20  tcp-close\n\
             ghost-limit 8M   # bigger ghosts\n\
             lsm-profile \"selinux:a b\"\n\
             external \"mnt[a]:\\\"x\\\"\"\n\
             manage-cgroups=full\n\
             skip-in-flight # a boolean\n\
             file-validation\tfilesize\n",
        )
        .unwrap();
        assert_eq!(
            config.options,
            vec![
                option("tcp-close", None),
                option("ghost-limit", Some("8M")),
                option("lsm-profile", Some("selinux:a b")),
                option("external", Some("mnt[a]:\"x\"")),
                option("manage-cgroups", Some("full")),
                option("skip-in-flight", None),
                option("file-validation", Some("filesize")),
            ]
        );
    }

    /// CRIU would read `manage-cgroups full` as `manage-cgroups` (getopt leaves an
    /// optional value behind unless it follows `=`): CRIU gets `manage-cgroups=full`.
    #[test]
    fn optional_values_reach_criu_after_an_equals_sign() {
        let config =
            parse("manage-cgroups full\ncpu-cap fpu\nghost-limit 8M\nlsm-profile \"a b\"\n")
                .unwrap();
        assert_eq!(
            config.to_text(),
            "manage-cgroups=full\ncpu-cap=fpu\nghost-limit=8M\nlsm-profile \"a b\"\n"
        );
    }

    #[test]
    fn what_it_hands_to_criu_reads_back_the_same() {
        let config = parse(
            "ghost-limit 8M\nlsm-profile \"a b\"\nexternal \"x\\\"y\"\ncgroup-root \"\"\ntcp-close\n",
        )
        .unwrap();
        let again = parse(&config.to_text()).unwrap();
        assert_eq!(again.options, config.options);
    }

    #[test]
    fn lines_criu_would_refuse_or_misread_name_their_line() {
        for (text, line) in [
            ("tcp-close\n--ghost-limit 8M\n", 2),
            ("ghost-limit 8M 9M\n", 1),
            ("\n\nlsm-profile \"unclosed\n", 3),
            ("lsm-profile \"a\" b\n", 1),
            ("external \"mnt[#]\"\n", 1),
            ("Ghost-Limit 8M\n", 1),
            ("ghost-limit=8M 9M\n", 1),
            ("external a\"b\n", 1),
            ("manage-cgroups \"a b\"\n", 1),
            ("cpu-cap \"\"\n", 1),
        ] {
            match parse(text) {
                Err(CriuConfigError::Syntax { line: l, path, .. }) => {
                    assert_eq!(
                        (l, path.as_path()),
                        (line, Path::new("/etc/x.conf")),
                        "{text:?}"
                    )
                }
                other => panic!("{text:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn options_gpucr_sets_are_refused_with_what_to_use_instead() {
        for (text, option) in [
            ("leave-running\n", "leave-running"),
            ("ghost-limit 1M\nimages-dir /tmp\n", "images-dir"),
            ("log-file x.log\n", "log-file"),
            ("tcp-established\n", "tcp-established"),
            ("network-lock skip\n", "network-lock"),
            // getopt_long's abbreviations and boolean negations reach the same options.
            ("leave-r\n", "leave-r"),
            ("no-restore-sibling\n", "no-restore-sibling"),
            ("no-page-s\n", "no-page-s"),
            ("prev-images-dir=../parent\n", "prev-images-dir"),
        ] {
            match parse(text) {
                Err(e @ CriuConfigError::Managed { .. }) => {
                    let CriuConfigError::Managed { option: o, .. } = &e else {
                        unreachable!()
                    };
                    assert_eq!(o, option);
                    assert!(e.to_string().contains("is set by gpucr"), "{e}");
                }
                other => panic!("{text:?}: {other:?}"),
            }
        }
        let e = parse("tcp-established\n").unwrap_err().to_string();
        assert!(
            e.contains("/etc/x.conf, line 1") && e.contains("flag of the same name"),
            "{e}"
        );
    }

    /// Every long option of CRIU 4.2.1 (criu/config.c; `?` marks a boolean, which also
    /// has a `no-` form).
    const CRIU_4_2_OPTIONS: &str = "tree leave-stopped leave-running restore-detached? \
        restore-sibling? daemon? images-dir work-dir log-file join-ns root help close \
        log-pid? version evasive-devices? pidfile veth-pair action-script shell-job? \
        file-locks? page-server? address port prev-images-dir ms track-mem? auto-dedup? \
        libdir cpu-cap force-irmap? ext-mount-map exec-cmd manage-cgroups cgroup-root \
        inherit-fd feature skip-mnt enable-fs enable-external-sharing \
        enable-external-masters freeze-cgroup ghost-limit irmap-scan-path lsm-profile \
        timeout external empty-ns lazy-pages extra? experimental? all cgroup-props \
        cgroup-props-file cgroup-dump-controller deprecated? display-stats? \
        weak-sysctls? status-fd verbosity ps-socket stream? config no-default-config \
        tls-cacert tls-cacrl tls-cert tls-key tls? tls-no-cn-verify cgroup-yard \
        pre-dump-mode file-validation skip-file-rwx-check? lsm-mount-context \
        network-lock mntns-compat-mode? unprivileged? ghost-fiemap? allow-uprobes? \
        tcp-established skip-in-flight tcp-close ext-unix-sk link-remap";

    /// The prefix rule refuses exactly the managed options (and their `no-` forms):
    /// every other option of CRIU's passes.
    #[test]
    fn only_managed_options_are_refused() {
        let mut names = Vec::new();
        for word in CRIU_4_2_OPTIONS.split_whitespace() {
            let name = word.trim_end_matches('?');
            names.push(name);
            let is_managed = MANAGED.iter().any(|(m, _)| *m == name);
            assert_eq!(managed(name).is_some(), is_managed, "{name}");
            if word.ends_with('?') {
                let negated = format!("no-{name}");
                assert_eq!(managed(&negated).is_some(), is_managed, "{negated}");
            }
        }
        for (m, _) in MANAGED {
            assert!(names.contains(m), "{m} is not an option of CRIU 4.2");
        }
        for passed in [
            "ghost-limit",
            "tcp-close",
            "link-remap",
            "external",
            "manage-cgroups",
        ] {
            assert!(managed(passed).is_none(), "{passed}");
        }
    }

    /// The option table the lines are checked against is CRIU 4.2.1's, every name and
    /// every `no-` form: each resolves, and passes or fails by its value alone.
    #[test]
    fn the_option_table_is_criu_4_2s() {
        for word in CRIU_4_2_OPTIONS.split_whitespace() {
            let name = word.trim_end_matches('?');
            assert_eq!(options::resolve(name).unwrap().0, name);
            let negated = format!("no-{name}");
            if word.ends_with('?') {
                assert_eq!(options::resolve(&negated).unwrap().0, negated);
            }
        }
    }

    /// Lines CRIU refuses before it opens its log (so the failure named neither the
    /// file nor the line) or misreads are refused with the file and the line.
    #[test]
    fn options_criu_refuses_are_refused_with_their_line() {
        for (text, line, why) in [
            ("tcp-close\nbogusoption\n", 2, "not an option of CRIU 4.2"),
            ("ghost-limit\n", 1, "`ghost-limit` needs a value"),
            ("tcp-close yes\n", 1, "`tcp-close` takes no value"),
            ("manage-cgroups bogus\n", 1, "`manage-cgroups` takes one of"),
            ("\nexternal\n", 2, "`external` needs a value"),
            ("ghost-limit abc\n", 1, "would read it as 0 bytes"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(
                matches!(e, CriuConfigError::Syntax { line: l, .. } if l == line),
                "{text:?}: {e:?}"
            );
            let message = e.to_string();
            assert!(
                message.starts_with(&format!("--criu-config /etc/x.conf, line {line}: "))
                    && message.contains(why),
                "{text:?}: {message}"
            );
            assert_eq!(e.exit_code(), exit_code::USAGE);
        }
    }

    #[test]
    fn criu_failures_an_option_overcomes_get_advice_naming_an_allowed_option() {
        let advice = advice_for("Error (criu/files-reg.c:1031): Can't dump ghost file /x of 3145728 size, increase limit").unwrap();
        assert!(advice.contains("`ghost-limit SIZE`"), "{advice}");
        assert_eq!(advice_for("Error: Dumping FAILED."), None);
        for (_, line) in ADVICE {
            let name = line
                .trim_start_matches('`')
                .split(['`', ' '])
                .next()
                .unwrap();
            assert!(managed(name).is_none(), "{name} would be refused");
        }
    }

    #[test]
    fn config_files_with_options_are_named_as_unread() {
        let dir = tempfile::tempdir().unwrap();
        let (empty, set, missing) = (
            dir.path().join("empty.conf"),
            dir.path().join("set.conf"),
            dir.path().join("missing.conf"),
        );
        std::fs::write(&empty, "# nothing\n\n").unwrap();
        std::fs::write(&set, "# one\ntcp-close\n").unwrap();
        assert_eq!(unread_config_note(&[empty.clone(), missing.clone()]), None);
        let note = unread_config_note(&[empty, set.clone(), missing]).unwrap();
        assert!(
            note.contains(&format!("file {} is not read", set.display())),
            "{note}"
        );
        let note = unread_config_note(&[set.clone(), set]).unwrap();
        assert!(
            note.contains("files ") && note.contains(" are not read"),
            "{note}"
        );
    }

    #[test]
    fn a_missing_file_is_named() {
        let e = CriuConfig::read(Path::new("/nonexistent/criu.conf")).unwrap_err();
        assert!(matches!(e, CriuConfigError::Read { .. }));
        assert!(e.to_string().contains("/nonexistent/criu.conf"), "{e}");
    }

    #[test]
    fn what_is_no_config_file_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(
            &fifo,
            nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
        )
        .unwrap();
        for (path, why) in [
            (fifo.as_path(), "FIFO"),
            (Path::new("/dev/zero"), "not a regular file"),
            (dir.path(), "directory"),
        ] {
            let e = CriuConfig::read(path).unwrap_err();
            let text = format!("{e}: {}", std::error::Error::source(&e).unwrap());
            assert!(text.contains(why), "{text}");
        }
        let big = dir.path().join("big.conf");
        std::fs::write(&big, "# x\n".repeat(300_000)).unwrap();
        let e = CriuConfig::read(&big).unwrap_err();
        assert!(std::error::Error::source(&e)
            .unwrap()
            .to_string()
            .contains("larger than 1024 KiB"));
    }

    #[test]
    fn criu_reads_the_handed_over_options_through_proc() {
        let config = parse("ghost-limit 8M\ntcp-close\n").unwrap();
        let handover = config.handover().unwrap();
        let path = format!("/proc/self/fd/{}", handover.fd().as_raw_fd());
        assert_eq!(handover.criu_path(), path);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "ghost-limit=8M\ntcp-close\n"
        );
        // Sealed: nothing can change what CRIU will read.
        let reopened = std::fs::OpenOptions::new().write(true).open(&path);
        let write = reopened.and_then(|mut f| f.write_all(b"x"));
        assert!(write.is_err());
    }
}
