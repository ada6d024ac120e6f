//! Recreating a task's device state inside the restored task, as the helper describes
//! it: directories, small state files, device buffers of the recorded sizes (not yet
//! filled: the helper writes their contents), and the device node itself.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, IntoRawFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use gpucr_abi::proto::DeviceSpec;

/// What went wrong recreating device state; names the path.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct DeviceError {
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

fn at(path: &Path) -> impl FnOnce(io::Error) -> DeviceError + '_ {
    move |source| DeviceError {
        path: path.to_path_buf(),
        source,
    }
}

/// Create the directories and files of `spec`, and its buffers at their sizes. Returns
/// the open buffer files, in `spec.buffers` order.
pub fn recreate(spec: &DeviceSpec) -> Result<Vec<File>, DeviceError> {
    for dir in &spec.directories {
        let dir = Path::new(dir);
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(at(dir))?;
    }
    for file in &spec.files {
        let path = Path::new(&file.path);
        fs::write(path, &file.contents).map_err(at(path))?;
        set_mode(&File::open(path).map_err(at(path))?, file.mode).map_err(at(path))?;
    }
    spec.buffers
        .iter()
        .map(|b| {
            let path = Path::new(&b.path);
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(path)
                .map_err(at(path))?;
            file.set_len(b.size).map_err(at(path))?;
            set_mode(&file, b.mode).map_err(at(path))?;
            Ok(file)
        })
        .collect()
}

/// Give a recreated file its recorded permission bits (0: keep what it has).
fn set_mode(file: &File, mode: u32) -> io::Result<()> {
    if mode == 0 {
        return Ok(());
    }
    file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode & 0o7777))
}

/// Open the device node; the fd is handed to CRIU, which owns it from then on.
pub fn open_device(spec: &DeviceSpec) -> Result<RawFd, DeviceError> {
    let path = Path::new(&spec.device_path);
    let access = spec.device_flags & libc::O_ACCMODE;
    let file = OpenOptions::new()
        .read(access != libc::O_WRONLY)
        .write(access != libc::O_RDONLY)
        .custom_flags(spec.device_flags & !libc::O_ACCMODE & !libc::O_CREAT)
        .open(path)
        .map_err(at(path))?;
    Ok(file.into_raw_fd())
}

/// The raw fds of `files`, for SCM_RIGHTS.
pub fn raw_fds(files: &[File]) -> Vec<RawFd> {
    files.iter().map(AsRawFd::as_raw_fd).collect()
}

#[cfg(test)]
mod tests {
    use gpucr_abi::proto::{BufferSpec, FileSpec};

    use super::*;

    #[test]
    fn recreates_directories_files_and_sized_buffers() {
        let tmp = std::env::temp_dir().join(format!("gpucr-plugin-device-{}", std::process::id()));
        let ctx = tmp.join("ctx");
        let spec = DeviceSpec {
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
        };
        let files = recreate(&spec).unwrap();
        assert_eq!(files[0].metadata().unwrap().len(), 12345);
        use std::os::unix::fs::PermissionsExt;
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
        drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
        fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn errors_name_the_path() {
        let spec = DeviceSpec {
            buffers: vec![BufferSpec {
                path: "/nonexistent/dir/b0".into(),
                size: 1,
                mode: 0,
            }],
            ..Default::default()
        };
        let err = recreate(&spec).unwrap_err();
        assert!(
            err.to_string().starts_with("/nonexistent/dir/b0: "),
            "{err}"
        );
    }
}
