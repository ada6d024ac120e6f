//! The checkpoint API's argument structs, read and written by the layouts NVIDIA's
//! headers give ([`crate::cuda_h`], generated from `cuda.h` of each CUDA version), not
//! by gpucr's own declarations: a driver reporting version V reads the structs of the
//! newest header not newer than V.
//!
//! Every field named `reserved…` or `padding…` must be zero, as the driver requires.

use std::ffi::c_void;
use std::ptr;

use crate::cuda_h::{CUuuid, Header, Struct, HEADERS};

/// Arguments that break the header's rules, or a version without a header.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ArgsError {
    /// No supported header is as old as the version.
    #[error("no CUDA header for driver version {0} (the oldest is {oldest})", oldest = HEADERS[0].cuda_version)]
    NoHeader(i32),
    /// The version's header does not have this struct or field.
    #[error("CUDA {wheel} has no {what}")]
    Missing {
        /// The header's wheel version.
        wheel: &'static str,
        /// `struct` or `struct.field`.
        what: String,
    },
    /// A reserved or padding field is not zero.
    #[error("{0}: reserved bytes are not zero")]
    ReservedNotZero(String),
}

/// The header of a driver reporting `version`: the newest one not newer than it.
pub fn header(version: i32) -> Result<&'static Header, ArgsError> {
    HEADERS
        .iter()
        .rev()
        .find(|h| h.cuda_version <= version)
        .ok_or(ArgsError::NoHeader(version))
}

