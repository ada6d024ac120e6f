//! `gpucr restore DIR`: map flags to [`RestoreOptions`], restore, wait or detach.

use anyhow::Context;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::cli::RestoreArgs;
use crate::cmd::common::{print_timeline, report_out};
use crate::exit_code;
use crate::gpu::TaskTiming;
use crate::image::manifest::TimedEvent;
use crate::restore::{restore, wait_for_tree, RestoreOptions};
use crate::transfer::{GpuStats, TransferConfig};

/// Set for the helper `--lazy --detach` starts: it restores and serves.
const LAZY_HELPER: &str = "GPUCR_LAZY_HELPER";

pub fn run(args: &RestoreArgs) -> Result<u8, crate::cmd::Failure> {
    let helper = std::env::var_os(LAZY_HELPER).is_some();
    if args.lazy && args.detach && !helper {
        return detach_lazy();
    }
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
        lazy_remote: None,
        leave_stopped: false,
        skip_checks: args.topology.skip_check.clone(),
        device_timeout: Duration::from_secs(args.transfer.device_timeout.into()),
        cancel,
    };
    let mut progress = crate::cmd::terminal::progress(args.output.json, args.criu.verbose > 0);
    let result = restore(&opts, &mut progress);
    let total_ms = progress.elapsed_ms();
    // The timeline's clock, for the moment all memory is in (after the report).
    let clock = Instant::now() - Duration::from_secs_f64(total_ms / 1e3);
    let mut events = progress.finish();
    let outcome = result?;
    let serving = outcome.lazy.clone();
    if let Some(serving) = &serving {
        if !args.output.json {
            crate::errln!(
                "gpucr: note: memory is served on demand; should serving fail, the tree is \
                 killed and the reason written to {}",
                serving.log().display()
            );
        }
    }
    // With --json, the report waits until all memory is in, so that it can say when.
    let mut lazy_json = None;
    if let (Some(serving), true) = (&serving, args.output.json) {
        let summary = wait_serving(serving)?;
        let all_in_ms = clock.elapsed().as_secs_f64() * 1e3;
        events.push(TimedEvent {
            name: "all-memory-in".into(),
            at_ms: all_in_ms,
        });
        lazy_json = Some(lazy_report(&summary, &events, all_in_ms, serving));
    }
    if args.output.json {
        let value = json!({
            "pid": outcome.pid,
            "dir": args.dir,
            "detached": args.detach,
            "total_ms": total_ms,
            "events": events,
            "gpu": outcome.gpu.as_ref().map(|(stats, timings)| json!({"stats": stats, "timings": timings})),
            "lazy": lazy_json,
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
    if args.detach {
        // The tree runs; this helper serves its memory until all of it is in, its
        // output going to the log from now on: the command that started it returns.
        if let Some(serving) = serving.as_ref() {
            if helper {
                to_log(serving.log());
            }
        }
        if let Some(serving) = serving.as_ref().filter(|_| lazy_json.is_none()) {
            let summary = wait_serving(serving)?;
            report_lazy(&summary, &events, clock, args.output.json);
        }
        return Ok(exit_code::SUCCESS);
    }
    let server = serving.filter(|_| lazy_json.is_none()).map(|serving| {
        let json = args.output.json;
        let events = events.clone();
        std::thread::spawn(move || {
            let result = serving.wait();
            if let Some(Ok(summary)) = &result {
                report_lazy(summary, &events, clock, json);
            }
            (result, serving)
        })
    });
    let status = wait_for_tree(outcome.pid)
        .with_context(|| format!("cannot wait for restored pid {}", outcome.pid))?;
    if let Some(Ok((Some(Err(error)), serving))) = server.map(|t| t.join()) {
        crate::errln!(
            "gpucr: serving the tree's memory failed and the tree was killed; the reason is \
             in {}",
            serving.log().display()
        );
        return Err(crate::restore::RestoreError::Lazy(error).into());
    }
    Ok(status)
}

/// `gpucr restore --lazy --detach`: the same command again as a helper of its own
/// (process group and all, so that the terminal's signals stay with this one), which
/// restores the tree, prints what the command prints and then goes on serving the
/// tree's memory with its output in the lazy restore's log. This command passes the
/// helper's report on and returns once the helper closed its output: the tree runs, or
/// the restore failed (the helper's exit status, then; it reported nothing).
fn detach_lazy() -> Result<u8, crate::cmd::Failure> {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args(std::env::args_os().skip(1))
        .env(LAZY_HELPER, "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .process_group(0)
        .spawn()
        .context("cannot start the lazy restore's helper")?;
    let mut report = Vec::new();
    if let Some(mut out) = child.stdout.take() {
        out.read_to_end(&mut report)
            .context("cannot read the lazy restore's helper")?;
    }
    // The helper reports only once the tree runs; no report: it failed, and says why
    // on the standard error it shares with this command.
    if report.is_empty() {
        let status = child.wait()?;
        return Ok(status.code().map_or(exit_code::FAILURE, |c| c as u8));
    }
    report_out(report);
    Ok(exit_code::SUCCESS)
}

/// In the detached helper: standard output and error go to `log` from now on.
fn to_log(log: &std::path::Path) {
    use std::os::fd::AsRawFd;
    let Ok(file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
    else {
        return;
    };
    for fd in [libc::STDOUT_FILENO, libc::STDERR_FILENO] {
        // SAFETY: both descriptors are open; dup2 replaces fd with a duplicate of the
        // log's, which stays open after `file` is dropped.
        unsafe { libc::dup2(file.as_raw_fd(), fd) };
    }
}

/// Wait until all memory is in; a failure (the tree killed) names the log.
fn wait_serving(
    serving: &crate::lazy::Serving,
) -> Result<crate::lazy::Summary, crate::cmd::Failure> {
    match serving.wait() {
        Some(Ok(summary)) => Ok(summary),
        Some(Err(error)) => {
            crate::errln!(
                "gpucr: serving the tree's memory failed and the tree was killed; the reason \
                 is in {}",
                serving.log().display()
            );
            Err(crate::restore::RestoreError::Lazy(error).into())
        }
        None => Err(anyhow::anyhow!("the lazy-pages server was waited for twice").into()),
    }
}

/// The `lazy` object of `--json`: when the tree resumed and when all memory was in (the
/// timeline's clock), and how the memory came.
fn lazy_report(
    summary: &crate::lazy::Summary,
    events: &[TimedEvent],
    all_in_ms: f64,
    serving: &crate::lazy::Serving,
) -> serde_json::Value {
    let page = summary.page_size.max(1);
    json!({
        "resumed_ms": resumed_ms(events),
        "all_in_ms": all_in_ms,
        "fault_pages": summary.fault_bytes / page,
        "fault_bytes": summary.fault_bytes,
        "background_pages": summary.background_bytes / page,
        "background_bytes": summary.background_bytes,
        "zero_pages": summary.zero_pages,
        "tasks": summary.tasks,
        "forks": summary.forks,
        "log": serving.log(),
    })
}

/// When the tree resumed: CRIU's restore done.
fn resumed_ms(events: &[TimedEvent]) -> Option<f64> {
    events
        .iter()
        .find(|e| e.name == "criu-done")
        .map(|e| e.at_ms)
}

/// When all memory was in, and how it came.
fn report_lazy(summary: &crate::lazy::Summary, events: &[TimedEvent], clock: Instant, json: bool) {
    if json {
        return;
    }
    let page = summary.page_size.max(1);
    crate::errln!(
        "all memory in at {:.1} ms (the tree resumed at {:.1} ms; {:.1} ms after the \
         lazy-pages server started): {} pages ({}) on fault, {} pages ({}) in the \
         background, {} zero pages, {} tasks ({} forked)",
        clock.elapsed().as_secs_f64() * 1e3,
        resumed_ms(events).unwrap_or(0.0),
        summary.elapsed.as_secs_f64() * 1000.0,
        summary.fault_bytes / page,
        crate::units::size(summary.fault_bytes),
        summary.background_bytes / page,
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
