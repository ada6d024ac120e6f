//! Lines to standard error that never end the command.
//!
//! `eprintln!` panics when standard error cannot be written (its reader gone: `gpucr
//! dump ... 2>&1 | head -1`), which would turn a dump or restore that went on, or
//! already happened, into exit 101. What gpucr says there is for the user; once
//! nobody reads it, the line is lost and the command's own outcome and exit status
//! stand.

use std::fmt;
use std::io::{self, Write};

/// Write `args` and a newline to standard error, ignoring a failure to write.
pub fn line(args: fmt::Arguments<'_>) {
    let mut err = io::stderr().lock();
    let _ = err.write_fmt(args).and_then(|()| err.write_all(b"\n"));
}

/// `eprintln!` that never panics: see [`line`].
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::stderr::line(format_args!($($arg)*))
    };
}
