//! What this crate's declarations say about NVIDIA's `cuda.h`, as data, so that
//! `tests/cuda_headers.rs` can check each fact against the real header of every CUDA
//! version gpucr supports (fetched by `scripts/fetch-cuda-headers.sh`): every argument
//! struct's size, fields and offsets for the layout a version selects, the structs a
//! layout does not have, the typedefs' sizes, the enum values this crate uses, and each
//! function's signature at the version it is requested at.
//!
//! Every value here is taken from the crate's own types and constants (`size_of`,
//! `offset_of!`, [`sys::signature`], [`result`]), so a change on either side fails the
//! test.

use std::mem::{align_of, offset_of, size_of};

use crate::checkpoint::ProcessState;
use crate::layout::{
    ArgsLayout, CheckpointArgs13_4, CheckpointArgsReserved, CustomStorageInfo,
    CustomStoragePerDeviceData, GpuPair, LockArgs, RestoreArgs12_9, RestoreArgs13_0,
    RestoreArgs13_3, RestoreArgs13_4, UnlockArgs, CUSTOM_STORAGE_VERSION,
};
use crate::result;
use crate::sys::{self, Signature, Symbol};

/// A field of a C struct: its name in `cuda.h`, offset and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// The C field name (`gpuPairsCount`).
    pub name: &'static str,
    /// `offsetof`.
    pub offset: usize,
    /// `sizeof` of the field.
    pub size: usize,
}

/// A C struct as this crate declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Struct {
    /// The typedef name (`CUcheckpointRestoreArgs`).
    pub name: &'static str,
    /// `sizeof`.
    pub size: usize,
    /// `_Alignof`.
    pub align: usize,
    /// Every field, in order.
    pub fields: Vec<Field>,
}

/// An enumerator or constant and the CUDA version that introduced it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Constant {
    /// The C name (`CUDA_ERROR_ILLEGAL_STATE`).
    pub name: &'static str,
    /// Its value.
    pub value: i64,
    /// The first CUDA version whose `cuda.h` has it (earlier headers must not).
    pub since: i32,
}

/// A function this crate calls, with the signature it calls it with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Function {
    /// The base name (`cuMemAlloc`).
    pub name: &'static str,
    /// The ABI version (`3020`): `cudaTypedefs.h` declares `PFN_<name>_v<version>` with
    /// exactly this signature, and no header older than it has the function.
    pub version: i32,
    /// The signature.
    pub signature: Signature,
}

macro_rules! c_struct {
    ($name:literal, $t:ty, { $($field:ident => $c:literal),* $(,)? }) => {{
        fn field_size<F>(_: fn(&$t) -> &F) -> usize {
            size_of::<F>()
        }
        Struct {
            name: $name,
            size: size_of::<$t>(),
            align: align_of::<$t>(),
            fields: vec![$(Field {
                name: $c,
                offset: offset_of!($t, $field),
                size: field_size(|s: &$t| &s.$field),
            }),*],
        }
    }};
}

/// The structs of `layout`: the four argument structs, and the GPU pair and custom
/// storage structs where the layout has them.
pub fn structs(layout: ArgsLayout) -> Vec<Struct> {
    let mut out = vec![
        c_struct!("CUuuid", sys::CUuuid, { bytes => "bytes" }),
        c_struct!("CUcheckpointLockArgs", LockArgs, {
            timeout_ms => "timeoutMs",
            reserved0 => "reserved0",
            reserved1 => "reserved1",
        }),
        c_struct!("CUcheckpointUnlockArgs", UnlockArgs, { reserved => "reserved" }),
    ];
    out.push(if layout.has_custom_storage() {
        c_struct!("CUcheckpointCheckpointArgs", CheckpointArgs13_4, {
            custom_storage_info_out => "customStorageInfo_out",
            reserved => "reserved",
        })
    } else {
        c_struct!("CUcheckpointCheckpointArgs", CheckpointArgsReserved, { reserved => "reserved" })
    });
    out.push(match layout {
        ArgsLayout::Cuda12_9 => {
            c_struct!("CUcheckpointRestoreArgs", RestoreArgs12_9, { reserved => "reserved" })
        }
        ArgsLayout::Cuda13_0 => c_struct!("CUcheckpointRestoreArgs", RestoreArgs13_0, {
            gpu_pairs => "gpuPairs",
            gpu_pairs_count => "gpuPairsCount",
            reserved => "reserved",
            reserved1 => "reserved1",
        }),
        ArgsLayout::Cuda13_3 => c_struct!("CUcheckpointRestoreArgs", RestoreArgs13_3, {
            gpu_pairs => "gpuPairs",
            gpu_pairs_count => "gpuPairsCount",
            reserved => "reserved",
        }),
        ArgsLayout::Cuda13_4 => c_struct!("CUcheckpointRestoreArgs", RestoreArgs13_4, {
            gpu_pairs => "gpuPairs",
            gpu_pairs_count => "gpuPairsCount",
            padding0 => "padding0",
            custom_storage_info_out => "customStorageInfo_out",
            reserved => "reserved",
        }),
    });
    if layout.has_gpu_pairs() {
        out.push(c_struct!("CUcheckpointGpuPair", GpuPair, {
            old_uuid => "oldUuid",
            new_uuid => "newUuid",
        }));
    }
    if layout.has_custom_storage() {
        out.push(
            c_struct!("CUcheckpointCustomStorageInfo", CustomStorageInfo, {
                handle => "handle",
                per_device_data => "perDeviceData",
                device_count => "deviceCount",
            }),
        );
        out.push(
            c_struct!("CUcheckpointCustomStoragePerDeviceData", CustomStoragePerDeviceData, {
                dev_ptr => "devPtr",
                size => "size",
                stream => "stream",
            }),
        );
    }
    out
}

