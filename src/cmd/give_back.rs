//! The end that the give-back guards (`gpucr cuda-guard`, `gpucr sim-guard`) share:
//! say what they gave back, and mark the image incomplete when the dump wrote no
//! manifest.

use std::path::Path;

use crate::exit_code;
use crate::gpu::give_back::{summary, GivenBack};
use crate::image::{dir, MANIFEST_FILE};

/// Report what the guard `name` (its subcommand) of the `what` processes gave back
/// after gpucr died during the dump into `images_dir`: on standard error and, unless
/// the dump got as far as its manifest, in the image's incomplete marker. The exit
/// code says whether every process was given back.
pub fn report(name: &str, what: &str, images_dir: &Path, given: &[GivenBack]) -> u8 {
    if given.is_empty() {
        return exit_code::SUCCESS;
    }
    let reason = format!(
        "gpucr ended during the dump without finishing it; its {what} guard gave the \
         processes back: {}",
        summary(given)
    );
    eprintln!("gpucr {name}: {reason}");
    if !images_dir.join(MANIFEST_FILE).exists() {
        let _ = dir::mark_incomplete(images_dir, &reason);
    }
    if given.iter().all(|g| g.result.is_ok()) {
        exit_code::SUCCESS
    } else {
        exit_code::GIVE_BACK_FAILED
    }
}
