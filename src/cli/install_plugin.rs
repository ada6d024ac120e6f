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
/// A CRIU that gpucr did not start finds no gpucr helper: the plugin then answers "not
/// mine" to every hook, and the container is checkpointed and restored as without it.
/// See docs/containers.md.
#[derive(Debug, Clone, Args)]
pub struct InstallPluginArgs {
    /// CRIU's plugin directory.
    #[arg(long, value_name = "DIR", default_value = "/usr/lib/criu")]
    pub criu_libdir: PathBuf,

    /// Remove the installed plugin instead.
    #[arg(long)]
    pub uninstall: bool,
}