/// The structs `layout` does not have: a header of that layout must not declare them.
pub fn absent_structs(layout: ArgsLayout) -> Vec<&'static str> {
    let mut out = Vec::new();
    if !layout.has_gpu_pairs() {
        out.push("CUcheckpointGpuPair");
    }
    if !layout.has_custom_storage() {
        out.push("CUcheckpointCustomStorageInfo");
        out.push("CUcheckpointCustomStoragePerDeviceData");
    }
    out
}

/// The typedefs this crate declares: name, the size of its Rust type, and the first
/// CUDA version that has it.
pub fn typedefs() -> Vec<(&'static str, usize, i32)> {
    vec![
        ("CUresult", size_of::<sys::CUresult>(), 0),
        ("CUdevice", size_of::<sys::CUdevice>(), 0),
        ("CUdeviceptr", size_of::<sys::CUdeviceptr>(), 0),
        ("CUcontext", size_of::<sys::CUcontext>(), 0),
        ("CUstream", size_of::<sys::CUstream>(), 0),
        ("CUprocessState", size_of::<sys::CUprocessState>(), 0),
        (
            "CUcheckpointOperationHandle",
            size_of::<sys::CUcheckpointOperationHandle>(),
            CUSTOM_STORAGE_VERSION,
        ),
    ]
}

/// The enumerators this crate uses: every `CUresult` of [`result`]'s table, the
/// process states, `cuGetProcAddress`'s flags and answers.
pub fn constants() -> Vec<Constant> {
    let mut out: Vec<Constant> = result::all()
        .map(|(code, name)| Constant {
            name,
            value: i64::from(code),
            since: 0,
        })
        .collect();
    let states = [
        (ProcessState::Running, "CU_PROCESS_STATE_RUNNING", 0),
        (ProcessState::Locked, "CU_PROCESS_STATE_LOCKED", 0),
        (
            ProcessState::Checkpointed,
            "CU_PROCESS_STATE_CHECKPOINTED",
            0,
        ),
        (ProcessState::Failed, "CU_PROCESS_STATE_FAILED", 0),
        (
            ProcessState::Checkpointing,
            "CU_PROCESS_STATE_CHECKPOINTING",
            CUSTOM_STORAGE_VERSION,
        ),
        (
            ProcessState::Restoring,
            "CU_PROCESS_STATE_RESTORING",
            CUSTOM_STORAGE_VERSION,
        ),
    ];
    for (state, name, since) in states {
        out.push(Constant {
            name,
            value: i64::from(state.to_raw()),
            since,
        });
    }
    for (name, value) in [
        (
            "CU_GET_PROC_ADDRESS_DEFAULT",
            sys::CU_GET_PROC_ADDRESS_DEFAULT as i64,
        ),
        (
            "CU_GET_PROC_ADDRESS_SUCCESS",
            i64::from(sys::CU_GET_PROC_ADDRESS_SUCCESS),
        ),
        (
            "CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND",
            i64::from(sys::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND),
        ),
        (
            "CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT",
            i64::from(sys::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT),
        ),
    ] {
        out.push(Constant {
            name,
            value,
            since: 0,
        });
    }
    out
}

/// Every function this crate calls: the two `cuGetProcAddress` ABIs it finds with
/// `dlsym` (`cuGetProcAddress_v2` is the 12000 ABI, `cuGetProcAddress` the 11030 one),
/// and each symbol of [`sys::symbol::ALL`] at the version it is requested at.
pub fn functions() -> Vec<Function> {
    let mut out = vec![
        Function {
            name: "cuGetProcAddress",
            version: 12000,
            signature: sys::signature::PfnGetProcAddressV2,
        },
        Function {
            name: "cuGetProcAddress",
            version: 11030,
            signature: sys::signature::PfnGetProcAddress,
        },
    ];
    out.extend(sys::symbol::ALL.iter().map(|s: &Symbol| Function {
        name: s.name,
        version: s.version,
        signature: s.signature,
    }));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_layout_has_the_four_argument_structs_of_64_bytes() {
        for layout in [
            ArgsLayout::Cuda12_9,
            ArgsLayout::Cuda13_0,
            ArgsLayout::Cuda13_3,
            ArgsLayout::Cuda13_4,
        ] {
            let structs = structs(layout);
            for name in [
                "CUcheckpointLockArgs",
                "CUcheckpointCheckpointArgs",
                "CUcheckpointRestoreArgs",
                "CUcheckpointUnlockArgs",
            ] {
                let s = structs.iter().find(|s| s.name == name).unwrap();
                assert_eq!(s.size, 64, "{layout:?} {name}");
                let end = s.fields.last().map(|f| f.offset + f.size);
                assert_eq!(end, Some(64), "{layout:?} {name} ends with its last field");
            }
            for absent in absent_structs(layout) {
                assert!(structs.iter().all(|s| s.name != absent));
            }
        }
    }
}
