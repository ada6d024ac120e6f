//! Recreating a task's device state inside the restored task, as the helper describes
//! it: directories, small state files, device buffers of the recorded sizes (not yet
//! filled: the helper writes their contents), and the device node itself.
//!
//! The plugin runs as root inside the restored task, and the paths come from an image:
//! every one must lie beneath the backend's root (`DeviceSpec.root`), and each is
//! created or opened through `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` from that
//! root, so neither `..` nor a symlink planted under the root can reach outside it.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd, RawFd};
use std::path::{Component, Path, PathBuf};

use gpucr_abi::proto::DeviceSpec;
use gpucr_abi::PluginFailureKind;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fchmod, mkdirat, Mode};

/// What went wrong recreating device state; names the path.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct DeviceError {
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
    /// The path is not beneath the backend's root: the image names it, not the device.
    pub outside_root: bool,
}

impl DeviceError {
    /// A path outside the root is the image's fault; anything else, the device's.
    pub fn kind(&self) -> PluginFailureKind {
        if self.outside_root {
            PluginFailureKind::Image
        } else {
            PluginFailureKind::Device
        }
    }

    /// The errno CRIU gets back.
    pub fn errno(&self) -> i32 {
        self.source.raw_os_error().unwrap_or(libc::EIO)
    }
}

fn at(path: &Path) -> impl FnOnce(io::Error) -> DeviceError + '_ {
    move |source| DeviceError {
        path: path.to_path_buf(),
        source,
        outside_root: false,
    }
}

fn errno_at(path: &Path) -> impl FnOnce(nix::Error) -> DeviceError + '_ {
    move |e| DeviceError {
        path: path.to_path_buf(),
        source: e.into(),
        outside_root: false,
    }
}

/// An `openat2` beneath the root that failed: a symlink on the way (ELOOP, or ENOTDIR
/// where a directory was asked for) or a step out of the root (EXDEV) is a path the
/// image must not name; anything else, the device's.
fn resolved_at(path: &Path) -> impl FnOnce(nix::Error) -> DeviceError + '_ {
    use nix::errno::Errno::{ELOOP, ENOTDIR, EXDEV};
    move |e| DeviceError {
        outside_root: matches!(e, ELOOP | ENOTDIR | EXDEV),
        ..errno_at(path)(e)
    }
}

fn outside(path: &Path, root: &str) -> DeviceError {
    let detail = if root.is_empty() {
        "the backend keeps no files, so the image may name none".to_owned()
    } else {
        format!("not beneath the backend's root {root}")
    };
    DeviceError {
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::PermissionDenied, detail),
        outside_root: true,
    }
}

/// The backend's root, open, and the paths beneath it.
struct Beneath<'a> {
    root: &'a str,
    dir: OwnedFd,
}

impl<'a> Beneath<'a> {
    fn open(root: &'a str) -> Result<Beneath<'a>, DeviceError> {
        let path = Path::new(root);
        if root.is_empty() || !path.is_absolute() {
            return Err(outside(path, root));
        }
        let dir = nix::fcntl::open(
            path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno_at(path))?;
        Ok(Beneath { root, dir })
    }

    /// `path` relative to the root: absolute, beneath it, only normal components.
    fn relative<'p>(&self, path: &'p Path) -> Result<&'p Path, DeviceError> {
        let rel = path
            .strip_prefix(self.root)
            .map_err(|_| outside(path, self.root))?;
        let normal = rel.components().all(|c| matches!(c, Component::Normal(_)));
        if !path.is_absolute() || !normal || rel.as_os_str().is_empty() {
            return Err(outside(path, self.root));
        }
        Ok(rel)
    }

    fn how(flags: OFlag, mode: u32) -> OpenHow {
        OpenHow::new()
            .flags(flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
            .mode(Mode::from_bits_truncate(mode))
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS)
    }

    /// Create `path` and its missing parents beneath the root, each 0700.
    fn create_dir_all(&self, path: &Path) -> Result<(), DeviceError> {
        let rel = self.relative(path)?;
        let mut parent = self.dir.try_clone().map_err(at(Path::new(self.root)))?;
        for name in rel.components() {
            match mkdirat(&parent, name.as_os_str(), Mode::from_bits_truncate(0o700)) {
                Ok(()) | Err(nix::Error::EEXIST) => {}
                Err(e) => return Err(errno_at(path)(e)),
            }
            parent = openat2(
                &parent,
                name.as_os_str(),
                Self::how(OFlag::O_PATH | OFlag::O_DIRECTORY, 0),
            )
            .map_err(resolved_at(path))?;
        }
        Ok(())
    }

    /// Open `path` beneath the root with `flags` (and `mode` when it is created).
    fn open_file(&self, path: &Path, flags: OFlag, mode: u32) -> Result<File, DeviceError> {
        let rel = self.relative(path)?;
        let fd = openat2(&self.dir, rel, Self::how(flags, mode)).map_err(resolved_at(path))?;
        Ok(File::from(fd))
    }
}

