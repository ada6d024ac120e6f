//! `gpucr check-topology [DIR]`.

use crate::cli::CheckTopologyArgs;

pub fn run(args: &CheckTopologyArgs) -> anyhow::Result<u8> {
    anyhow::bail!("check-topology is not available yet ({:?})", args.dir)
}
