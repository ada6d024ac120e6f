//! `gpucr restore DIR`: map flags to [`RestoreOptions`], restore, wait or detach.

use anyhow::Context;
use serde_json::json;

use crate::cli::RestoreArgs;
use crate::cmd::common::print_timeline;
use crate::exit_code;
use crate::progress::Progress;
use crate::restore::{restore, wait_for_tree, RestoreOptions};
use crate::transfer::TransferConfig;

pub fn run(args: &RestoreArgs) -> anyhow::Result<u8> {
    let opts = RestoreOptions {
        dir: args.dir.clone(),
        tcp_established: args.tcp_established,
        shell_job: args.shell_job,
        ext_unix_sk: args.ext_unix_sk,
        file_locks: args.file_locks,
        criu: args.criu.criu.clone(),
        verbose: args.criu.verbose > 0,
        verify_first: args.verify_first,
        transfer: TransferConfig {
            jobs: args
                .transfer
                .jobs
                .map_or(TransferConfig::default().jobs, usize::from),
            max_staging: args.max_staging,
            ..TransferConfig::default()
        },
        no_parallel_restore: args.no_parallel_restore,
        sysfs_root: args.topology.sysfs_root.clone(),
        skip_checks: args.topology.skip_check.clone(),
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
            "gpu": outcome.gpu.as_ref().map(|(stats, timings)| json!({"stats": stats, "timings": timings})),
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else if args.detach {
        println!("{}", outcome.pid);
    } else {
        eprintln!("restored pid {} from {}", outcome.pid, args.dir.display());
        print_timeline(&events, total_ms);
        if let Some((stats, timings)) = &outcome.gpu {
            eprintln!(
                "  GPU memory: {} buffers, {:.1} MiB",
                stats.buffers,
                stats.raw_bytes as f64 / 1048576.0
            );
            for t in timings {
                eprintln!(
                    "    task {:>5}: {:>8.1} MiB filled {:>8.1} ms -> {:>8.1} ms (helper clock)",
                    t.ns_pid,
                    t.bytes as f64 / 1048576.0,
                    t.start_ms.unwrap_or(0.0),
                    t.end_ms.unwrap_or(0.0)
                );
            }
        }
    }
    if args.detach {
        return Ok(exit_code::SUCCESS);
    }
    wait_for_tree(outcome.pid)
        .with_context(|| format!("cannot wait for restored pid {}", outcome.pid))
}
