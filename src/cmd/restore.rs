//! `gpucr restore DIR`: map flags to [`RestoreOptions`], restore, wait or detach.

use anyhow::Context;
use std::time::Duration;

use serde_json::json;

use crate::cli::RestoreArgs;
use crate::cmd::common::{print_timeline, report_out};
use crate::exit_code;
use crate::gpu::TaskTiming;
use crate::image::manifest::TimedEvent;
use crate::restore::{restore, wait_for_tree, RestoreOptions};
use crate::transfer::{GpuStats, TransferConfig};

pub fn run(args: &RestoreArgs) -> Result<u8, crate::cmd::Failure> {
    crate::interrupt::install()?;
    // The command's token: Ctrl-C (or SIGTERM, SIGHUP) cancels it, and it reaches the
    // verification, the helper's requests, the GPU transfer and the backends' waits.
    let cancel = crate::cancel::Cancel::new();
    let _interrupts = crate::interrupt::cancels(cancel.clone());
    let opts = RestoreOptions {
        dir: args.dir.clone(),
        flags: crate::criu::CriuFlags {
            tcp_established: args.tcp_established,
            shell_job: args.shell_job,
            ext_unix_sk: args.ext_unix_sk,
            file_locks: args.file_locks,
        },
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
        cuda_visible_devices: std::env::var(gpucr_topology::nvidia::visible::VARIABLE).ok(),
        criu_config: args.criu.criu_config.clone(),
        lazy: args.lazy,
        skip_checks: args.topology.skip_check.clone(),
        device_timeout: Duration::from_secs(args.transfer.device_timeout.into()),
        cancel,
    };
    let mut progress = crate::cmd::terminal::progress(args.output.json, args.criu.verbose > 0);
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
        report_out(serde_json::to_string_pretty(&value)? + "\n");
    } else {
        if args.detach {
            report_out(format!("{}\n", outcome.pid));
        } else {
            crate::errln!("restored pid {} from {}", outcome.pid, args.dir.display());
        }
        print_timeline(&events, total_ms);
        if let Some((stats, timings)) = &outcome.gpu {
            print_gpu_fill(&events, stats, timings);
        }
    }
    let serving = outcome.lazy.clone();
    if args.detach {
        // The tree runs; this command serves its memory until all of it is in.
        if let Some(result) = serving.as_ref().and_then(|s| s.wait()) {
            let summary = result.map_err(crate::restore::RestoreError::Lazy)?;
            report_lazy(&summary, args.output.json);
        }
        return Ok(exit_code::SUCCESS);
    }
    let server = serving.map(|serving| {
        let json = args.output.json;
        std::thread::spawn(move || {
            let result = serving.wait();
            if let Some(Ok(summary)) = &result {
                report_lazy(summary, json);
            }
            result
        })
    });
    let status = wait_for_tree(outcome.pid)
        .with_context(|| format!("cannot wait for restored pid {}", outcome.pid))?;
    if let Some(Ok(Some(Err(error)))) = server.map(|t| t.join()) {
        return Err(crate::restore::RestoreError::Lazy(error).into());
    }
    Ok(status)
}

/// When all memory was in, and how it came.
fn report_lazy(summary: &crate::lazy::Summary, json: bool) {
    if json {
        return;
    }
    crate::errln!(
        "all memory in {:.1} ms after the lazy-pages server started: {} on fault, {} in \
         the background, {} zero pages, {} tasks ({} forked)",
        summary.elapsed.as_secs_f64() * 1000.0,
        crate::units::size(summary.fault_bytes),
        crate::units::size(summary.background_bytes),
        summary.zero_pages,
        summary.tasks,
        summary.forks
    );
}

/// When each task's GPU memory was filled, on the timeline's clock, next to when CRIU
/// restored the tasks: where the two overlap, the GPU copy ran in parallel with CRIU.
fn print_gpu_fill(events: &[TimedEvent], stats: &GpuStats, timings: &[TaskTiming]) {
    let at = |name: &str| events.iter().find(|e| e.name == name).map(|e| e.at_ms);
    crate::errln!(
        "  GPU memory: {} buffers, {}",
        stats.buffers,
        crate::units::size(stats.raw_bytes)
    );
    let criu = at("pre-restore").zip(at("post-restore"));
    if let Some((from, to)) = criu {
        crate::errln!("    CRIU restoring the tasks   {from:>8.1} ms -> {to:>8.1} ms");
    }
    for t in timings {
        crate::errln!(
            "    task {:>5}: {:>10} filled {:>8.1} ms -> {:>8.1} ms",
            t.ns_pid,
            crate::units::size(t.bytes),
            t.start_ms.unwrap_or(0.0),
            t.end_ms.unwrap_or(0.0)
        );
    }
    let fill_from = timings.iter().filter_map(|t| t.start_ms).reduce(f64::min);
    let fill_to = timings.iter().filter_map(|t| t.end_ms).reduce(f64::max);
    if let (Some((criu_from, criu_to)), Some(from), Some(to)) = (criu, fill_from, fill_to) {
        let overlap = to.min(criu_to) - from.max(criu_from);
        if overlap > 0.0 {
            crate::errln!(
                "    GPU memory was filled while CRIU restored the tasks for {overlap:.1} ms"
            );
        }
    }
}
