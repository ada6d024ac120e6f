//! GPU UUIDs: the 16 bytes of `CUuuid`, written as NVIDIA tools write them
//! (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`).

use std::fmt;
use std::str::FromStr;

use crate::sys::CUuuid;

/// A GPU's UUID.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Uuid(pub [u8; 16]);

/// A string that is not a GPU UUID.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("not a GPU UUID: {text:?} (expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")]
pub struct UuidError {
    /// The text that did not parse.
    pub text: String,
}

impl Uuid {
    /// As the driver's `CUuuid`.
    pub fn to_cu(self) -> CUuuid {
        CUuuid { bytes: self.0 }
    }

    /// From the driver's `CUuuid`.
    pub fn from_cu(uuid: CUuuid) -> Self {
        Self(uuid.bytes)
    }
}

impl fmt::Display for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("GPU-")?;
        for (i, b) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl FromStr for Uuid {
    type Err = UuidError;

    /// Parses `GPU-` followed by 32 hex digits in groups 8-4-4-4-12 (the prefix and the
    /// dashes are optional).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = || UuidError {
            text: text.to_owned(),
        };
        let hex: Vec<u8> = text
            .strip_prefix("GPU-")
            .unwrap_or(text)
            .bytes()
            .filter(|b| *b != b'-')
            .collect();
        if hex.len() != 32 {
            return Err(err());
        }
        let mut out = [0u8; 16];
        for (i, pair) in hex.chunks(2).enumerate() {
            let s = std::str::from_utf8(pair).map_err(|_| err())?;
            out[i] = u8::from_str_radix(s, 16).map_err(|_| err())?;
        }
        Ok(Self(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_text() {
        let u = Uuid([
            0xfa, 0x6e, 0xc0, 0xda, 0, 1, 0x40, 2, 0x80, 3, 4, 5, 6, 7, 8, 9,
        ]);
        let text = u.to_string();
        assert_eq!(text, "GPU-fa6ec0da-0001-4002-8003-040506070809");
        assert_eq!(text.parse::<Uuid>(), Ok(u));
        assert_eq!(
            "fa6ec0da00014002800304050607080 9".parse::<Uuid>().ok(),
            None
        );
        assert!("GPU-1234".parse::<Uuid>().is_err());
        assert!("GPU-zz6ec0da-0001-4002-8003-040506070809"
            .parse::<Uuid>()
            .is_err());
    }
}
