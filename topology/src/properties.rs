//! The KFD properties the checks compare between a checkpointed GPU and a local one
//! (CRIU's `device_properties_match`), each with the check that covers it, and their
//! values as read once per GPU.

use crate::checks::CheckName;
use crate::model::KfdNode;

/// KFD properties that must be equal, with the check that covers each. Their values are
/// read once per GPU ([`property_values`]), in this order, then [`AT_LEAST_PROPERTIES`].
pub(crate) const EQUAL_PROPERTIES: &[(CheckName, &str)] = &[
    (CheckName::SimdCount, "simd_count"),
    (CheckName::MemBanksCount, "mem_banks_count"),
    (CheckName::MaxWavesPerSimd, "max_waves_per_simd"),
    (CheckName::LdsSizeInKb, "lds_size_in_kb"),
    (CheckName::WaveFrontSize, "wave_front_size"),
    (CheckName::ArrayCount, "array_count"),
    (CheckName::SimdArraysPerEngine, "simd_arrays_per_engine"),
    (CheckName::CuPerSimdArray, "cu_per_simd_array"),
    (CheckName::SimdPerCu, "simd_per_cu"),
    (CheckName::MaxSlotsScratchCu, "max_slots_scratch_cu"),
    (CheckName::VendorId, "vendor_id"),
    (CheckName::DeviceId, "device_id"),
    (CheckName::NumSdmaEngines, "num_sdma_engines"),
    (CheckName::NumSdmaXgmiEngines, "num_sdma_xgmi_engines"),
    (
        CheckName::NumSdmaQueuesPerEngine,
        "num_sdma_queues_per_engine",
    ),
    (CheckName::NumCpQueues, "num_cp_queues"),
    (CheckName::Capability, "capability"),
];

/// KFD properties whose local value must be at least the checkpointed one.
pub(crate) const AT_LEAST_PROPERTIES: &[(CheckName, &str)] = &[
    (CheckName::NumGws, "num_gws"),
    (CheckName::CachesCount, "caches_count"),
    (CheckName::FwVersion, "fw_version"),
    (CheckName::SdmaFwVersion, "sdma_fw_version"),
];

/// The values of the compared KFD properties of `node`, in table order (0 when absent).
pub(crate) fn property_values(node: &KfdNode) -> Vec<u64> {
    EQUAL_PROPERTIES
        .iter()
        .chain(AT_LEAST_PROPERTIES)
        .map(|(_, key)| node.prop(key))
        .collect()
}
