//! What a transfer did, for the manifest, `gpucr inspect` and the final report.

use serde::{Deserialize, Serialize};

use super::index::GpuIndex;

/// Totals of one dump or restore of GPU memory.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuStats {
    pub buffers: usize,
    /// Bytes of buffer contents.
    pub raw_bytes: u64,
    /// Bytes stored in the data files (chunk payloads; headers and index excluded).
    pub stored_bytes: u64,
    pub zero_chunks: u64,
    pub raw_chunks: u64,
    pub compressed_chunks: u64,
    /// Wall time of the transfer.
    pub seconds: f64,
}

impl GpuStats {
    /// The totals of an image's index, with the time the transfer took.
    pub fn of_index(index: &GpuIndex, seconds: f64) -> GpuStats {
        let mut stats = GpuStats {
            buffers: index.buffers.len(),
            seconds,
            ..GpuStats::default()
        };
        for b in &index.buffers {
            stats.raw_bytes += b.len;
            stats.stored_bytes += b.stored_bytes;
            stats.zero_chunks += b.zero_chunks;
            stats.raw_chunks += b.raw_chunks;
            stats.compressed_chunks += b.compressed_chunks;
        }
        stats
    }

    /// Buffer bytes per second (0 when nothing was timed).
    pub fn bytes_per_second(&self) -> f64 {
        if self.seconds > 0.0 {
            self.raw_bytes as f64 / self.seconds
        } else {
            0.0
        }
    }
}
