//! `gpucr dump PID DIR`: map flags to [`DumpOptions`], print the result.

use std::time::Duration;

use serde_json::json;

use crate::cli::{CudaStagingArg, DumpArgs};
use crate::cmd::common::{print_timeline, report_out, size, tree_dump};
use crate::dump::{dump, DumpOptions};
use crate::exit_code;
use crate::migrate::tree::StoppedTree;
use crate::transfer::TransferConfig;

pub fn run(args: &DumpArgs) -> Result<u8, crate::cmd::Failure> {
    crate::interrupt::install()?;
    // The command's token: Ctrl-C (or SIGTERM, SIGHUP) cancels it, and it reaches the
    // verification, the helper's requests, the GPU transfer and the backends' waits.
    let cancel = crate::cancel::Cancel::new();
    let _interrupts = crate::interrupt::cancels(cancel.clone());
    let (flags, network_lock, timeout) = tree_dump(&args.tree);
    let opts = DumpOptions {
        pid: args.pid,
        dir: args.dir.clone(),
        leave_running: args.leave_running || args.leave_stopped,
        flags,
        network_lock,
        timeout,
        force: args.force,
        criu: args.criu.criu.clone(),
        verbose: args.criu.verbose > 0,
        transfer: TransferConfig {
            compression: args.compress,
            jobs: args
                .transfer
                .jobs
                .map_or(TransferConfig::default().jobs, usize::from),
            ..TransferConfig::default()
        },
        device_timeout: Duration::from_secs(args.transfer.device_timeout.into()),
        cuda_staging: args.cuda_staging.map(CudaStagingArg::staging),
        criu_config: args.criu.criu_config.clone(),
        no_page_checksums: args.no_page_checksums,
        stop_after: args.leave_stopped,
        pages_in_tree: false,
        cancel,
    };
    // With --leave-stopped, tasks stopped by their owner stay stopped whatever happens
    // (the walk of the tree is only for that).
    let tree = args
        .leave_stopped
        .then(|| StoppedTree::before_freeze(args.pid));
    let mut progress = crate::cmd::terminal::progress(args.output.json, args.criu.verbose > 0);
    let result = dump(&opts, &mut progress);
    progress.finish();
    let outcome = match result {
        Ok(outcome) => outcome,
        Err(error) => {
            if let Some(tree) = &tree {
                // A dump that failed after CRIU's post-dump may have stopped the tree.
                tree.resume();
            }
            return Err(error.into());
        }
    };
    if let Some(tree) = tree {
        // The SIGSTOPs came while CRIU held the tasks: wait until each is stopped.
        tree.stop().map_err(|e| {
            anyhow::anyhow!(
                "the image in {} is complete, but {e}; the tree runs on",
                args.dir.display()
            )
        })?;
    }
    let m = &outcome.manifest;
    if args.output.json {
        let value = json!({
            "pid": m.target.pid,
            "comm": m.target.comm,
            "dir": args.dir,
            "criu_version": m.criu_version,
            "left_running": m.options.leave_running && !args.leave_stopped,
            "left_stopped": args.leave_stopped,
            "image_bytes": outcome.image_bytes,
            "pages_bytes": outcome.pages_bytes,
            "files": m.files.len(),
            "total_ms": m.timings.total_ms,
            "events": m.timings.events,
            "gpu": m.gpu.as_ref().map(|g| json!({
                "backend": g.backend,
                "tasks": g.tasks.len(),
                "stats": g.stats,
                "timings": g.timings,
            })),
        });
        report_out(serde_json::to_string_pretty(&value)? + "\n");
    } else {
        let mut text = format!(
            "dumped pid {} ({}) to {}: {} in {} files ({} of memory pages), {}\n",
            m.target.pid,
            m.target.comm,
            args.dir.display(),
            size(outcome.image_bytes),
            m.files.len(),
            size(outcome.pages_bytes),
            if args.leave_stopped {
                "left stopped"
            } else if m.options.leave_running {
                "left running"
            } else {
                "tree killed"
            },
        );
        if let Some(g) = &m.gpu {
            text += &format!(
                "GPU ({}): {} buffers of {} tasks, {} stored as {}\n",
                g.backend,
                g.stats.buffers,
                g.tasks.len(),
                size(g.stats.raw_bytes),
                size(g.stats.stored_bytes)
            );
        }
        report_out(text);
        print_timeline(&m.timings.events, m.timings.total_ms);
    }
    Ok(exit_code::SUCCESS)
}
