//! What a plugin half's failure says: the errno CRIU gets back and its kind.

use gpucr_abi::PluginFailureKind;

use crate::device::DeviceError;

/// A plugin-half failure, with the errno CRIU gets back and its kind (which decides
/// gpucr's exit code when CRIU fails because of it).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct HalfError {
    pub errno: i32,
    pub kind: PluginFailureKind,
    pub message: String,
}

impl HalfError {
    /// The plugin's own part failed (a thread, a descriptor, its environment).
    pub fn new(errno: i32, message: impl Into<String>) -> HalfError {
        HalfError::of(PluginFailureKind::Plugin, errno, message)
    }

    /// The device or its driver refused or broke.
    pub fn device(errno: i32, message: impl Into<String>) -> HalfError {
        HalfError::of(PluginFailureKind::Device, errno, message)
    }

    /// The device state an image describes cannot be used.
    pub fn image(errno: i32, message: impl Into<String>) -> HalfError {
        HalfError::of(PluginFailureKind::Image, errno, message)
    }

    fn of(kind: PluginFailureKind, errno: i32, message: impl Into<String>) -> HalfError {
        HalfError {
            errno,
            kind,
            message: message.into(),
        }
    }
}

impl From<DeviceError> for HalfError {
    fn from(e: DeviceError) -> Self {
        HalfError::of(e.kind(), e.errno(), e.to_string())
    }
}