/// Create the directories and files of `spec`, and its buffers at their sizes, all
/// beneath `spec.root`. Returns the open buffer files, in `spec.buffers` order.
pub fn recreate(spec: &DeviceSpec) -> Result<Vec<File>, DeviceError> {
    if spec.directories.is_empty() && spec.files.is_empty() && spec.buffers.is_empty() {
        return Ok(Vec::new());
    }
    let beneath = Beneath::open(&spec.root)?;
    // Every path is checked before anything is created.
    let all = spec
        .directories
        .iter()
        .chain(spec.files.iter().map(|f| &f.path))
        .chain(spec.buffers.iter().map(|b| &b.path));
    for path in all {
        beneath.relative(Path::new(path))?;
    }
    for dir in &spec.directories {
        beneath.create_dir_all(Path::new(dir))?;
    }
    let create = OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_TRUNC;
    for file in &spec.files {
        let path = Path::new(&file.path);
        let mut out = beneath.open_file(path, create, 0o600)?;
        out.write_all(&file.contents).map_err(at(path))?;
        set_mode(&out, file.mode).map_err(errno_at(path))?;
    }
    spec.buffers
        .iter()
        .map(|b| {
            let path = Path::new(&b.path);
            let file = beneath.open_file(path, create, 0o600)?;
            file.set_len(b.size).map_err(at(path))?;
            set_mode(&file, b.mode).map_err(errno_at(path))?;
            Ok(file)
        })
        .collect()
}

/// Give a recreated file its recorded permission bits (0: keep what it has).
fn set_mode(file: &File, mode: u32) -> nix::Result<()> {
    if mode == 0 {
        return Ok(());
    }
    fchmod(file, Mode::from_bits_truncate(mode & 0o7777))
}

/// The open flags an image may ask for on the device node: the access mode and
/// harmless status flags; never O_CREAT, O_TRUNC or anything else that changes a file.
pub fn device_open_flags(recorded: i32) -> OFlag {
    let allowed = OFlag::O_ACCMODE | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOCTTY;
    OFlag::from_bits_truncate(recorded) & allowed
}

/// Where device nodes live: the only place an image may name one.
const DEVICE_DIR: &str = "/dev";

/// Open the device node (beneath /dev); the fd is handed to CRIU, which owns it from
/// then on.
pub fn open_device(spec: &DeviceSpec) -> Result<RawFd, DeviceError> {
    let path = Path::new(&spec.device_path);
    let beneath_dev = path.strip_prefix(DEVICE_DIR).is_ok_and(|rel| {
        !rel.as_os_str().is_empty() && rel.components().all(|c| matches!(c, Component::Normal(_)))
    });
    if !beneath_dev {
        return Err(outside(path, DEVICE_DIR));
    }
    let fd = nix::fcntl::open(path, device_open_flags(spec.device_flags), Mode::empty())
        .map_err(errno_at(path))?;
    Ok(fd.into_raw_fd())
}

/// The raw fds of `files`, for SCM_RIGHTS.
pub fn raw_fds(files: &[File]) -> Vec<RawFd> {
    files.iter().map(AsRawFd::as_raw_fd).collect()
}

