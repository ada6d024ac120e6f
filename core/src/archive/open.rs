//! Open a checkpoint archive for streaming: zstd, gzip or plain tar, told apart by their
//! first bytes (not by the file name).

use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use serde::Serialize;

use super::ArchiveError;

const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// How the tar stream is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    Zstd,
    Gzip,
    None,
}

impl Compression {
    pub fn name(self) -> &'static str {
        match self {
            Compression::Zstd => "zstd",
            Compression::Gzip => "gzip",
            Compression::None => "none",
        }
    }

    /// The compression of a stream that starts with `head`.
    pub fn detect(head: &[u8]) -> Compression {
        if head.starts_with(&ZSTD_MAGIC) {
            Compression::Zstd
        } else if head.starts_with(&GZIP_MAGIC) {
            Compression::Gzip
        } else {
            Compression::None
        }
    }
}

/// The decompressed tar stream of the archive at `path`.
pub fn open(path: &Path) -> Result<(Compression, Box<dyn Read>), ArchiveError> {
    let err = |source| ArchiveError::Open {
        path: path.to_path_buf(),
        source,
    };
    let mut file = gpucr_criu_image::store::open_regular(path).map_err(err)?;
    let mut head = [0u8; 4];
    let mut got = 0;
    while got < head.len() {
        match file.read(&mut head[got..]).map_err(err)? {
            0 => break,
            n => got += n,
        }
    }
    file.seek(SeekFrom::Start(0)).map_err(err)?;
    let compression = Compression::detect(&head[..got]);
    let buffered = BufReader::with_capacity(1 << 20, file);
    let stream: Box<dyn Read> = match compression {
        Compression::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(buffered).map_err(
            |e| ArchiveError::Open {
                path: path.to_path_buf(),
                source: io::Error::other(e),
            },
        )?),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(buffered)),
        Compression::None => Box::new(buffered),
    };
    Ok((compression, stream))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_is_told_by_magic() {
        assert_eq!(Compression::detect(&ZSTD_MAGIC), Compression::Zstd);
        assert_eq!(Compression::detect(&[0x1f, 0x8b, 8, 0]), Compression::Gzip);
        assert_eq!(Compression::detect(b"chec"), Compression::None);
        assert_eq!(Compression::detect(b""), Compression::None);
    }
}
