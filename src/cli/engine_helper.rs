//! `gpucr engine-helper` (hidden): the helper gpucr's plugin starts itself inside a
//! CRIU that a container engine runs.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

/// Serve one dump or restore for gpucr's plugin in a CRIU that gpucr did not start.
///
/// Started by the plugin, never by hand: fd 3 is the plugin's connector, fd 4 the
/// status pipe (see docs/containers.md, "Engine mode").
#[derive(Debug, Clone, Args)]
pub struct EngineHelperArgs {
    /// What CRIU is doing.
    #[arg(value_enum)]
    pub stage: EngineStageArg,

    /// CRIU's image directory.
    #[arg(long, value_name = "DIR")]
    pub images_dir: PathBuf,

    /// The CRIU process (the helper ends when it does).
    #[arg(long, value_name = "PID")]
    pub criu_pid: i32,

    /// The root of the dumped tree (dump only).
    #[arg(long, value_name = "PID")]
    pub pid: Option<i32>,
}

/// The stage of the CRIU run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EngineStageArg {
    Dump,
    Restore,
}
