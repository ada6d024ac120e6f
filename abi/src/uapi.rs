//! What the kernel uAPI modules ([`crate::kfd`], [`crate::amdgpu_drm`]) share: ioctl
//! request codes computed the way the kernel's `_IOC` macros compute them, the macros that
//! declare a `#[repr(C)]` type, a constant or an ioctl number together with its checks, and
//! the lists of [`Fact`]s those macros export (gathered by [`crate::uapi_facts`]).
//!
//! Each declaration is written once: the macro emits the definition, a compile-time
//! assertion of its size, of every field's offset (and, for ioctl numbers, of the literal
//! value on targets with the generic `_IOC` encoding), and an entry in the module's fact
//! list. `abi/tests/uapi_headers.rs` compiles a C program that evaluates every fact against
//! the system headers and fails on any difference (see `docs/amdgpu.md`).

use std::fmt;

/// One fact about the kernel interface that the header check compares with C.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fact {
    /// `sizeof(c_type)` is `value`.
    Size { c_type: &'static str, value: usize },
    /// `offsetof(c_type, member)` is `value`. `member` is the C member designator (a Rust
    /// raw identifier's `r#` is dropped by [`Fact::c_expr`]).
    Offset {
        c_type: &'static str,
        member: &'static str,
        value: usize,
    },
    /// The macro `name` (or enum constant), converted to the Rust type `rust_type`
    /// (`u8`, `u32`, `i32` or `u64`), is `value`.
    Value {
        name: &'static str,
        rust_type: &'static str,
        value: i128,
    },
}

impl Fact {
    /// The C expression that evaluates this fact in a program including the headers.
    pub fn c_expr(&self) -> String {
        match *self {
            Fact::Size { c_type, .. } => format!("sizeof({c_type})"),
            Fact::Offset { c_type, member, .. } => {
                let member = member.strip_prefix("r#").unwrap_or(member);
                format!("offsetof({c_type}, {member})")
            }
            Fact::Value {
                name, rust_type, ..
            } => format!("(({})({name}))", c_type_of(rust_type)),
        }
    }

    /// Whether the C expression has a signed type (printed with `%lld`, not `%llu`).
    pub fn is_signed(&self) -> bool {
        matches!(self, Fact::Value { rust_type, .. } if rust_type.starts_with('i'))
    }

    /// The value gpucr uses.
    pub fn value(&self) -> i128 {
        match *self {
            Fact::Size { value, .. } | Fact::Offset { value, .. } => value as i128,
            Fact::Value { value, .. } => value,
        }
    }
}

impl fmt::Display for Fact {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} = {}", self.c_expr(), self.value())
    }
}

/// The `<linux/types.h>` type with the same width and signedness as a Rust integer type.
fn c_type_of(rust_type: &str) -> &'static str {
    match rust_type {
        "u8" => "__u8",
        "u16" => "__u16",
        "u32" => "__u32",
        "u64" => "__u64",
        "i32" => "__s32",
        "i64" => "__s64",
        other => panic!("no C type for Rust type {other} in a uAPI constant"),
    }
}

// The `_IOC` encoding (include/uapi/asm-generic/ioctl.h, and the arch overrides in
// arch/{powerpc,mips,sparc}/include/uapi/asm/ioctl.h).
#[cfg(not(any(
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "mips",
    target_arch = "mips32r6",
    target_arch = "mips64",
    target_arch = "mips64r6",
    target_arch = "sparc",
    target_arch = "sparc64"
)))]
mod enc {
    pub const NONE: u32 = 0;
    pub const WRITE: u32 = 1;
    pub const READ: u32 = 2;
    pub const SIZEBITS: u32 = 14;
    pub const GENERIC: bool = true;
}
#[cfg(any(
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "mips",
    target_arch = "mips32r6",
    target_arch = "mips64",
    target_arch = "mips64r6",
    target_arch = "sparc",
    target_arch = "sparc64"
))]
mod enc {
    pub const NONE: u32 = 1;
    pub const READ: u32 = 2;
    pub const WRITE: u32 = 4;
    pub const SIZEBITS: u32 = 13;
    pub const GENERIC: bool = false;
}

/// `_IOC_NONE`, `_IOC_WRITE`, `_IOC_READ` of this target.
pub const IOC_NONE: u32 = enc::NONE;
pub const IOC_WRITE: u32 = enc::WRITE;
pub const IOC_READ: u32 = enc::READ;
/// Whether this target uses the generic `_IOC` encoding (x86, arm, aarch64, riscv, ...).
/// The literal request numbers in the uAPI modules are asserted only there.
pub const GENERIC_IOC: bool = enc::GENERIC;

const IOC_NRSHIFT: u32 = 0;
const IOC_TYPESHIFT: u32 = 8;
const IOC_SIZESHIFT: u32 = 16;
const IOC_DIRSHIFT: u32 = IOC_SIZESHIFT + enc::SIZEBITS;

/// `_IOC(dir, type, nr, size)`. Fails to compile (when used in a constant) if `size` does
/// not fit the size field.
pub const fn ioc(dir: u32, ty: u8, nr: u8, size: usize) -> u32 {
    assert!(
        size < (1 << enc::SIZEBITS),
        "ioctl argument too large for _IOC"
    );
    (dir << IOC_DIRSHIFT)
        | ((size as u32) << IOC_SIZESHIFT)
        | ((ty as u32) << IOC_TYPESHIFT)
        | ((nr as u32) << IOC_NRSHIFT)
}

/// `_IO(type, nr)`.
pub const fn io(ty: u8, nr: u8) -> u32 {
    ioc(IOC_NONE, ty, nr, 0)
}

/// `_IOR(type, nr, T)`: the kernel writes a `T` to user space.
pub const fn ior<T>(ty: u8, nr: u8) -> u32 {
    ioc(IOC_READ, ty, nr, size_of::<T>())
}

