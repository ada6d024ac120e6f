//! How the engine works: threads, chunk size, compression, staging memory.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::error::TransferError;

/// The smallest chunk size accepted.
pub const MIN_CHUNK_SIZE: usize = 4 << 10;
/// The largest chunk size accepted (and the largest chunk a restore will allocate for).
pub const MAX_CHUNK_SIZE: usize = 256 << 20;
/// The most worker threads (and so data files) one transfer uses.
pub const MAX_JOBS: usize = 1024;

/// How chunks are compressed on dump. Restore reads whatever each chunk says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Store every non-zero chunk as it is.
    None,
    /// zstd at this level (negative levels are zstd's fast modes); a chunk that does not
    /// shrink below 97% of its size is stored raw.
    Zstd(i32),
}

impl Default for Compression {
    fn default() -> Self {
        Compression::Zstd(1)
    }
}

impl fmt::Display for Compression {
    /// The command-line spelling: `none` or `zstd:LEVEL`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Compression::None => f.write_str("none"),
            Compression::Zstd(level) => write!(f, "zstd:{level}"),
        }
    }
}

/// A `--compress` value that is not `none`, `zstd` or `zstd:LEVEL`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid compression {0:?}: expected none, zstd or zstd:LEVEL (LEVEL from {min} to {max})", min = zstd_levels().start(), max = zstd_levels().end())]
pub struct ParseCompressionError(pub String);

fn zstd_levels() -> std::ops::RangeInclusive<i32> {
    zstd::compression_level_range()
}

impl FromStr for Compression {
    type Err = ParseCompressionError;

    /// `none`, `zstd` (level 1) or `zstd:LEVEL`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ParseCompressionError(s.to_string());
        match s {
            "none" => Ok(Compression::None),
            "zstd" => Ok(Compression::default()),
            _ => {
                let level = s.strip_prefix("zstd:").ok_or_else(bad)?;
                let level: i32 = level.parse().map_err(|_| bad())?;
                if zstd_levels().contains(&level) {
                    Ok(Compression::Zstd(level))
                } else {
                    Err(bad())
                }
            }
        }
    }
}

/// How a transfer runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransferConfig {
    /// Worker threads per stage (`--jobs`); on dump also the number of data files; on
    /// restore the reader threads (each copy queue has a writer thread besides).
    pub jobs: usize,
    /// Bytes per chunk on dump (restore uses the image's own chunk size).
    pub chunk_size: usize,
    /// Compression on dump (`--compress`).
    pub compression: Compression,
    /// Bytes of chunks that a restore may stage before their buffer is handed over
    /// (`--max-staging`): decompressed chunks in memory, raw ones read ahead into the
    /// page cache. Besides it, each copy queue holds up to `QUEUE_DEPTH` chunks read for
    /// handed-over buffers, each reader one chunk, and a few decompression buffers are
    /// kept for reuse.
    pub max_staging: u64,
}

/// The default chunk size: large enough that per-chunk costs (a pread, a zstd frame, an
/// index record of 48 bytes) vanish, small enough that a chunk stays in a core's L2/L3
/// cache between the copy, the checksum and the write. Measured on the benchmark of
/// docs/benchmarks.md (2 cores): 1 MiB dumps faster than 2 and 4 MiB, uncompressed and
/// with zstd, at the same compressed size.
pub const DEFAULT_CHUNK_SIZE: usize = 1 << 20;
/// The default staging bound on restore.
pub const DEFAULT_MAX_STAGING: u64 = 1 << 30;

impl Default for TransferConfig {
    fn default() -> Self {
        TransferConfig {
            jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
            chunk_size: DEFAULT_CHUNK_SIZE,
            compression: Compression::default(),
            max_staging: DEFAULT_MAX_STAGING,
        }
    }
}

impl TransferConfig {
    /// Reject values the engine cannot work with.
    pub fn validate(&self) -> Result<(), TransferError> {
        let bad = |what: String| Err(TransferError::Config { what });
        if self.jobs == 0 || self.jobs > MAX_JOBS {
            return bad(format!(
                "jobs must be between 1 and {MAX_JOBS}, not {}",
                self.jobs
            ));
        }
        if !(MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&self.chunk_size) {
            return bad(format!(
                "chunk size must be between {MIN_CHUNK_SIZE} and {MAX_CHUNK_SIZE} bytes, not {}",
                self.chunk_size
            ));
        }
        if let Compression::Zstd(level) = self.compression {
            if !zstd_levels().contains(&level) {
                return bad(format!("zstd level {level} is out of range"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_compression() {
        assert_eq!("none".parse(), Ok(Compression::None));
        assert_eq!("zstd".parse(), Ok(Compression::Zstd(1)));
        assert_eq!("zstd:7".parse(), Ok(Compression::Zstd(7)));
        assert_eq!("zstd:-3".parse(), Ok(Compression::Zstd(-3)));
        for bad in ["", "zstd:", "zstd:x", "zstd:99", "lz4", "ZSTD"] {
            assert!(bad.parse::<Compression>().is_err(), "{bad}");
        }
        assert_eq!(Compression::Zstd(3).to_string(), "zstd:3");
        assert_eq!(Compression::None.to_string(), "none");
    }

    #[test]
    fn validates_config() {
        assert!(TransferConfig::default().validate().is_ok());
        let jobs0 = TransferConfig {
            jobs: 0,
            ..TransferConfig::default()
        };
        assert!(jobs0.validate().is_err());
        let tiny = TransferConfig {
            chunk_size: 100,
            ..TransferConfig::default()
        };
        assert!(tiny.validate().is_err());
    }
}