fn find_struct(h: &'static Header, name: &str) -> Result<&'static Struct, ArgsError> {
    h.structs
        .iter()
        .find(|s| s.name == name)
        .ok_or_else(|| ArgsError::Missing {
            wheel: h.wheel,
            what: name.to_string(),
        })
}

/// A struct of a header at an address.
struct View {
    wheel: &'static str,
    layout: &'static Struct,
    base: *const u8,
}

impl View {
    fn new(h: &'static Header, name: &str, base: *const c_void) -> Result<Self, ArgsError> {
        Ok(Self {
            wheel: h.wheel,
            layout: find_struct(h, name)?,
            base: base.cast(),
        })
    }

    fn has(&self, field: &str) -> bool {
        self.layout.fields.iter().any(|f| f.name == field)
    }

    fn field(&self, field: &str) -> Result<(usize, usize), ArgsError> {
        self.layout
            .fields
            .iter()
            .find(|f| f.name == field)
            .map(|f| (f.offset, f.size))
            .ok_or_else(|| ArgsError::Missing {
                wheel: self.wheel,
                what: format!("{}.{field}", self.layout.name),
            })
    }

    /// The field's bytes.
    ///
    /// # Safety
    /// `base` points to `layout.size` readable bytes.
    unsafe fn bytes(&self, field: &str) -> Result<&[u8], ArgsError> {
        let (offset, size) = self.field(field)?;
        // SAFETY: the field lies inside the struct, which the caller guarantees readable.
        Ok(unsafe { std::slice::from_raw_parts(self.base.add(offset), size) })
    }

    /// A field read as a native integer of its size (4 or 8 bytes).
    ///
    /// # Safety
    /// As [`View::bytes`].
    unsafe fn uint(&self, field: &str) -> Result<u64, ArgsError> {
        // SAFETY: as the caller guarantees.
        let b = unsafe { self.bytes(field)? };
        Ok(match b.len() {
            4 => u64::from(u32::from_ne_bytes(b.try_into().expect("4 bytes"))),
            8 => u64::from_ne_bytes(b.try_into().expect("8 bytes")),
            n => panic!("{}.{field} is {n} bytes, not an integer", self.layout.name),
        })
    }

    /// Fails when a `reserved…` or `padding…` field is not zero.
    ///
    /// # Safety
    /// As [`View::bytes`].
    unsafe fn check_reserved(&self) -> Result<(), ArgsError> {
        for f in self.layout.fields {
            if f.name.starts_with("reserved") || f.name.starts_with("padding") {
                // SAFETY: as the caller guarantees.
                if unsafe { self.bytes(f.name)? }.iter().any(|b| *b != 0) {
                    return Err(ArgsError::ReservedNotZero(format!(
                        "{}.{}",
                        self.layout.name, f.name
                    )));
                }
            }
        }
        Ok(())
    }
}

/// `CUcheckpointLockArgs`: the timeout in milliseconds (0: none; null args: none).
///
/// # Safety
/// `args` is null or points to a readable struct of `h`'s layout.
pub unsafe fn lock(h: &'static Header, args: *const c_void) -> Result<u32, ArgsError> {
    if args.is_null() {
        return Ok(0);
    }
    let v = View::new(h, "CUcheckpointLockArgs", args)?;
    // SAFETY: as the caller guarantees.
    unsafe {
        v.check_reserved()?;
        Ok(v.uint("timeoutMs")? as u32)
    }
}

/// `CUcheckpointUnlockArgs`: only reserved fields.
///
/// # Safety
/// As [`lock`].
pub unsafe fn unlock(h: &'static Header, args: *const c_void) -> Result<(), ArgsError> {
    if args.is_null() {
        return Ok(());
    }
    // SAFETY: as the caller guarantees.
    unsafe { View::new(h, "CUcheckpointUnlockArgs", args)?.check_reserved() }
}

/// `CUcheckpointCheckpointArgs`: `customStorageInfo_out` where the header has it (null:
/// host staging).
///
/// # Safety
/// As [`lock`].
pub unsafe fn checkpoint(
    h: &'static Header,
    args: *const c_void,
) -> Result<*mut *mut c_void, ArgsError> {
    if args.is_null() {
        return Ok(ptr::null_mut());
    }
    let v = View::new(h, "CUcheckpointCheckpointArgs", args)?;
    // SAFETY: as the caller guarantees.
    unsafe {
        v.check_reserved()?;
        custom_out(&v)
    }
}

/// `customStorageInfo_out`, or null where the struct has none.
///
/// # Safety
/// As [`View::bytes`].
unsafe fn custom_out(v: &View) -> Result<*mut *mut c_void, ArgsError> {
    if !v.has("customStorageInfo_out") {
        return Ok(ptr::null_mut());
    }
    // SAFETY: as the caller guarantees.
    Ok(unsafe { v.uint("customStorageInfo_out")? } as usize as *mut *mut c_void)
}

/// What restore arguments ask for.
#[derive(Debug)]
pub struct Restore {
    /// The GPU pairs (old, new UUID bytes).
    pub pairs: Vec<(CUuuid, CUuuid)>,
    /// `customStorageInfo_out` (null: from host memory).
    pub custom_storage_info_out: *mut *mut c_void,
}

/// `CUcheckpointRestoreArgs`, with the GPU pairs it points to copied.
///
/// # Safety
/// As [`lock`]; a non-null `gpuPairs` with a non-zero count points to that many
/// readable `CUcheckpointGpuPair`s.
pub unsafe fn restore(h: &'static Header, args: *const c_void) -> Result<Restore, ArgsError> {
    let mut out = Restore {
        pairs: Vec::new(),
        custom_storage_info_out: ptr::null_mut(),
    };
    if args.is_null() {
        return Ok(out);
    }
    let v = View::new(h, "CUcheckpointRestoreArgs", args)?;
    // SAFETY: as the caller guarantees.
    unsafe {
        v.check_reserved()?;
        out.custom_storage_info_out = custom_out(&v)?;
        if !v.has("gpuPairs") {
            return Ok(out);
        }
        let pairs = v.uint("gpuPairs")? as usize as *const u8;
        let count = v.uint("gpuPairsCount")? as usize;
        if pairs.is_null() || count == 0 {
            return Ok(out);
        }
        let pair = find_struct(h, "CUcheckpointGpuPair")?;
        for i in 0..count {
            let p = View {
                wheel: h.wheel,
                layout: pair,
                base: pairs.add(i * pair.size),
            };
            let uuid = |field: &str| -> Result<CUuuid, ArgsError> {
                let b = p.bytes(field)?;
                Ok(CUuuid {
                    bytes: b.try_into().expect("a CUuuid is 16 bytes"),
                })
            };
            out.pairs.push((uuid("oldUuid")?, uuid("newUuid")?));
        }
    }
    Ok(out)
}

/// One GPU's region of a custom-storage operation.
#[derive(Debug, Clone, Copy)]
pub struct Region {
    /// `devPtr`.
    pub dev_ptr: u64,
    /// `size`.
    pub size: usize,
    /// `stream`.
    pub stream: usize,
}

/// `CUcheckpointCustomStorageInfo` and its `CUcheckpointCustomStoragePerDeviceData`
/// array, laid out as the header says, in memory this value owns.
#[derive(Debug)]
pub struct CustomStorageInfo {
    info: Box<[u64]>,
    _per_device: Box<[u64]>,
}

fn put(buf: &mut [u64], offset: usize, size: usize, value: u64) {
    // SAFETY: `buf` is a `[u64]`, viewed as its bytes; the range is checked by slicing.
    let bytes = unsafe {
        std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(buf))
    };
    let dst = &mut bytes[offset..offset + size];
    match size {
        4 => dst.copy_from_slice(&(value as u32).to_ne_bytes()),
        8 => dst.copy_from_slice(&value.to_ne_bytes()),
        n => panic!("a {n}-byte field is not an integer or pointer"),
    }
}

