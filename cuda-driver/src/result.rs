//! `CUresult` codes and their names, for the codes the checkpoint API and the small
//! application side return. Numbers and names are those of `cuda.h` (`cudaError_enum`).
//! A driver that has `cuGetErrorName` names every code itself; this table names the
//! codes that matter when it does not, and lets the fake library answer
//! `cuGetErrorName` the same way.

use std::ffi::CStr;

use crate::sys::CUresult;

/// `CUDA_SUCCESS`.
pub const SUCCESS: CUresult = 0;
/// `CUDA_ERROR_INVALID_VALUE`.
pub const INVALID_VALUE: CUresult = 1;
/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const OUT_OF_MEMORY: CUresult = 2;
/// `CUDA_ERROR_NOT_INITIALIZED`.
pub const NOT_INITIALIZED: CUresult = 3;
/// `CUDA_ERROR_DEINITIALIZED`.
pub const DEINITIALIZED: CUresult = 4;
/// `CUDA_ERROR_NO_DEVICE`.
pub const NO_DEVICE: CUresult = 100;
/// `CUDA_ERROR_INVALID_DEVICE`.
pub const INVALID_DEVICE: CUresult = 101;
/// `CUDA_ERROR_INVALID_CONTEXT`.
pub const INVALID_CONTEXT: CUresult = 201;
/// `CUDA_ERROR_FILE_NOT_FOUND`.
pub const FILE_NOT_FOUND: CUresult = 301;
/// `CUDA_ERROR_OPERATING_SYSTEM`.
pub const OPERATING_SYSTEM: CUresult = 304;
/// `CUDA_ERROR_INVALID_HANDLE`.
pub const INVALID_HANDLE: CUresult = 400;
/// `CUDA_ERROR_ILLEGAL_STATE`: what the checkpoint API returns for a call in the wrong
/// process state.
pub const ILLEGAL_STATE: CUresult = 401;
/// `CUDA_ERROR_NOT_FOUND`.
pub const NOT_FOUND: CUresult = 500;
/// `CUDA_ERROR_NOT_READY`.
pub const NOT_READY: CUresult = 600;
/// `CUDA_ERROR_ILLEGAL_ADDRESS`.
pub const ILLEGAL_ADDRESS: CUresult = 700;
/// `CUDA_ERROR_LAUNCH_FAILED`.
pub const LAUNCH_FAILED: CUresult = 719;
/// `CUDA_ERROR_NOT_PERMITTED`.
pub const NOT_PERMITTED: CUresult = 800;
/// `CUDA_ERROR_NOT_SUPPORTED`.
pub const NOT_SUPPORTED: CUresult = 801;
/// `CUDA_ERROR_SYSTEM_DRIVER_MISMATCH`.
pub const SYSTEM_DRIVER_MISMATCH: CUresult = 803;
/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`.
pub const STREAM_CAPTURE_UNSUPPORTED: CUresult = 900;
/// `CUDA_ERROR_TIMEOUT`.
pub const TIMEOUT: CUresult = 909;
/// `CUDA_ERROR_UNKNOWN`.
pub const UNKNOWN: CUresult = 999;

const NAMES: &[(CUresult, &CStr)] = &[
    (SUCCESS, c"CUDA_SUCCESS"),
    (INVALID_VALUE, c"CUDA_ERROR_INVALID_VALUE"),
    (OUT_OF_MEMORY, c"CUDA_ERROR_OUT_OF_MEMORY"),
    (NOT_INITIALIZED, c"CUDA_ERROR_NOT_INITIALIZED"),
    (DEINITIALIZED, c"CUDA_ERROR_DEINITIALIZED"),
    (NO_DEVICE, c"CUDA_ERROR_NO_DEVICE"),
    (INVALID_DEVICE, c"CUDA_ERROR_INVALID_DEVICE"),
    (INVALID_CONTEXT, c"CUDA_ERROR_INVALID_CONTEXT"),
    (FILE_NOT_FOUND, c"CUDA_ERROR_FILE_NOT_FOUND"),
    (OPERATING_SYSTEM, c"CUDA_ERROR_OPERATING_SYSTEM"),
    (INVALID_HANDLE, c"CUDA_ERROR_INVALID_HANDLE"),
    (ILLEGAL_STATE, c"CUDA_ERROR_ILLEGAL_STATE"),
    (NOT_FOUND, c"CUDA_ERROR_NOT_FOUND"),
    (NOT_READY, c"CUDA_ERROR_NOT_READY"),
    (ILLEGAL_ADDRESS, c"CUDA_ERROR_ILLEGAL_ADDRESS"),
    (LAUNCH_FAILED, c"CUDA_ERROR_LAUNCH_FAILED"),
    (NOT_PERMITTED, c"CUDA_ERROR_NOT_PERMITTED"),
    (NOT_SUPPORTED, c"CUDA_ERROR_NOT_SUPPORTED"),
    (SYSTEM_DRIVER_MISMATCH, c"CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"),
    (
        STREAM_CAPTURE_UNSUPPORTED,
        c"CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
    ),
    (TIMEOUT, c"CUDA_ERROR_TIMEOUT"),
    (UNKNOWN, c"CUDA_ERROR_UNKNOWN"),
];

/// Every code of this crate's table with its name.
pub fn all() -> impl Iterator<Item = (CUresult, &'static str)> {
    NAMES
        .iter()
        .filter_map(|(code, name)| name.to_str().ok().map(|n| (*code, n)))
}

/// The name of `code` from this crate's table (`CUDA_ERROR_INVALID_VALUE`), as a C string.
pub fn name_cstr(code: CUresult) -> Option<&'static CStr> {
    NAMES.iter().find(|(c, _)| *c == code).map(|(_, n)| *n)
}

/// The name of `code` from this crate's table.
pub fn name(code: CUresult) -> Option<&'static str> {
    name_cstr(code).and_then(|n| n.to_str().ok())
}

/// The code named `name` (`CUDA_ERROR_ILLEGAL_STATE`, or without the `CUDA_ERROR_`
/// prefix: `ILLEGAL_STATE`), or a number.
pub fn parse(name: &str) -> Option<CUresult> {
    if let Ok(n) = name.parse::<CUresult>() {
        return Some(n);
    }
    NAMES.iter().find_map(|(code, full)| {
        let full = full.to_str().ok()?;
        let short = full.strip_prefix("CUDA_ERROR_").unwrap_or(full);
        (full == name || short == name).then_some(*code)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_the_codes_that_matter() {
        assert_eq!(name(ILLEGAL_STATE), Some("CUDA_ERROR_ILLEGAL_STATE"));
        assert_eq!(ILLEGAL_STATE, 401);
        assert_eq!(name(INVALID_VALUE), Some("CUDA_ERROR_INVALID_VALUE"));
        assert_eq!(name(SUCCESS), Some("CUDA_SUCCESS"));
        assert_eq!(name(TIMEOUT), Some("CUDA_ERROR_TIMEOUT"));
        assert_eq!(name(12345), None);
    }

    #[test]
    fn table_has_no_duplicates() {
        for (i, (code, n)) in NAMES.iter().enumerate() {
            for (other, m) in &NAMES[i + 1..] {
                assert_ne!(code, other, "{n:?} and {m:?}");
                assert_ne!(n, m);
            }
        }
    }

    #[test]
    fn parses_names_short_names_and_numbers() {
        assert_eq!(parse("CUDA_ERROR_OUT_OF_MEMORY"), Some(OUT_OF_MEMORY));
        assert_eq!(parse("OUT_OF_MEMORY"), Some(OUT_OF_MEMORY));
        assert_eq!(parse("801"), Some(NOT_SUPPORTED));
        assert_eq!(parse("CUDA_SUCCESS"), Some(SUCCESS));
        assert_eq!(parse("NO_SUCH_ERROR"), None);
    }
}
