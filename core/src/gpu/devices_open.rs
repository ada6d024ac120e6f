//! Which device nodes a running tree holds open, by number: what the cuda backend
//! tells the GPUs a job uses from before anything is frozen (a migration offers the
//! destination only those). By device number, not by path: inside a container the
//! nodes may be named otherwise, and the numbers are the host's.

use std::collections::BTreeSet;
use std::os::unix::fs::{FileTypeExt, MetadataExt};

use gpucr_abi::procfs;

/// The NVIDIA driver's character device major (`/dev/nvidia*`).
pub const NVIDIA_MAJOR: u32 = 195;
/// Minors of `/dev/nvidia*` at and above this are the driver's own nodes, not GPUs
/// (`nvidiactl` 255, `nvidia-modeset` 254).
pub const NVIDIA_FIRST_CONTROL_MINOR: u32 = 254;

/// The (major, minor) of every character device any of `pids` holds open. A task that
/// is gone, or whose descriptors cannot be read, adds nothing.
pub fn char_devices(pids: &[i32]) -> BTreeSet<(u32, u32)> {
    let mut devices = BTreeSet::new();
    for &pid in pids {
        let fds = procfs::fd_dir(pid);
        for fd in procfs::fd_numbers(pid) {
            // Follows the link to the open file itself.
            let Ok(meta) = std::fs::metadata(format!("{fds}/{fd}")) else {
                continue;
            };
            if meta.file_type().is_char_device() {
                let rdev = meta.rdev();
                devices.insert((
                    nix::sys::stat::major(rdev) as u32,
                    nix::sys::stat::minor(rdev) as u32,
                ));
            }
        }
    }
    devices
}

/// The minors of the devices of `major` among `devices`.
pub fn minors_of(devices: &BTreeSet<(u32, u32)>, major: u32) -> BTreeSet<u32> {
    devices
        .iter()
        .filter(|(m, _)| *m == major)
        .map(|(_, minor)| *minor)
        .collect()
}

/// The minors of the NVIDIA GPU nodes (`/dev/nvidiaN`) among `devices`.
pub fn nvidia_gpu_minors(devices: &BTreeSet<(u32, u32)>) -> BTreeSet<u32> {
    minors_of(devices, NVIDIA_MAJOR)
        .into_iter()
        .filter(|&m| m < NVIDIA_FIRST_CONTROL_MINOR)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_holding_dev_null_holds_its_number() {
        let null = std::fs::File::open("/dev/null").unwrap();
        let devices = char_devices(&[std::process::id() as i32]);
        // /dev/null is the memory devices' major 1, minor 3.
        assert!(devices.contains(&(1, 3)), "{devices:?}");
        assert!(minors_of(&devices, 1).contains(&3));
        drop(null);
    }

    #[test]
    fn a_task_that_is_gone_adds_nothing() {
        assert!(char_devices(&[i32::MAX]).is_empty());
    }

    #[test]
    fn minors_are_those_of_the_major_asked_for() {
        let devices = BTreeSet::from([
            (226, 128),
            (NVIDIA_MAJOR, 1),
            (NVIDIA_MAJOR, 3),
            (NVIDIA_MAJOR, 254),
            (NVIDIA_MAJOR, 255),
        ]);
        assert_eq!(minors_of(&devices, 226), BTreeSet::from([128]));
        // nvidiactl and nvidia-modeset are the driver's, not GPUs.
        assert_eq!(nvidia_gpu_minors(&devices), BTreeSet::from([1, 3]));
    }
}