impl CustomStorageInfo {
    /// Builds the information of `handle` and `regions` in `h`'s layout.
    pub fn new(h: &'static Header, handle: usize, regions: &[Region]) -> Result<Self, ArgsError> {
        let info_s = find_struct(h, "CUcheckpointCustomStorageInfo")?;
        let dev_s = find_struct(h, "CUcheckpointCustomStoragePerDeviceData")?;
        let field = |s: &'static Struct, name: &str| {
            s.fields
                .iter()
                .find(|f| f.name == name)
                .map(|f| (f.offset, f.size))
                .ok_or_else(|| ArgsError::Missing {
                    wheel: h.wheel,
                    what: format!("{}.{name}", s.name),
                })
        };
        let words = |bytes: usize| bytes.div_ceil(8).max(1);
        let mut per_device = vec![0u64; words(dev_s.size * regions.len())].into_boxed_slice();
        let (dp, ds) = field(dev_s, "devPtr")?;
        let (sp, ss) = field(dev_s, "size")?;
        let (tp, ts) = field(dev_s, "stream")?;
        for (i, r) in regions.iter().enumerate() {
            let at = i * dev_s.size;
            put(&mut per_device, at + dp, ds, r.dev_ptr);
            put(&mut per_device, at + sp, ss, r.size as u64);
            put(&mut per_device, at + tp, ts, r.stream as u64);
        }
        let mut info = vec![0u64; words(info_s.size)].into_boxed_slice();
        let (o, s) = field(info_s, "handle")?;
        put(&mut info, o, s, handle as u64);
        let (o, s) = field(info_s, "perDeviceData")?;
        put(&mut info, o, s, per_device.as_mut_ptr() as u64);
        let (o, s) = field(info_s, "deviceCount")?;
        put(&mut info, o, s, regions.len() as u64);
        Ok(Self {
            info,
            _per_device: per_device,
        })
    }

    /// The `CUcheckpointCustomStorageInfo *` to hand out.
    pub fn as_ptr(&mut self) -> *mut c_void {
        self.info.as_mut_ptr().cast()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_choose_the_newest_header_not_newer() {
        assert_eq!(header(12070).unwrap_err(), ArgsError::NoHeader(12070));
        assert_eq!(header(12080).unwrap().wheel, "12.8.90");
        assert_eq!(header(13020).unwrap().cuda_version, 13020);
        assert_eq!(header(13045).unwrap().cuda_version, 13040);
        let newest = HEADERS.last().unwrap().cuda_version;
        assert_eq!(header(99000).unwrap().cuda_version, newest);
    }

    #[test]
    fn restore_arguments_of_each_version() {
        let pairs = [[1u8; 16], [2u8; 16]];
        for h in HEADERS {
            let s = find_struct(h, "CUcheckpointRestoreArgs").unwrap();
            let mut raw = [0u64; 8];
            assert_eq!(s.size, 64);
            let fields: Vec<&str> = s.fields.iter().map(|f| f.name).collect();
            if fields.contains(&"gpuPairs") {
                let count = s.fields.iter().find(|f| f.name == "gpuPairsCount").unwrap();
                let at = s.fields.iter().find(|f| f.name == "gpuPairs").unwrap();
                put(&mut raw, at.offset, at.size, pairs.as_ptr() as u64);
                put(&mut raw, count.offset, count.size, 1);
            }
            // SAFETY: `raw` is 64 readable bytes, its pairs pointer points to one pair.
            let r = unsafe { restore(h, raw.as_ptr().cast()) }.unwrap();
            if fields.contains(&"gpuPairs") {
                assert_eq!(r.pairs.len(), 1, "{}", h.wheel);
                assert_eq!(r.pairs[0].0.bytes, [1; 16]);
                assert_eq!(r.pairs[0].1.bytes, [2; 16]);
            } else {
                assert!(r.pairs.is_empty(), "{}", h.wheel);
            }
            raw[7] = 1;
            // SAFETY: as above.
            let err = unsafe { restore(h, raw.as_ptr().cast()) }.unwrap_err();
            assert!(matches!(err, ArgsError::ReservedNotZero(_)), "{}", h.wheel);
        }
    }

    #[test]
    fn custom_storage_only_where_the_header_has_it() {
        for h in HEADERS {
            let has = h.cuda_version >= 13040;
            let regions = [Region {
                dev_ptr: 0xc500_0000_0000_0000,
                size: 4096,
                stream: 0x57e0_0000,
            }];
            assert_eq!(
                CustomStorageInfo::new(h, 7, &regions).is_ok(),
                has,
                "{}",
                h.wheel
            );
            let mut out: *mut c_void = ptr::null_mut();
            let mut raw = [0u64; 8];
            raw[0] = (&mut out as *mut *mut c_void) as u64;
            // SAFETY: `raw` is 64 readable bytes.
            let got = unsafe { checkpoint(h, raw.as_ptr().cast()) };
            if has {
                assert_eq!(got.unwrap() as u64, raw[0]);
            } else {
                assert!(got.is_err(), "a pointer in a reserved word, {}", h.wheel);
            }
        }
    }

    #[test]
    fn lock_timeout_and_reserved_words() {
        let h = header(13000).unwrap();
        let mut raw = [0u64; 8];
        raw[0] = 2500;
        // SAFETY: `raw` is 64 readable bytes.
        assert_eq!(unsafe { lock(h, raw.as_ptr().cast()) }, Ok(2500));
        raw[3] = 1;
        // SAFETY: as above.
        assert!(unsafe { lock(h, raw.as_ptr().cast()) }.is_err());
        // SAFETY: as above.
        assert!(unsafe { unlock(h, raw.as_ptr().cast()) }.is_err());
    }
}
