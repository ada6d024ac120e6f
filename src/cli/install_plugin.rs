//! `gpucr install-plugin`.

use std::path::PathBuf;

use clap::Args;

/// Install gpucr's CRIU plugin where CRIU loads plugins, for CRIU run by others.
///
/// Container engines (podman, CRI-O, containerd, through runc or crun) run CRIU
/// themselves; CRIU loads every plugin in its plugin directory (/usr/lib/criu unless
/// CRIU_LIBS_DIR or criu --libdir says otherwise). This copies the plugin there as
/// gpucr_plugin.so (replacing an older copy atomically). `gpucr dump` and `gpucr restore`
/// do not need it: they hand CRIU a private plugin directory of their own.
///
/// A CRIU that gpucr did not start runs the plugin in engine mode: when the dumped tree
/// holds a device gpucr handles, the plugin starts gpucr's helper itself (this gpucr
/// binary, `engine-helper`), and GPU memory and gpucr's manifest go into CRIU's image
/// directory, so they travel in the engine's checkpoint archive; any other tree is
/// checkpointed as without the plugin, and no helper starts. The plugin's settings file,
/// gpucr_plugin.conf beside it, names this binary (GPUCR_BIN) and holds the --setting
/// values, for engines that do not pass their environment on to CRIU. See
/// docs/containers.md.
#[derive(Debug, Clone, Args)]
pub struct InstallPluginArgs {
    /// CRIU's plugin directory.
    #[arg(long, value_name = "DIR", default_value = "/usr/lib/criu")]
    pub criu_libdir: PathBuf,

    /// A setting for engine mode, NAME=VALUE, written to the settings file beside the
    /// plugin: GPUCR_COMPRESS, GPUCR_JOBS, GPUCR_DEVICE_TIMEOUT, CUDA_VISIBLE_DEVICES,
    /// the KFD_*_CHECK topology switches, GPUCR_ENGINE=0 (keep out of every CRIU gpucr
    /// did not start) and the other GPUCR_* variables engine mode reads (the backends'
    /// GPUCR_AMDGPU_*, GPUCR_SIM_*, GPUCR_CUDA_LIBRARY, ...). A value engine mode would
    /// refuse, or a GPUCR_* or KFD_* name it does not read, is refused here. Repeatable.
    /// In a settings file edited by hand, the plugin leaves such names, and names
    /// without a value, out, with a warning in CRIU's log.
    #[arg(long, value_name = "NAME=VALUE", value_parser = parse_setting)]
    pub setting: Vec<(String, String)>,

    /// Remove the installed plugin instead.
    #[arg(long)]
    pub uninstall: bool,

    /// Install even though DIR holds CRIU's own cuda_plugin.so or amdgpu_plugin.so.
    /// CRIU calls each hook on its plugins in directory order and stops at the first
    /// that answers, so for a GPU process either plugin may act and the other never sees
    /// it; without this flag the install is refused.
    #[arg(long)]
    pub force: bool,
}

/// `NAME=VALUE` with a `GPUCR_*`, `KFD_*` or `CUDA_VISIBLE_DEVICES` name and a one-line
/// value: a `GPUCR_*` name must be one engine mode reads, and the value of a setting
/// gpucr reads is checked as engine mode reads it.
fn parse_setting(text: &str) -> Result<(String, String), String> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not NAME=VALUE"))?;
    if !(name.starts_with("GPUCR_")
        || name.starts_with("KFD_")
        || name == gpucr_topology::nvidia::visible::VARIABLE)
    {
        return Err(format!(
            "{name:?}: only GPUCR_* and KFD_* variables and CUDA_VISIBLE_DEVICES are settings"
        ));
    }
    if value.contains('\n') {
        return Err(format!("{name}: the value must be one line"));
    }
    // Engine mode would refuse a bad value only at the next checkpoint, inside CRIU.
    crate::engine::check_setting(name, value).map_err(|e| e.to_string())?;
    Ok((name.to_owned(), value.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::parse_setting;

    #[test]
    fn settings_are_checked_as_engine_mode_reads_them() {
        assert_eq!(
            parse_setting("GPUCR_JOBS=4").unwrap(),
            ("GPUCR_JOBS".into(), "4".into())
        );
        assert!(parse_setting("GPUCR_COMPRESS=zstd:19").is_ok());
        assert!(parse_setting("GPUCR_SIM_ROOT=/").is_ok());
        for (text, named) in [
            ("GPUCR_JOBS=abc", "GPUCR_JOBS=\"abc\""),
            ("GPUCR_COMPRESS=zstd:99", "GPUCR_COMPRESS=\"zstd:99\""),
            ("GPUCR_DEVICE_TIMEOUT=0", "GPUCR_DEVICE_TIMEOUT=\"0\""),
            ("KFD_NUMA_CHECK=perhaps", "KFD_NUMA_CHECK=\"perhaps\""),
            ("GPUCR_AMDGPU_RINGS=x", "GPUCR_AMDGPU_RINGS=\"x\""),
            ("GPUCR_SIM_COPY_BW=fast", "GPUCR_SIM_COPY_BW=\"fast\""),
            (
                "GPUCR_SIM_ROOT=sim",
                "GPUCR_SIM_ROOT=\"sim\": not an absolute path",
            ),
            ("GPUCR_COMPRES=zstd", "GPUCR_COMPRES: not a setting"),
        ] {
            let err = parse_setting(text).unwrap_err();
            assert!(err.starts_with(named), "{text}: {err}");
        }
    }
}
