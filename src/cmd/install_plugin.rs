//! `gpucr install-plugin`: copy the plugin into CRIU's plugin directory, or remove it.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::Context;
use gpucr_abi::engine::{criu_gpu_plugins_in, ENV_BIN, SETTINGS_FILE};
use gpucr_abi::PLUGIN_FILE;

use super::common::print_out;
use crate::cli::InstallPluginArgs;
use crate::exit_code::{self, ExitCode};
use crate::helper::locate_plugin;

/// Why the plugin directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum InstallPluginError {
    /// The directory, or the nearest of its parents that exists, is not a directory.
    #[error("{}: not a directory (--criu-libdir names CRIU's plugin directory)", path.display())]
    NotADirectory {
        /// The path that is not a directory.
        path: PathBuf,
    },
}

impl ExitCode for InstallPluginError {
    fn exit_code(&self) -> u8 {
        exit_code::IMAGE_DIR
    }
}

/// Refuse a plugin directory that is a file, or lies below one: the directory itself
/// when it exists, else the nearest parent that does, must be a directory.
fn check_libdir(dir: &Path) -> Result<(), InstallPluginError> {
    let existing = dir
        .ancestors()
        .find(|p| !p.as_os_str().is_empty() && fs::symlink_metadata(p).is_ok());
    match existing {
        Some(path) if !path.is_dir() => Err(InstallPluginError::NotADirectory {
            path: path.to_path_buf(),
        }),
        _ => Ok(()),
    }
}

pub fn run(args: &InstallPluginArgs) -> Result<u8, crate::cmd::Failure> {
    check_libdir(&args.criu_libdir)?;
    let dest = args.criu_libdir.join(PLUGIN_FILE);
    if args.uninstall {
        let _ = fs::remove_file(args.criu_libdir.join(SETTINGS_FILE));
        match fs::remove_file(&dest) {
            Ok(()) => print_out(format!("removed {}\n", dest.display()))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                print_out(format!("{} is not installed\n", dest.display()))?
            }
            Err(e) => {
                return Err(anyhow::Error::new(e)
                    .context(format!("cannot remove {}", dest.display()))
                    .into())
            }
        }
        return Ok(exit_code::SUCCESS);
    }
    let others = criu_gpu_plugins_in(&args.criu_libdir);
    if !others.is_empty() {
        let names = others
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let why = "CRIU calls each hook on its plugins in directory order and stops at the \
                   first that answers, so for a GPU process either plugin may act and the \
                   other never see it";
        if !args.force {
            return Err(anyhow::anyhow!(
                "{} holds CRIU's own GPU plugins ({names}): {why}. Install gpucr's plugin \
                 into a directory of its own (--criu-libdir DIR, with `libdir DIR` in the \
                 CRIU configuration file the engine hands CRIU; see docs/containers.md), \
                 move them aside, or pass --force",
                args.criu_libdir.display()
            )
            .into());
        }
        crate::errln!("gpucr: warning: installing beside {names}: {why}");
    }
    let plugin = locate_plugin()?;
    let settings = args.criu_libdir.join(SETTINGS_FILE);
    write_settings(&settings, &args.setting)?;
    install(&plugin, &args.criu_libdir)?;
    print_out(format!(
        "installed {} as {}\nsettings for engine mode in {}\n",
        plugin.display(),
        dest.display(),
        settings.display()
    ))?;
    Ok(exit_code::SUCCESS)
}

/// Copy `plugin` into `dir` as [`PLUGIN_FILE`]: written beside it, then renamed, so a
/// CRIU starting meanwhile loads the old copy or the new one, never half of one.
pub fn install(plugin: &Path, dir: &Path) -> anyhow::Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let dest = dir.join(PLUGIN_FILE);
    // Not ending in .so: CRIU never loads the partial copy.
    let temp = dir.join(format!(".{PLUGIN_FILE}.partial"));
    fs::copy(plugin, &temp)
        .with_context(|| format!("cannot copy {} to {}", plugin.display(), temp.display()))?;
    fs::set_permissions(&temp, fs::Permissions::from_mode(0o644))
        .with_context(|| format!("cannot set the mode of {}", temp.display()))?;
    fs::rename(&temp, &dest).with_context(|| {
        let _ = fs::remove_file(&temp);
        format!("cannot move {} to {}", temp.display(), dest.display())
    })?;
    Ok(())
}

/// The plugin's settings file: this gpucr binary, then `settings`, one `NAME=VALUE`
/// per line (written beside it and renamed, like the plugin).
fn write_settings(path: &Path, settings: &[(String, String)]) -> anyhow::Result<()> {
    let exe = std::env::current_exe()
        .and_then(fs::canonicalize)
        .context("cannot find this gpucr binary")?;
    let mut text = String::from(
        "# gpucr's plugin settings for engine mode (written by gpucr install-plugin).\n\
         # NAME=VALUE lines; CRIU's own environment wins where it sets the same name.\n",
    );
    text.push_str(&format!("{ENV_BIN}={}\n", exe.display()));
    for (name, value) in settings.iter().filter(|(n, _)| n != ENV_BIN) {
        text.push_str(&format!("{name}={value}\n"));
    }
    for (name, value) in settings.iter().filter(|(n, _)| n == ENV_BIN) {
        text.push_str(&format!("{name}={value}\n"));
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let temp = dir.join(format!(".{SETTINGS_FILE}.partial"));
    fs::write(&temp, text).with_context(|| format!("cannot write {}", temp.display()))?;
    fs::rename(&temp, path)
        .with_context(|| format!("cannot move {} to {}", temp.display(), path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_libdir_that_is_a_file_is_no_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("file");
        fs::write(&file, b"").unwrap();
        for dir in [file.clone(), file.join("below")] {
            let err = check_libdir(&dir).unwrap_err();
            assert_eq!(err.exit_code(), exit_code::IMAGE_DIR);
            assert_eq!(
                err.to_string(),
                format!(
                    "{}: not a directory (--criu-libdir names CRIU's plugin directory)",
                    file.display()
                )
            );
        }
        check_libdir(tmp.path()).unwrap();
        check_libdir(&tmp.path().join("new/sub")).unwrap();
        check_libdir(Path::new("relative/new")).unwrap();
    }
}
