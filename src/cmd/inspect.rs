//! `gpucr inspect DIR`.

use crate::cli::InspectArgs;

pub fn run(args: &InspectArgs) -> anyhow::Result<u8> {
    anyhow::bail!("inspect of {} is not available yet", args.dir.display())
}
