//! What gpucr and its CRIU plugin share: the CRIU plugin ABI (`cr_plugin_desc_t`, hook
//! and stage numbers), the helper wire protocol (prost messages over a SOCK_SEQPACKET
//! unix socket, file descriptors as SCM_RIGHTS), and the kernel interfaces of the amdgpu
//! backend (KFD and amdgpu DRM structs and ioctl numbers, checked against the system
//! headers by `tests/uapi_headers.rs`).

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod amdgpu_drm;
pub mod criu_hook_abi;
pub mod cuda;
pub mod engine;
pub mod env;
pub mod fault;
pub mod kfd;
pub mod plugin_abi;
pub mod procfs;
pub mod sim;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod uapi;
pub mod uapi_facts;
pub mod wire;

/// The helper protocol messages (`proto/gpucr/helper.proto`).
#[allow(missing_docs, clippy::all)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/gpucr.helper.rs"));
}

/// Environment variable holding the number of the helper's connector fd in CRIU's fd
/// table (set on the `criu swrk` child only). At dump the plugin uses that fd directly.
pub const ENV_HELPER_FD: &str = "GPUCR_HELPER_FD";
/// The key under which gpucr hands the connector to a restore as CRIU's `inherit_fd`:
/// CRIU moves it into its fdstore, where the plugin finds it again, in criu and in every
/// restored task (whose inherited fds CRIU closes), whatever mount namespace it has.
pub const HELPER_INHERIT_KEY: &str = "gpucr-helper";
/// Environment variable naming the backend whose plugin half serves this CRIU ("sim",
/// "amdgpu", "cuda"; set by gpucr on the `criu swrk` child).
pub const ENV_BACKEND: &str = "GPUCR_BACKEND";
/// Environment variable holding the pid of a tree's root that gpucr's plugin stops
/// (SIGSTOP to every process) at the end of a dump that succeeded, after the devices are
/// given back and before CRIU lets the tree go: the tree never runs between the dump and
/// the stop (`gpucr migrate`, with CRIU's `leave_running`). Set on the `criu swrk` child
/// only.
pub const ENV_STOP_AFTER_DUMP: &str = "GPUCR_STOP_AFTER_DUMP";
/// Environment variable that, set to `1`, tells gpucr's plugin that the give-back at
/// the end of a dump that succeeds is deferred (`gpucr migrate --post-copy`, where the
/// stopped tree's memory is served as the image): no restore thread is let run at the
/// exit hook, as one would change that memory. Set on the `criu swrk` child only.
pub const ENV_DEFER_GIVE_BACK: &str = "GPUCR_DEFER_GIVE_BACK";
/// The name gpucr's plugin registers in CRIU's inventory and descriptor.
pub const PLUGIN_NAME: &str = "gpucr";
/// The plugin's file name inside the directory gpucr gives CRIU as CRIU_LIBS_DIR.
pub const PLUGIN_FILE: &str = "gpucr_plugin.so";
/// The name cargo gives the built cdylib.
pub const PLUGIN_BUILD_FILE: &str = "libgpucr_plugin.so";
/// What kind of failure the plugin logged. Each is logged as "gpucr: MARK WHAT" (see
/// [`PluginFailureKind::mark`]), where WHAT starts with the hook's name
/// ("PAUSE_DEVICES: ...") for a hook that failed, and with [`PLUGIN_EXIT_STEP`] for a
/// step of the `exit` hook. When CRIU fails because of such a hook, the kind decides
/// gpucr's exit code: a device failure is the device's, not CRIU's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginFailureKind {
    /// The plugin itself could not do its part: its helper connection, CRIU's
    /// interfaces, a thread of the task it had to stop or let run.
    Plugin,
    /// A device or its driver refused or broke: a KFD ioctl, a device file, a driver
    /// that exported nothing.
    Device,
    /// What the image describes cannot be used: device state that does not parse, a
    /// path outside the backend's root.
    Image,
}

impl PluginFailureKind {
    pub const ALL: [PluginFailureKind; 3] = [
        PluginFailureKind::Plugin,
        PluginFailureKind::Device,
        PluginFailureKind::Image,
    ];

    /// What follows "gpucr: " in the log line of a failure of this kind.
    pub fn mark(self) -> &'static str {
        match self {
            PluginFailureKind::Plugin => "error: ",
            PluginFailureKind::Device => "device error: ",
            PluginFailureKind::Image => "image error: ",
        }
    }

    /// The kind and what failed, from the text after "gpucr: " of a log line; None when
    /// that line reports no failure.
    pub fn parse(text: &str) -> Option<(PluginFailureKind, &str)> {
        PluginFailureKind::ALL
            .into_iter()
            .find_map(|kind| Some((kind, text.strip_prefix(kind.mark())?)))
    }
}
/// What starts a failure of the plugin's `exit` hook (giving the tree its devices back):
/// it comes after CRIU's own outcome, so it never explains a failed dump.
pub const PLUGIN_EXIT_STEP: &str = "after the dump: ";
