//! What gpucr and its CRIU plugin share: the CRIU plugin ABI (`cr_plugin_desc_t`, hook
//! and stage numbers) and the helper wire protocol (prost messages over a SOCK_SEQPACKET
//! unix socket, file descriptors as SCM_RIGHTS).

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod plugin_abi;
pub mod wire;

/// The helper protocol messages (`proto/gpucr/helper.proto`).
#[allow(missing_docs, clippy::all)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/gpucr.helper.rs"));
}

/// Environment variable naming the helper's socket (set on the `criu swrk` child only).
pub const ENV_HELPER_SOCK: &str = "GPUCR_HELPER_SOCK";
/// The name gpucr's plugin registers in CRIU's inventory and descriptor.
pub const PLUGIN_NAME: &str = "gpucr";
/// The plugin's file name inside the directory gpucr gives CRIU as CRIU_LIBS_DIR.
pub const PLUGIN_FILE: &str = "gpucr_plugin.so";
/// The name cargo gives the built cdylib.
pub const PLUGIN_BUILD_FILE: &str = "libgpucr_plugin.so";
