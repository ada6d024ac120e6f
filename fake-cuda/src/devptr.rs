//! Device pointers: opaque handles that say where the memory is. The top byte tags the
//! kind: an application's allocation (GPU ordinal in bits 40..48, offset in its GPU's
//! memory file below), or a region of a custom-storage operation mapped into a
//! controlling process (slot in bits 40..56, offset below).

/// Tag of an application allocation.
const APP: u64 = 0xA1;
/// Tag of a mapped custom-storage region.
const MAPPED: u64 = 0xC5;
const OFFSET_BITS: u32 = 40;
const OFFSET_MASK: u64 = (1 << OFFSET_BITS) - 1;

/// What a device pointer points into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DevPtr {
    /// An application's device memory: `offset` in GPU `ordinal`'s file.
    App {
        /// The GPU ordinal.
        ordinal: u8,
        /// Offset in its memory file.
        offset: u64,
    },
    /// A region of a custom-storage operation: `offset` in region `slot`.
    Mapped {
        /// The region.
        slot: u16,
        /// Offset in it.
        offset: u64,
    },
}

impl DevPtr {
    /// The pointer's value.
    pub fn encode(self) -> u64 {
        match self {
            Self::App { ordinal, offset } => {
                (APP << 56) | (u64::from(ordinal) << OFFSET_BITS) | (offset & OFFSET_MASK)
            }
            Self::Mapped { slot, offset } => {
                (MAPPED << 56) | (u64::from(slot) << OFFSET_BITS) | (offset & OFFSET_MASK)
            }
        }
    }

    /// What a value points into (`None`: not a pointer this fake handed out).
    pub fn decode(value: u64) -> Option<Self> {
        let offset = value & OFFSET_MASK;
        match value >> 56 {
            APP if (value >> 48) & 0xff == 0 => Some(Self::App {
                ordinal: ((value >> OFFSET_BITS) & 0xff) as u8,
                offset,
            }),
            MAPPED => Some(Self::Mapped {
                slot: ((value >> OFFSET_BITS) & 0xffff) as u16,
                offset,
            }),
            _ => None,
        }
    }

    /// The largest offset a pointer can carry.
    pub const MAX_OFFSET: u64 = OFFSET_MASK;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for p in [
            DevPtr::App {
                ordinal: 3,
                offset: 4096,
            },
            DevPtr::Mapped {
                slot: 700,
                offset: DevPtr::MAX_OFFSET,
            },
        ] {
            assert_eq!(DevPtr::decode(p.encode()), Some(p));
            assert_ne!(p.encode(), 0);
        }
        assert_eq!(DevPtr::decode(0), None);
        assert_eq!(DevPtr::decode(0x1234), None);
    }
}
