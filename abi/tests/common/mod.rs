//! What the header checks of this crate share: the C compiler they compile with.

use std::process::Command;

/// The C compiler: `CC`, else `cc`.
pub fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".to_string())
}

/// Fails, naming the compiler and the package that brings one, when it does not run;
/// `check` names the test that needs it.
pub fn require_cc(check: &str) {
    match Command::new(cc()).arg("--version").output() {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!(
            "the C compiler `{}` does not run: {}",
            cc(),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => panic!(
            "no C compiler `{}` ({e}); the {check} needs one (Debian: gcc)",
            cc()
        ),
    }
}