/// `_IOW(type, nr, T)`: the kernel reads a `T` from user space.
pub const fn iow<T>(ty: u8, nr: u8) -> u32 {
    ioc(IOC_WRITE, ty, nr, size_of::<T>())
}

/// `_IOWR(type, nr, T)`: both.
pub const fn iowr<T>(ty: u8, nr: u8) -> u32 {
    ioc(IOC_READ | IOC_WRITE, ty, nr, size_of::<T>())
}

/// Declares `#[repr(C)]` structs and unions with the C type each mirrors, its size and
/// every field's offset; emits compile-time assertions of all of them and `pub const
/// LAYOUT: &[Fact]` listing them for the header check.
///
/// ```text
/// /// docs
/// #[derive(...)]
/// pub struct Name = "struct c_name", size 56 {
///     /// docs
///     pub field: u64 => 0,
///     pub r#in: Inner => 0 as "in",   // optional C member designator
/// }
/// ```
macro_rules! uapi_types {
    (
        $(
            $(#[$attr:meta])*
            $vis:vis $kind:ident $name:ident = $ctype:literal, size $size:literal {
                $(
                    $(#[$fattr:meta])*
                    $fvis:vis $field:ident : $fty:ty => $off:literal $(as $cmember:literal)?
                ),* $(,)?
            }
        )*
    ) => {
        $(
            $(#[$attr])*
            #[repr(C)]
            $vis $kind $name {
                $( $(#[$fattr])* $fvis $field: $fty, )*
            }

            const _: () = {
                assert!(::std::mem::size_of::<$name>() == $size);
                $( assert!(::std::mem::offset_of!($name, $field) == $off); )*
            };
        )*

        /// The size and every field offset of every type in this module, with the C type
        /// each mirrors (checked against the system headers by `tests/uapi_headers.rs`).
        pub const LAYOUT: &[$crate::uapi::Fact] = &[
            $(
                $crate::uapi::Fact::Size { c_type: $ctype, value: $size },
                $(
                    $crate::uapi::Fact::Offset {
                        c_type: $ctype,
                        member: uapi_types!(@member $field $($cmember)?),
                        value: $off,
                    },
                )*
            )*
        ];
    };
    (@member $field:ident $cmember:literal) => { $cmember };
    (@member $field:ident) => { stringify!($field) };
}

/// Declares constants named exactly as the C macros (or enum constants) they mirror, and
/// `pub const $list: &[Fact]` listing them for the header check.
macro_rules! uapi_consts {
    (
        $list:ident;
        $( $(#[$attr:meta])* $name:ident : $ty:ident = $value:expr; )*
    ) => {
        $( $(#[$attr])* pub const $name: $ty = $value; )*

        /// The constants above, for the header check.
        pub const $list: &[$crate::uapi::Fact] = &[
            $(
                $crate::uapi::Fact::Value {
                    name: stringify!($name),
                    rust_type: stringify!($ty),
                    value: $name as i128,
                },
            )*
        ];
    };
}

/// Declares ioctl request numbers (`u32`, named as the C macros), each computed with
/// [`ior`]/[`iow`]/[`iowr`] and asserted equal to its literal value on targets with the
/// generic encoding; emits `pub const IOCTLS: &[Fact]`.
macro_rules! uapi_ioctls {
    ( $( $(#[$attr:meta])* $name:ident = $value:expr, $literal:literal; )* ) => {
        $(
            $(#[$attr])*
            #[doc = concat!("\n\nValue on x86-64 and other generic `_IOC` targets: `", stringify!($literal), "`.")]
            pub const $name: u32 = $value;
            const _: () = assert!(!$crate::uapi::GENERIC_IOC || $name == $literal);
        )*

        /// The ioctl request numbers above, for the header check.
        pub const IOCTLS: &[$crate::uapi::Fact] = &[
            $(
                $crate::uapi::Fact::Value {
                    name: stringify!($name),
                    rust_type: "u32",
                    value: $name as i128,
                },
            )*
        ];
    };
}

pub(crate) use {uapi_consts, uapi_ioctls, uapi_types};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioc_matches_known_values() {
        // _IOR('K', 0x01, 8 bytes), _IOWR('K', 0x22, 56 bytes), _IOW('d', 0x09, 8 bytes),
        // _IO('d', 0x1f): the generic encoding (read 2, write 1, none 0 in the top two
        // bits), or that of powerpc, mips and sparc (read 2, write 4, none 1 in the top
        // three).
        let expected: [u32; 4] = if GENERIC_IOC {
            [0x8008_4B01, 0xC038_4B22, 0x4008_6409, 0x0000_641F]
        } else {
            [0x4008_4B01, 0xC038_4B22, 0x8008_6409, 0x2000_641F]
        };
        assert_eq!(ior::<[u32; 2]>(b'K', 0x01), expected[0]);
        assert_eq!(iowr::<[u64; 7]>(b'K', 0x22), expected[1]);
        assert_eq!(iow::<u64>(b'd', 0x09), expected[2]);
        assert_eq!(io(b'd', 0x1f), expected[3]);
    }

    #[test]
    fn c_expressions() {
        let size = Fact::Size {
            c_type: "struct x",
            value: 8,
        };
        assert_eq!(size.c_expr(), "sizeof(struct x)");
        let off = Fact::Offset {
            c_type: "union y",
            member: "r#in",
            value: 0,
        };
        assert_eq!(off.c_expr(), "offsetof(union y, in)");
        let val = Fact::Value {
            name: "A",
            rust_type: "i32",
            value: -2,
        };
        assert_eq!(val.c_expr(), "((__s32)(A))");
        assert!(val.is_signed());
        assert!(!off.is_signed());
    }
}
