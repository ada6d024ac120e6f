//! `gpucr restore DIR`: map flags to [`RestoreOptions`], restore, wait or detach.

use anyhow::Context;
use serde_json::json;

use crate::cli::RestoreArgs;
use crate::cmd::common::{network_lock, print_timeline};
use crate::exit_code;
use crate::progress::Progress;
use crate::restore::{restore, wait_for_tree, RestoreOptions};

pub fn run(args: &RestoreArgs) -> anyhow::Result<u8> {
    let opts = RestoreOptions {
        dir: args.dir.clone(),
        tcp_established: args.tcp_established,
        shell_job: args.shell_job,
        ext_unix_sk: args.ext_unix_sk,
        file_locks: args.file_locks,
        network_lock: args.network_lock.map(network_lock),
        criu: args.criu.criu.clone(),
        verbose: args.criu.verbose > 0,
        verify_first: args.verify_first,
    };
    let mut progress = Progress::new(args.output.json, args.criu.verbose > 0);
    let result = restore(&opts, &mut progress);
    let total_ms = progress.elapsed_ms();
    let events = progress.finish();
    let outcome = result?;
    if args.output.json {
        let value = json!({
            "pid": outcome.pid,
            "dir": args.dir,
            "detached": args.detach,
            "total_ms": total_ms,
            "events": events,
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else if args.detach {
        println!("{}", outcome.pid);
    } else {
        eprintln!("restored pid {} from {}", outcome.pid, args.dir.display());
        print_timeline(&events, total_ms);
    }
    if args.detach {
        return Ok(exit_code::SUCCESS);
    }
    wait_for_tree(outcome.pid)
        .with_context(|| format!("cannot wait for restored pid {}", outcome.pid))
}