/// The raw fds of `fds`, for SCM_RIGHTS.
pub fn raw_fds_of(fds: &[OwnedFd]) -> Vec<RawFd> {
    fds.iter().map(AsRawFd::as_raw_fd).collect()
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    use gpucr_abi::proto::{BufferSpec, FileSpec};

    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("gpucr-plugin-device-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn spec_in(root: &Path, buffer: &str) -> DeviceSpec {
        DeviceSpec {
            root: root.display().to_string(),
            device_path: "/dev/null".into(),
            buffers: vec![BufferSpec {
                path: buffer.into(),
                size: 1,
                mode: 0,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn recreates_directories_files_and_sized_buffers() {
        let root = scratch("ok");
        let ctx = root.join("contexts/ctx");
        let spec = DeviceSpec {
            root: root.display().to_string(),
            device_path: "/dev/null".into(),
            directories: vec![ctx.display().to_string()],
            files: vec![FileSpec {
                path: ctx.join("context.json").display().to_string(),
                contents: b"{}".to_vec(),
                mode: 0o640,
            }],
            buffers: vec![BufferSpec {
                path: ctx.join("b0").display().to_string(),
                size: 12345,
                mode: 0o644,
            }],
            device_flags: libc::O_RDWR,
            ..Default::default()
        };
        let files = recreate(&spec).unwrap();
        assert_eq!(files[0].metadata().unwrap().len(), 12345);
        assert_eq!(
            files[0].metadata().unwrap().permissions().mode() & 0o777,
            0o644
        );
        let ctx_mode = fs::metadata(ctx.join("context.json"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(ctx_mode & 0o777, 0o640);
        assert_eq!(fs::read(ctx.join("context.json")).unwrap(), b"{}");
        let fd = open_device(&spec).unwrap();
        // SAFETY: open_device returned a fresh fd that nothing else owns.
        drop(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn paths_outside_the_root_are_refused_and_nothing_is_created() {
        let root = scratch("escape");
        let victim = scratch("victim");
        fs::write(victim.join("keep"), b"precious").unwrap();
        std::os::unix::fs::symlink(&victim, root.join("link")).unwrap();
        let escapes = [
            victim.join("keep").display().to_string(),
            format!(
                "{}/../{}/keep",
                root.display(),
                victim.file_name().unwrap().to_str().unwrap()
            ),
            root.display().to_string(),
            "relative/b0".to_owned(),
        ];
        for path in &escapes {
            let mut spec = spec_in(&root, &root.join("fine").display().to_string());
            spec.buffers.push(BufferSpec {
                path: path.clone(),
                size: 1,
                mode: 0,
            });
            let err = recreate(&spec).unwrap_err();
            assert!(err.to_string().contains(path.as_str()), "{err}");
            assert_eq!(err.kind(), PluginFailureKind::Image, "{err}");
            assert!(
                !root.join("fine").exists(),
                "{path}: created before the check"
            );
        }
        // A symlink under the root passes the lexical check (only files inside the root
        // may have been created by then); openat2 refuses to follow it.
        let spec = spec_in(&root, &root.join("link/keep").display().to_string());
        assert_eq!(
            recreate(&spec).unwrap_err().kind(),
            PluginFailureKind::Image
        );
        let dirs = DeviceSpec {
            root: root.display().to_string(),
            directories: vec![root.join("link/sub").display().to_string()],
            ..Default::default()
        };
        assert_eq!(
            recreate(&dirs).unwrap_err().kind(),
            PluginFailureKind::Image
        );
        assert_eq!(fs::read(victim.join("keep")).unwrap(), b"precious");
        assert!(!victim.join("sub").exists());
        let no_root = spec_in(Path::new(""), &root.join("b0").display().to_string());
        assert!(recreate(&no_root)
            .unwrap_err()
            .to_string()
            .contains("no files"));
        fs::remove_dir_all(&root).unwrap();
        fs::remove_dir_all(&victim).unwrap();
    }

    #[test]
    fn device_nodes_outside_dev_are_refused() {
        for path in ["/etc/passwd", "/dev/../etc/passwd", "/dev", "dev/null"] {
            let spec = DeviceSpec {
                device_path: path.into(),
                ..Default::default()
            };
            let err = open_device(&spec).unwrap_err();
            assert_eq!(err.kind(), PluginFailureKind::Image, "{path}");
        }
    }

    #[test]
    fn device_flags_from_an_image_cannot_create_or_truncate() {
        let flags =
            device_open_flags(libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC | libc::O_APPEND);
        assert_eq!(flags, OFlag::O_RDWR);
        assert_eq!(
            device_open_flags(libc::O_RDONLY | libc::O_NONBLOCK),
            OFlag::O_NONBLOCK
        );
    }

    #[test]
    fn errors_name_the_path() {
        let root = scratch("missing");
        let missing = root.join("nonexistent/dir/b0");
        let err = recreate(&spec_in(&root, &missing.display().to_string())).unwrap_err();
        assert!(
            err.to_string()
                .starts_with(&format!("{}: ", missing.display())),
            "{err}"
        );
        assert_eq!(err.kind(), PluginFailureKind::Device, "{err}");
        assert_eq!(err.errno(), libc::ENOENT);
        fs::remove_dir_all(&root).unwrap();
    }
}
