//! `gpucr check-topology [DIR|ARCHIVE]`, and the topology flags `gpucr restore` shares.

use std::path::PathBuf;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::Args;
use gpucr_topology::CheckName;

use super::common::OutputArgs;

/// Show the local GPUs, or whether an image can be restored here.
///
/// Without DIR: a table of this machine's GPUs (KFD node, gpu_id or UUID, name, VRAM,
/// compute units, firmware, NUMA node, links). With DIR: the image's GPU topology against
/// this machine's, and the mapping a restore would use (checkpointed GPU -> local GPU), or,
/// when there is none, every check each checkpointed GPU fails against each local GPU, with
/// both values.
///
/// AMD GPUs are compared by the rules of CRIU's amdgpu plugin, NVIDIA GPUs by CUDA's (same
/// chip, enough memory, every GPU mapped). With `CUDA_VISIBLE_DEVICES` set, an image's
/// NVIDIA GPUs are mapped only onto the GPUs it names, by index (PCI bus order, as
/// `nvidia-smi` numbers them) or GPU UUID, with CUDA's rules: the first entry that names no
/// GPU ends the list; MIG instances are refused. Exit status 0: compatible (or no DIR);
/// 9: incompatible; other codes: an error (see below).
#[derive(Debug, Clone, Args)]
#[command(after_long_help = super::EXIT_STATUS_HELP)]
pub struct CheckTopologyArgs {
    /// An image directory, or a container checkpoint archive (podman, CRI-O,
    /// containerd; zstd, gzip or plain tar), to check against this machine.
    #[arg(value_name = "DIR|ARCHIVE")]
    pub dir: Option<PathBuf>,

    #[command(flatten)]
    pub topology: TopologyCheckArgs,

    #[command(flatten)]
    pub output: OutputArgs,
}

/// Where this machine's GPU topology is read, and which compatibility checks are skipped.
#[derive(Debug, Clone, Default, Args)]
pub struct TopologyCheckArgs {
    /// Read the GPU topology under DIR instead of `/`: DIR/sys/class/kfd/kfd/topology/nodes,
    /// DIR/proc/driver/nvidia/gpus and DIR/sys/bus/pci/devices (NVML is not used). For the
    /// simulator's root, or a copy of another machine's files. An image of simulated GPUs
    /// is checked against GPUCR_SIM_ROOT when this is not given.
    #[arg(long, value_name = "DIR", env = "GPUCR_SYSFS_ROOT", value_parser = existing_dir)]
    pub sysfs_root: Option<PathBuf>,

    /// Do not apply the topology check NAME (repeatable). CRIU's variables KFD_FW_VER_CHECK,
    /// KFD_SDMA_FW_VER_CHECK, KFD_CACHES_COUNT_CHECK, KFD_NUM_GWS_CHECK, KFD_VRAM_SIZE_CHECK,
    /// KFD_NUMA_CHECK and KFD_CAPABILITY_CHECK (0/NO off, 1/YES on) switch the same checks.
    #[arg(long = "skip-check", value_name = "NAME", value_parser = check_name())]
    pub skip_check: Vec<CheckName>,
}

/// A directory that exists: a root that is missing or not a directory (a typo) would
/// read as a machine without GPUs.
fn existing_dir(text: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(text);
    match std::fs::metadata(&path) {
        Ok(meta) if meta.is_dir() => Ok(path),
        Ok(_) => Err(format!("{text}: not a directory")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(format!("{text}: no such directory"))
        }
        Err(e) => Err(format!("{text}: {e}")),
    }
}

fn check_name() -> impl TypedValueParser<Value = CheckName> {
    PossibleValuesParser::new(CheckName::ALL.iter().map(|c| c.as_str()))
        .try_map(|name| name.parse::<CheckName>())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn parse(args: &[&str]) -> Result<CheckTopologyArgs, clap::Error> {
        let cli = Cli::try_parse_from(args)?;
        match cli.command {
            Command::CheckTopology(args) => Ok(args),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn skip_check_is_repeatable_and_validated() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path().to_str().unwrap();
        let args = parse(&[
            "gpucr",
            "check-topology",
            "img",
            "--skip-check",
            "fw_version",
            "--skip-check=numa",
            "--sysfs-root",
            root,
            "--json",
        ])
        .unwrap();
        assert_eq!(
            args.topology.skip_check,
            [CheckName::FwVersion, CheckName::Numa]
        );
        assert_eq!(
            args.topology.sysfs_root.as_deref(),
            Some(std::path::Path::new(root))
        );
        assert!(args.output.json);
        let err = parse(&["gpucr", "check-topology", "--skip-check", "firmware"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::InvalidValue);
    }

    /// A --sysfs-root that is missing or not a directory is a usage error naming it,
    /// for every subcommand that takes it, not "no GPUs here".
    #[test]
    fn sysfs_root_must_be_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, "").unwrap();
        let file = file.to_str().unwrap();
        let missing = dir.path().join("nonexistent");
        let missing = missing.to_str().unwrap();
        for (root, why) in [(missing, "no such directory"), (file, "not a directory")] {
            for command in [
                &["gpucr", "check-topology", "--sysfs-root", root][..],
                &["gpucr", "restore", "img", "--sysfs-root", root][..],
            ] {
                let err = Cli::try_parse_from(command).unwrap_err();
                assert_eq!(err.exit_code(), 2, "{command:?}");
                let text = err.to_string();
                assert!(text.contains(&format!("{root}: {why}")), "{text}");
                assert!(text.contains("--sysfs-root"), "{text}");
            }
        }
    }
}
