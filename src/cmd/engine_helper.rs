//! `gpucr engine-helper`: the clap arguments to [`EngineRun`].

use crate::cli::{EngineHelperArgs, EngineStageArg};
use crate::engine::{self, EngineRun, EngineStage};

pub fn run(args: &EngineHelperArgs) -> u8 {
    engine::run(&EngineRun {
        stage: match args.stage {
            EngineStageArg::Dump => EngineStage::Dump,
            EngineStageArg::Restore => EngineStage::Restore,
        },
        images_dir: args.images_dir.clone(),
        criu_pid: args.criu_pid,
        pid: args.pid,
    })
}
