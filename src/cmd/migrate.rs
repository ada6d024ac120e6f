//! `gpucr migrate`, `gpucr receive` and `gpucr keygen`: flags to the library's options,
//! the result printed.

use std::time::Duration;

use serde_json::json;

use crate::cli::{IdentityArgs, KeygenArgs, MigrateArgs, ReceiveArgs};
use crate::cmd::common::{print_out, report_out, size, tree_dump};
use crate::dump::DumpOptions;
use crate::exit_code;
use crate::migrate::{IdentityFiles, MigrateOptions, ReceiveOptions};
use crate::restore::RestoreOptions;
use crate::transfer::TransferConfig;

fn identity(args: &IdentityArgs) -> IdentityFiles {
    IdentityFiles {
        key: args.key.clone(),
        cert: args.cert.clone(),
        peer_cert: args.peer_cert.clone(),
    }
}

fn jobs(args: &crate::cli::TransferArgs) -> usize {
    args.jobs
        .map_or(TransferConfig::default().jobs, usize::from)
}

/// `gpucr migrate PID HOST[:PORT]`.
pub fn run(args: &MigrateArgs) -> Result<u8, crate::cmd::Failure> {
    crate::interrupt::install()?;
    let cancel = crate::cancel::Cancel::new();
    let _interrupts = crate::interrupt::cancels(cancel.clone());
    let (flags, network_lock, timeout) = tree_dump(&args.tree);
    let opts = MigrateOptions {
        to: args.to.clone(),
        identity: identity(&args.identity),
        timeout: Duration::from_secs(args.link_timeout.into()),
        staging: args.staging.clone(),
        dump: DumpOptions {
            pid: args.pid,
            dir: Default::default(),
            leave_running: true,
            flags,
            network_lock,
            timeout,
            force: false,
            criu: args.criu.criu.clone(),
            verbose: args.criu.verbose > 0,
            transfer: TransferConfig {
                jobs: jobs(&args.transfer),
                compression: args.compress,
                ..TransferConfig::default()
            },
            device_timeout: Duration::from_secs(args.transfer.device_timeout.into()),
            cuda_staging: None,
            criu_config: args.criu.criu_config.clone(),
            no_page_checksums: false,
            stop_after: true,
            // Set by `migrate` itself, for post-copy.
            pages_in_tree: false,
            cancel,
        },
        post_copy: args.post_copy,
        lanes: args.lanes,
    };
    let mut progress = crate::cmd::terminal::progress(args.output.json, args.criu.verbose > 0);
    let result = crate::migrate::migrate(&opts, &mut progress);
    let events = progress.finish();
    let outcome = result?;
    if args.output.json {
        let value = json!({
            "pid": args.pid,
            "peer": outcome.peer,
            "remote_pid": outcome.remote_pid,
            "remote_dir": outcome.remote_dir,
            "files": outcome.files,
            "bytes": outcome.bytes,
            "frozen_ms": outcome.frozen.as_secs_f64() * 1e3,
            "sent_ms": outcome.sent.as_secs_f64() * 1e3,
            "post_copy": args.post_copy,
            "downtime_ms": outcome.downtime.map(|d| d.as_secs_f64() * 1e3),
            "pages_in_tree_bytes": outcome.pages_in_tree,
            "pages_staged_bytes": outcome.pages_staged,
            "streamed_bytes": outcome.streamed,
            "lanes": outcome.lanes,
            "events": events,
        });
        report_out(serde_json::to_string_pretty(&value)? + "\n");
    } else {
        let frozen = match outcome.downtime {
            Some(down) => format!(
                "running there {:.1} ms after the freeze, all memory in after {:.1} ms \
                 (post-copy)",
                down.as_secs_f64() * 1e3,
                outcome.frozen.as_secs_f64() * 1e3
            ),
            None => format!(
                "frozen {:.1} ms, {} of it sent while CRIU dumped",
                outcome.frozen.as_secs_f64() * 1e3,
                size(outcome.streamed)
            ),
        };
        report_out(format!(
            "migrated pid {} to {}: pid {} there, image {} ({} in {} files, over {} lanes), \
             {frozen}\n",
            args.pid,
            outcome.peer,
            outcome.remote_pid,
            outcome.remote_dir,
            size(outcome.bytes),
            outcome.files,
            outcome.lanes,
        ));
    }
    Ok(exit_code::SUCCESS)
}

/// `gpucr receive`.
pub fn receive(args: &ReceiveArgs) -> Result<u8, crate::cmd::Failure> {
    crate::interrupt::install()?;
    let cancel = crate::cancel::Cancel::new();
    let _interrupts = crate::interrupt::cancels(cancel.clone());
    let opts = ReceiveOptions {
        listen: args.listen.clone(),
        dir: args.dir.clone(),
        identity: identity(&args.identity),
        timeout: Duration::from_secs(args.link_timeout.into()),
        once: args.once,
        restore: RestoreOptions {
            criu: args.criu.criu.clone(),
            verbose: args.criu.verbose > 0,
            transfer: TransferConfig {
                jobs: jobs(&args.transfer),
                ..TransferConfig::default()
            },
            sysfs_root: args.topology.sysfs_root.clone(),
            skip_checks: args.topology.skip_check.clone(),
            device_timeout: Duration::from_secs(args.transfer.device_timeout.into()),
            cuda_visible_devices: std::env::var(gpucr_topology::nvidia::visible::VARIABLE).ok(),
            criu_config: args.criu.criu_config.clone(),
            cancel,
            ..RestoreOptions::default()
        },
    };
    let mut progress = crate::cmd::terminal::progress(args.output.json, args.criu.verbose > 0);
    let result = crate::migrate::receive(&opts, &mut progress, &mut |addr| {
        crate::errln!("gpucr: listening on {addr}");
    });
    let events = progress.finish();
    let outcome = result?;
    if args.output.json {
        let value = json!({
            "pid": outcome.pid,
            "peer": outcome.peer,
            "dir": outcome.dir,
            "files": outcome.files,
            "bytes": outcome.bytes,
            "events": events,
            "gpu": outcome.gpu.as_ref().map(|(stats, timings)| json!({"stats": stats, "timings": timings})),
        });
        report_out(serde_json::to_string_pretty(&value)? + "\n");
    } else {
        crate::errln!(
            "received from {}: {} in {} files into {}",
            outcome.peer,
            size(outcome.bytes),
            outcome.files,
            outcome.dir.display()
        );
        report_out(format!("{}\n", outcome.pid));
    }
    Ok(exit_code::SUCCESS)
}

/// `gpucr keygen NAME`.
pub fn keygen(args: &KeygenArgs) -> Result<u8, crate::cmd::Failure> {
    let files = crate::migrate::keygen(&args.dir, &args.name)?;
    print_out(format!(
        "{}\n{}\n",
        files.key.display(),
        files.cert.display()
    ))?;
    Ok(exit_code::SUCCESS)
}
