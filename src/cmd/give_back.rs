//! The end that the give-back guards (`gpucr cuda-guard`, `gpucr sim-guard`) share:
//! say what they gave back, and mark the image incomplete when the dump wrote no
//! manifest.

use std::io;
use std::path::Path;

use crate::exit_code;
use crate::gpu::give_back::{summary, GivenBack};
use crate::gpu::GpuError;
use crate::image::{dir, MANIFEST_FILE};

/// A give-back guard's whole run: read the records gpucr sends on standard input until
/// it says the dump is done or dies; if it died with processes recorded, give each back
/// (`give_back_all`, with the tasks `tasks` makes of the record lines) and [`report`]
/// it.
pub fn run_guard<T>(
    name: &str,
    what: &str,
    images_dir: &Path,
    tasks: impl FnOnce(&[String]) -> Vec<T>,
    give_back_all: impl FnOnce(&[T]) -> Result<Vec<GivenBack>, GpuError>,
) -> Result<u8, crate::cmd::Failure> {
    crate::guard::ignore_terminal_signals();
    let records = crate::guard::read_records(io::stdin().lock());
    let tasks = tasks(&records.lines);
    if records.done || tasks.is_empty() {
        return Ok(exit_code::SUCCESS);
    }
    let given = give_back_all(&tasks)?;
    Ok(report(name, what, images_dir, &given))
}

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
    crate::errln!("gpucr {name}: {reason}");
    if !images_dir.join(MANIFEST_FILE).exists() {
        let _ = dir::mark_incomplete(images_dir, &reason);
    }
    if given.iter().all(|g| g.result.is_ok()) {
        exit_code::SUCCESS
    } else {
        exit_code::GIVE_BACK_FAILED
    }
}
