//! `gpucr migrate` and `gpucr receive` with real CRIU, between two hosts: network
//! namespaces the test makes, on one bridge (`tests/common/hosts.rs`), the source and
//! the job in one, the receiver in the other, each addressing the other only inside them. gpucr and the job enter a
//! namespace with `nsenter --net` (not `ip netns exec`, which also gives the command a
//! mount namespace of its own, which CRIU would then see the job not share).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::hosts::{Host, Hosts};
use common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const PORT: &str = "7431";

/// `HOST:PORT` of the receiver in the destination's namespace.
fn destination(hosts: &Hosts) -> String {
    format!("{}:{PORT}", hosts.address(Host::Destination))
}

/// A test workload, started in the source's namespace in a PID namespace of its own:
/// the sample CPU workload, or the simulator's GPU workload.
struct Job {
    state: PathBuf,
    unshare: Child,
    pid: i32,
    /// The processes that write journals.
    roles: Vec<&'static str>,
}

impl Job {
    /// The sample workload holding `mib` MiB.
    fn start(hosts: &Hosts, state: &Path, mib: u32) -> Job {
        let job = Job::start_program(
            hosts,
            &workload_bin(),
            state,
            &["--memory-mib", &mib.to_string()],
            &[],
            ROLES.to_vec(),
        );
        wait_for(Duration::from_secs(30), "the workload to be ready", || {
            state.join("ready").exists().then_some(())
        });
        job.wait_ticks(2);
        job
    }

    /// The simulator's GPU workload (a parent and a child), its devices under `sim`.
    fn start_gpu(hosts: &Hosts, state: &Path, sim: &SimRoot, args: &[&str]) -> Job {
        Job::start_device_workload(hosts, "sim_workload", state, args, &sim.env())
    }

    /// The example `name`, a GPU workload of a parent and a child (the simulator's, or
    /// the fake CUDA driver's) with `env`, once both are ready and have ticked twice.
    fn start_device_workload(
        hosts: &Hosts,
        name: &str,
        state: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Job {
        let bin = gpucr_bin().parent().unwrap().join("examples").join(name);
        let job = Job::start_program(hosts, &bin, state, args, env, vec!["parent", "child"]);
        wait_for(
            Duration::from_secs(120),
            &format!("{name} to be ready"),
            || {
                job.roles
                    .iter()
                    .all(|r| state.join(format!("ready-{r}")).exists())
                    .then_some(())
            },
        );
        job.wait_ticks(2);
        job
    }

    fn start_program(
        hosts: &Hosts,
        bin: &Path,
        state: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        roles: Vec<&'static str>,
    ) -> Job {
        std::fs::create_dir_all(state).unwrap();
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", hosts.path(Host::Source).display()))
            .args(["unshare", "--pid", "--fork", "setsid"])
            .arg(bin)
            .arg("--state")
            .arg(state)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        inherit_no_fds(&mut cmd);
        let unshare = cmd.spawn().expect("spawn the workload");
        let pid = first_child(unshare.id(), "the workload's root process");
        Job {
            state: state.to_path_buf(),
            unshare,
            pid,
            roles,
        }
    }

    /// Wait until every role has written `n` more journal lines than now: the job runs.
    fn wait_ticks(&self, n: usize) {
        let start: Vec<usize> = self
            .roles
            .iter()
            .map(|r| read_journal(&self.state, r).len())
            .collect();
        wait_for(Duration::from_secs(60), "the workload to tick", || {
            self.roles
                .iter()
                .zip(&start)
                .all(|(r, s)| read_journal(&self.state, r).len() >= s + n)
                .then_some(())
        });
    }

    /// The GPU workload's processes checked every byte of their device buffers
    /// (request number `request`): true when all match.
    fn verify_gpu_memory(&self, request: u64) -> bool {
        std::fs::write(self.state.join("verify"), request.to_string()).unwrap();
        wait_for(
            Duration::from_secs(120),
            "the buffers to be verified",
            || {
                let lines: Vec<JournalLine> = self
                    .roles
                    .iter()
                    .filter_map(|r| read_journal(&self.state, r).pop())
                    .collect();
                if lines.iter().any(|l| l.num("bad") != 0) {
                    return Some(false);
                }
                (lines.len() == self.roles.len()
                    && lines.iter().all(|l| l.num("verified") >= request))
                .then_some(true)
            },
        )
    }

    /// The job runs on at the source: its root is there, not stopped, and it ticks.
    fn runs_on_at_the_source(&self) {
        assert!(alive(self.pid), "the job's root {} is gone", self.pid);
        self.wait_ticks(2);
        assert!(
            !gpucr_abi::procfs::is_stopped(self.pid),
            "the job's root is stopped"
        );
        for role in ROLES {
            assert_journal_continuous(&self.state, role);
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        kill_and_wait(self.pid);
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
    }
}

/// What every move needs: the CRIU lock, a temporary directory with the keys of both
/// sides (and an intruder's), the destination's image directory beneath it, and the two
/// hosts.
struct Scene {
    tmp: tempfile::TempDir,
    images: PathBuf,
    hosts: Hosts,
    // Last, so that it is let go once the hosts and the directory are gone.
    _lock: nix::fcntl::Flock<std::fs::File>,
}

impl Scene {
    fn new() -> Scene {
        let lock = criu_lock();
        let tmp = tempfile::tempdir().unwrap();
        keys(tmp.path());
        let images = tmp.path().join("images");
        std::fs::create_dir(&images).unwrap();
        Scene {
            tmp,
            images,
            hosts: Hosts::new(),
            _lock: lock,
        }
    }

    /// The directory with the keys, the destination's image directory, the hosts.
    fn parts(&self) -> (&Path, &Path, &Hosts) {
        (self.tmp.path(), &self.images, &self.hosts)
    }

    fn places(&self) -> Places<'_> {
        Places {
            hosts: &self.hosts,
            keys: self.tmp.path(),
            images: &self.images,
        }
    }
}

/// Key pairs for both sides, and one for an intruder.
fn keys(dir: &Path) {
    for name in ["source", "receiver", "intruder"] {
        let out = gpucr(&["keygen", name, "--dir", dir.to_str().unwrap()]);
        assert_success(&out);
    }
}

fn identity_args(dir: &Path, me: &str, peer: &str) -> Vec<String> {
    let file = |name: String| dir.join(name).to_str().unwrap().to_owned();
    vec![
        "--key".into(),
        file(format!("{me}.key")),
        "--cert".into(),
        file(format!("{me}.crt")),
        "--peer-cert".into(),
        file(format!("{peer}.crt")),
    ]
}

/// `gpucr receive --once` running in the destination's namespace, its stderr read as
/// it comes.
struct Receiver {
    child: Child,
    stderr: Lines,
}

/// `gpucr receive --once` in the destination's namespace, images beneath `images`;
/// returns once it listens.
fn start_receiver(hosts: &Hosts, keys: &Path, images: &Path, extra: &[&str]) -> Receiver {
    start_receiver_with(hosts, keys, images, extra, &[])
}

/// [`start_receiver`] with `env`.
fn start_receiver_with(
    hosts: &Hosts,
    keys: &Path,
    images: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Receiver {
    let mut child = hosts
        .command(Host::Destination, gpucr_bin())
        .args(["receive", "--once", "--link-timeout", "5", "--listen"])
        .arg(format!("0.0.0.0:{PORT}"))
        .arg("--dir")
        .arg(images)
        .args(identity_args(keys, "receiver", "source"))
        .args(extra)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run gpucr receive");
    let mut stderr = Lines::of(child.stderr.take().unwrap());
    stderr.wait_for_line(Duration::from_secs(30), "listening on");
    Receiver { child, stderr }
}

impl Receiver {
    /// Its exit status, stdout and whole stderr, once it has exited.
    fn finish(mut self) -> (std::process::ExitStatus, String, String) {
        let status = self.child.wait().unwrap();
        let mut out = String::new();
        std::io::Read::read_to_string(&mut self.child.stdout.take().unwrap(), &mut out).unwrap();
        (status, out, self.stderr.all())
    }
}

/// `gpucr migrate` of `job` in the source's namespace.
fn migrate(hosts: &Hosts, keys: &Path, job: &Job, me: &str, env: &[(&str, &str)]) -> Output {
    migrate_with(hosts, keys, job, me, env, &[])
}

/// [`migrate`] with more flags.
fn migrate_with(
    hosts: &Hosts,
    keys: &Path,
    job: &Job,
    me: &str,
    env: &[(&str, &str)],
    flags: &[&str],
) -> Output {
    migrate_command(hosts, keys, job, me, flags)
        .envs(env.iter().copied())
        .output()
        .expect("run gpucr migrate")
}

/// `gpucr migrate` of `job` with `env` and `flags` started, and its standard error read
/// as it comes (where its guard writes, should it be killed).
fn spawn_migrate(
    hosts: &Hosts,
    keys: &Path,
    job: &Job,
    env: &[(&str, &str)],
    flags: &[&str],
) -> (Child, Lines) {
    let mut migrating = migrate_command(hosts, keys, job, "source", flags)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run gpucr migrate");
    let said = Lines::of(migrating.stderr.take().unwrap());
    (migrating, said)
}

/// The command line of `gpucr migrate` of `job` with `flags`, as `me`, in the source's
/// namespace (nsenter runs gpucr in its own process).
fn migrate_command(hosts: &Hosts, keys: &Path, job: &Job, me: &str, flags: &[&str]) -> Command {
    let mut command = hosts.command(Host::Source, gpucr_bin());
    command
        .args(["migrate", "--tcp-established", "--link-timeout", "5"])
        .args(flags)
        .arg(job.pid.to_string())
        .arg(destination(hosts))
        .args(identity_args(keys, me, "receiver"))
        .stdin(Stdio::null());
    command
}

/// Both sides of a move succeeded (`out`, the source's output; `receiver`, which has
/// printed the restored tree's pid): that tree (killed when dropped) and the receiver's
/// stderr.
fn both_succeeded(out: &Output, receiver: Receiver) -> (Restored, String) {
    let (status, received, receiver_err) = receiver.finish();
    assert_success(out);
    assert!(status.success(), "receiver: {status:?}\n{receiver_err}");
    let remote: i32 = received
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("not a pid: {received:?}\n{receiver_err}"));
    (Restored(remote), receiver_err)
}

/// Wait until the first file of the image but the memory pages and the GPU data (which
/// cross while the job is still dumped) has arrived beneath `images`: the dump is over,
/// the job stopped, and its image crossing.
fn wait_for_the_image_to_cross(images: &Path) {
    wait_for(
        Duration::from_secs(60),
        "the image to start crossing",
        || {
            entries(images)
                .first()
                .filter(|dir| {
                    entries(&images.join(dir))
                        .iter()
                        .any(|name| !name.starts_with("pages-") && name != "gpu")
                })
                .map(|_| ())
        },
    );
}

/// Move `job` with `env` and `flags` to the destination `receiver` listens on, the
/// image's crossing slowed to 200 ms a chunk. Once the dump is over and the image
/// crosses, `wipe` takes the job's device memory away at the source, as if the
/// destination were another machine. Both sides must succeed and the source's copy
/// die: the restored tree (killed when dropped) and the receiver's stderr.
fn move_wiping_the_source(
    places: Places,
    job: &Job,
    receiver: Receiver,
    env: &[(&str, &str)],
    flags: &[&str],
    wipe: impl FnOnce(),
) -> Moved {
    let Places {
        hosts,
        keys,
        images,
    } = places;
    let mut env = env.to_vec();
    env.push(("GPUCR_TEST_MIGRATE_THROTTLE_MS", "200"));
    let out = std::thread::scope(|scope| {
        let migrating = scope.spawn(|| migrate_with(hosts, keys, job, "source", &env, flags));
        wait_for_the_image_to_cross(images);
        wipe();
        migrating.join().unwrap()
    });
    let (status, received, receiver_err) = receiver.finish();
    assert_success(&out);
    assert!(status.success(), "receiver: {status:?}\n{receiver_err}");
    // The pid alone, or `gpucr receive --json`'s report.
    let pid = match serde_json::from_str::<serde_json::Value>(&received) {
        Ok(report) if report.is_object() => report["pid"].as_i64().unwrap() as i32,
        _ => received.trim().parse().unwrap(),
    };
    wait_for(Duration::from_secs(10), "the source's copy to die", || {
        (!alive(job.pid)).then_some(())
    });
    Moved {
        _restored: Restored(pid),
        received,
        log: receiver_err,
        sent: stdout(&out),
    }
}

/// Where a move runs: the two hosts, the directory with the keys, the destination's
/// image directory.
#[derive(Clone, Copy)]
struct Places<'a> {
    hosts: &'a Hosts,
    keys: &'a Path,
    images: &'a Path,
}

/// A finished move: the tree restored on the destination (killed when dropped), and
/// what the receiver printed (its stdout and its stderr).
struct Moved {
    _restored: Restored,
    received: String,
    log: String,
    /// What `gpucr migrate` wrote on its stdout (its report with `--json`).
    sent: String,
}

/// The entries beneath `dir`.
fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn a_cpu_tree_moves_and_goes_on_at_the_destination() {
    let scene = Scene::new();
    let (dir, images, hosts) = scene.parts();
    let job = Job::start(hosts, &dir.join("state"), 64);
    let receiver = start_receiver(hosts, dir, images, &[]);
    let out = migrate_with(hosts, dir, &job, "source", &[], &["--lanes", "3"]);
    let (restored, _) = both_succeeded(&out, receiver);
    let remote = restored.0;
    assert!(stdout(&out).contains("over 3 lanes"), "{}", stdout(&out));
    wait_for(Duration::from_secs(10), "the source's copy to die", || {
        (!alive(job.pid)).then_some(())
    });
    // The job goes on where it was restored, its memory checked by the workload itself
    // at every tick ("mem=ok"), its journals unbroken.
    job.wait_ticks(3);
    for role in ROLES {
        assert_journal_continuous(&job.state, role);
    }
    // The destination keeps a complete image, 0700, that `inspect --verify` accepts.
    let kept = entries(images);
    assert_eq!(kept.len(), 1, "{kept:?}");
    let image = images.join(&kept[0]);
    let mode = std::fs::metadata(&image).unwrap().permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o700
    );
    assert_success(&gpucr(&["inspect", "--verify", image.to_str().unwrap()]));
    assert!(
        stdout(&out).contains(&format!("pid {remote} there")),
        "{}",
        stdout(&out)
    );
}

/// A tree with a task its owner stopped (job control's SIGSTOP), moved: at the
/// destination that task is still stopped and the others run, as on the source.
#[test]
fn a_task_its_owner_stopped_stays_stopped_at_the_destination() {
    let scene = Scene::new();
    let (dir, images, hosts) = scene.parts();
    let script = dir.join("two-sleeps.sh");
    gpucr_abi::testing::write_script(&script, "#!/bin/sh\nsleep 600 &\nsleep 600 &\nwait\n");
    let job = Job::start_program(hosts, &script, &dir.join("state"), &[], &[], vec![]);
    let tasks = || gpucr_abi::procfs::tree_pids(job.pid);
    wait_for(Duration::from_secs(30), "both sleeps to start", || {
        (tasks().len() == 3).then_some(())
    });
    let held = tasks()[1];
    kill(Pid::from_raw(held), Signal::SIGSTOP).unwrap();
    wait_for(Duration::from_secs(10), "the sleep to stop", || {
        gpucr_abi::procfs::is_stopped(held).then_some(())
    });
    let receiver = start_receiver(hosts, dir, images, &[]);
    let out = migrate(hosts, dir, &job, "source", &[]);
    let (restored, _) = both_succeeded(&out, receiver);
    let there = gpucr_abi::procfs::tree_pids(restored.0);
    assert_eq!(there.len(), 3, "restored tasks: {there:?}");
    // The receiver's SIGCONTs went before it exited; give them a moment to land.
    std::thread::sleep(Duration::from_millis(200));
    let held_there: Vec<i32> = there
        .iter()
        .copied()
        .filter(|p| gpucr_abi::procfs::is_stopped(*p))
        .collect();
    assert_eq!(
        held_there.len(),
        1,
        "stopped at the destination: {held_there:?} of {there:?}"
    );
    assert_ne!(held_there[0], restored.0, "the root was left stopped");
}

#[test]
fn a_wrong_key_is_refused_before_anything_else() {
    let scene = Scene::new();
    let (dir, images, hosts) = scene.parts();
    let job = Job::start(hosts, &dir.join("state"), 16);
    let receiver = start_receiver(hosts, dir, images, &[]);
    let out = migrate(hosts, dir, &job, "intruder", &[]);
    let (status, _, receiver_err) = receiver.finish();
    assert_eq!(
        status.code(),
        Some(i32::from(gpucr_core::exit_code::MIGRATION_FAILED)),
        "{receiver_err}"
    );
    assert!(
        receiver_err.contains("refused") && receiver_err.contains("handshake"),
        "{receiver_err}"
    );
    assert!(!receiver_err.contains("authenticated"), "{receiver_err}");
    assert_fails_with(&out, 12, "the job was not touched");
    assert!(entries(images).is_empty(), "{:?}", entries(images));
    job.runs_on_at_the_source();
}

#[test]
fn a_link_cut_while_the_image_crosses_lets_the_job_run_on_at_the_source() {
    let scene = Scene::new();
    let (dir, images, hosts) = scene.parts();
    let job = Job::start(hosts, &dir.join("state"), 64);
    let receiver = start_receiver(hosts, dir, images, &[]);
    // 100 ms after each 1 MiB chunk: the 64 MiB take seconds to cross.
    let migrating = std::thread::scope(|scope| {
        let migrating = scope.spawn(|| {
            migrate(
                hosts,
                dir,
                &job,
                "source",
                &[("GPUCR_TEST_MIGRATE_THROTTLE_MS", "100")],
            )
        });
        // The first file of the image has arrived: the job is frozen and crossing.
        wait_for_the_image_to_cross(images);
        hosts.cut(Host::Source);
        migrating.join().unwrap()
    });
    let (status, _, receiver_err) = receiver.finish();
    assert_fails_with(&migrating, 12, "the job runs on here");
    assert!(!status.success(), "{receiver_err}");
    assert!(entries(images).is_empty(), "kept: {:?}", entries(images));
    job.runs_on_at_the_source();
}

/// `gpucr migrate` killed outright (SIGKILL, so it cannot undo anything itself) while
/// the image crosses: its guard lets the job run on at the source, and the destination,
/// its link gone, keeps nothing.
#[test]
fn a_gpucr_migrate_killed_outright_before_the_commit_leaves_the_job_running_at_the_source() {
    let scene = Scene::new();
    let (dir, images, hosts) = scene.parts();
    let job = Job::start(hosts, &dir.join("state"), 64);
    let receiver = start_receiver(hosts, dir, images, &[]);
    let (mut migrating, mut said) = spawn_migrate(
        hosts,
        dir,
        &job,
        &[("GPUCR_TEST_MIGRATE_THROTTLE_MS", "100")],
        &[],
    );
    wait_for_the_image_to_cross(images);
    assert!(
        gpucr_abi::procfs::is_stopped(job.pid),
        "the job is not frozen"
    );
    kill(Pid::from_raw(migrating.id() as i32), Signal::SIGKILL).unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&migrating.wait().unwrap()),
        Some(libc::SIGKILL)
    );
    said.wait_for_line(Duration::from_secs(60), "the job runs on here");
    let (status, _, receiver_err) = receiver.finish();
    assert!(!status.success(), "{receiver_err}");
    assert!(entries(images).is_empty(), "kept: {:?}", entries(images));
    job.runs_on_at_the_source();
}

/// The processes of the sample workload in `host`'s network namespace, stopped: what a
/// receiver restored there and left stopped for the source's Commit.
fn stopped_workload_in(hosts: &Hosts, host: Host) -> Vec<i32> {
    use std::os::unix::fs::MetadataExt;
    let ns = std::fs::metadata(hosts.path(host)).unwrap().ino();
    let workload = workload_bin();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe == workload)
                && std::fs::metadata(format!("/proc/{pid}/ns/net")).is_ok_and(|m| m.ino() == ns)
                && gpucr_abi::procfs::is_stopped(*pid)
        })
        .collect()
}

/// `gpucr receive` killed outright once it has restored the tree, stopped, before the
/// source's Commit (`GPUCR_TEST_MIGRATE_HOLD_RESTORED_MS` holds it there): its guard
/// kills the stopped tree and removes the partial image, and the source, its link
/// gone, lets the job run on there.
#[test]
fn a_gpucr_receive_killed_outright_before_the_commit_leaves_nothing_at_the_destination() {
    let scene = Scene::new();
    let (dir, images, hosts) = scene.parts();
    let job = Job::start(hosts, &dir.join("state"), 16);
    let receiver = start_receiver_with(
        hosts,
        dir,
        images,
        &[],
        &[("GPUCR_TEST_MIGRATE_HOLD_RESTORED_MS", "3000")],
    );
    let out = std::thread::scope(|scope| {
        let migrating = scope.spawn(|| migrate(hosts, dir, &job, "source", &[]));
        let there = wait_for(Duration::from_secs(60), "the tree restored there", || {
            Some(stopped_workload_in(hosts, Host::Destination)).filter(|pids| !pids.is_empty())
        });
        kill(Pid::from_raw(receiver.child.id() as i32), Signal::SIGKILL).unwrap();
        let (status, _, receiver_err) = receiver.finish();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL)
        );
        assert!(
            receiver_err.contains("the tree was killed"),
            "{receiver_err}"
        );
        assert!(receiver_err.contains("removed it"), "{receiver_err}");
        for pid in there {
            wait_for(Duration::from_secs(10), "the restored tree to die", || {
                (!alive(pid)).then_some(())
            });
        }
        migrating.join().unwrap()
    });
    assert!(entries(images).is_empty(), "kept: {:?}", entries(images));
    assert_fails_with(&out, 12, "the job runs on here");
    job.runs_on_at_the_source();
}

#[test]
fn a_full_destination_disk_lets_the_job_run_on_at_the_source() {
    let scene = Scene::new();
    let (dir, images, hosts) = scene.parts();
    let _tmpfs = mount_tmpfs(images, 8 << 20);
    let job = Job::start(hosts, &dir.join("state"), 64);
    let receiver = start_receiver(hosts, dir, images, &[]);
    let out = migrate(hosts, dir, &job, "source", &[]);
    let (status, _, receiver_err) = receiver.finish();
    assert_eq!(
        status.code(),
        Some(i32::from(gpucr_core::exit_code::IMAGE_DIR)),
        "{receiver_err}"
    );
    assert!(receiver_err.contains("No space left"), "{receiver_err}");
    assert_fails_with(&out, 12, "the job runs on here");
    assert!(stderr(&out).contains("No space left"), "{}", stderr(&out));
    assert!(entries(images).is_empty(), "kept: {:?}", entries(images));
    job.runs_on_at_the_source();
}

#[test]
fn a_topology_mismatch_stops_the_source_with_exit_9_and_the_job_untouched() {
    let scene = Scene::new();
    let (dir, images, hosts) = scene.parts();
    // A simulated GPU job with 3 GPUs; the destination has none.
    let sim = SimRoot::new("migrate-topology");
    let tree = SimTree::start(
        &dir.join("state"),
        &sim.0,
        &["--gpus", "3", "--parent-mib", "8", "--child-mib", "4"],
    );
    let no_gpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/topology/cpu-only");
    let receiver = start_receiver(
        hosts,
        dir,
        images,
        &["--sysfs-root", no_gpus.to_str().unwrap()],
    );
    let out = hosts
        .command(Host::Source, gpucr_bin())
        .args(["migrate", "--link-timeout", "5"])
        .arg(tree.pid.to_string())
        .arg(destination(hosts))
        .args(identity_args(dir, "source", "receiver"))
        .envs(sim.env())
        .stdin(Stdio::null())
        .output()
        .expect("run gpucr migrate");
    let (status, _, receiver_err) = receiver.finish();
    assert_fails_with(&out, 9, "cannot hold the job's GPUs");
    assert!(
        stderr(&out).contains("the job was not touched"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        status.code(),
        Some(i32::from(gpucr_core::exit_code::TOPOLOGY_INCOMPATIBLE)),
        "{receiver_err}"
    );
    assert!(entries(images).is_empty(), "kept: {:?}", entries(images));
    // Never stopped, never dumped: it ticks on, its device memory its own.
    assert!(!gpucr_abi::procfs::is_stopped(tree.pid));
    tree.wait_ticks(2);
    assert!(tree.verify(1), "the job's device memory changed");
}

/// The source offers the destination only the GPUs the job uses (the simulator's: those
/// of the buffers in the contexts it maps), so a destination with fewer GPUs than the
/// source, enough for the job, takes it.
#[test]
fn a_destination_with_fewer_gpus_than_the_source_but_enough_for_the_job_takes_it() {
    let scene = Scene::new();
    let (dir, images, hosts) = scene.parts();
    // The source has two GPUs; the job uses the first.
    let sim = SimRoot::new("migrate-fewer-gpus");
    let args = [
        "--gpus",
        "2",
        "--use-gpus",
        "1",
        "--parent-mib",
        "8",
        "--child-mib",
        "4",
    ];
    let job = Job::start_gpu(hosts, &dir.join("state"), &sim, &args);
    // The destination has that one only.
    let one_gpu = dir.join("one-gpu");
    gpucr_core::gpu::sim::SimRoot::new(&one_gpu)
        .ensure_topology(1)
        .unwrap();
    let receiver = start_receiver_with(
        hosts,
        dir,
        images,
        &["--sysfs-root", one_gpu.to_str().unwrap()],
        &sim.env(),
    );
    let moved = move_wiping_the_source(scene.places(), &job, receiver, &sim.env(), &[], || {
        std::fs::remove_dir_all(sim.0.join("contexts")).unwrap()
    });
    assert!(
        job.verify_gpu_memory(1),
        "device memory differs after the move: {}",
        moved.log
    );
    job.wait_ticks(2);
}

#[test]
fn a_simulated_gpu_tree_moves_with_its_device_memory() {
    gpu_tree_moves_with_its_device_memory("migrate-gpu", &[]);
}

/// The NVIDIA driver model locks a process through a thread of its own, which cannot
/// run while the process is stopped: the source is frozen by CRIU's dump, and stopped
/// only once the plugin gave its devices back.
#[test]
fn a_simulated_nvidia_model_tree_moves_with_its_device_memory() {
    gpu_tree_moves_with_its_device_memory("migrate-nv", &["--driver", "nvidia"]);
}

/// The cuda backend against the fake CUDA driver: each process locked and checkpointed
/// by the driver through its restore thread, which the plugin lets run, the tree stopped
/// only once the devices are given back; restored at the destination with its device
/// memory, which was wiped at the source meanwhile.
#[test]
fn a_cuda_tree_moves_with_its_device_memory() {
    cuda_tree_moves_with_its_device_memory(false);
}

#[test]
fn post_copy_moves_a_cuda_tree_its_memory_served_from_the_stopped_job() {
    cuda_tree_moves_with_its_device_memory(true);
}

/// A CUDA job of two processes (the fake driver's) moves with its device memory, by
/// stop-and-copy or by post-copy.
fn cuda_tree_moves_with_its_device_memory(post_copy: bool) {
    let scene = Scene::new();
    let (dir, images, hosts) = scene.parts();
    let fake = common::fake_cuda::FakeCuda::new();
    let job = Job::start_device_workload(
        hosts,
        "cuda_workload",
        &dir.join("state"),
        &["--procs", "2", "--mib", "24"],
        &fake.env(),
    );
    assert!(job.verify_gpu_memory(1));
    let sim_root = dir.join("sim");
    std::fs::create_dir(&sim_root).unwrap();
    let mut env = fake.env();
    env.push(("GPUCR_SIM_ROOT", sim_root.to_str().unwrap()));
    let receiver = start_receiver_with(hosts, dir, images, &[], &env);
    // Stop-and-copy: the source's copy is stopped with its devices given back, and its
    // device memory goes. Post-copy: the copy keeps its devices as the dump left them,
    // its device memory staged in its own, which is served from it.
    let flags: &[&str] = match post_copy {
        true => &["--post-copy", "--json"],
        false => &[],
    };
    let moved = move_wiping_the_source(scene.places(), &job, receiver, &env, flags, || {
        if !post_copy {
            assert!(fake.wipe_device_memory() > 0, "no device memory to wipe");
        }
    });
    assert!(
        job.verify_gpu_memory(2),
        "device memory differs after the move"
    );
    job.wait_ticks(2);
    if post_copy {
        // 2 x 24 MiB of device memory staged in the processes' memory, served from the
        // stopped job and never on the source's disk.
        let report: serde_json::Value = serde_json::from_str(&moved.sent).unwrap();
        let (in_tree, staged) = (
            report["pages_in_tree_bytes"].as_u64().unwrap(),
            report["pages_staged_bytes"].as_u64().unwrap(),
        );
        assert!(in_tree >= 40 << 20 && staged <= 10 << 20, "{report}");
    }
    let image = kept_image(images);
    let manifest = manifest_json(&image);
    assert_eq!(manifest["gpu"]["backend"], "cuda", "{}", manifest["gpu"]);
    assert_eq!(manifest["gpu"]["tasks"].as_array().unwrap().len(), 2);
    assert_success(&gpucr(&["inspect", "--verify", image.to_str().unwrap()]));
}

fn gpu_tree_moves_with_its_device_memory(name: &str, driver: &[&str]) {
    let scene = Scene::new();
    let (dir, images, hosts) = scene.parts();
    let sim = SimRoot::new(name);
    let mut args = vec!["--parent-mib", "24", "--child-mib", "8"];
    args.extend_from_slice(driver);
    let job = Job::start_gpu(hosts, &dir.join("state"), &sim, &args);
    let receiver = start_receiver_with(hosts, dir, images, &["--json"], &sim.env());
    // The restored tree can only get its device memory from the image.
    let moved = move_wiping_the_source(
        scene.places(),
        &job,
        receiver,
        &sim.env(),
        // The KFD model crosses uncompressed, on two lanes.
        if driver.is_empty() {
            &["--compress", "none", "--lanes", "2"]
        } else {
            &[]
        },
        || {
            assert!(!sim_contexts(&sim.0).is_empty(), "no device memory to wipe");
            std::fs::remove_dir_all(sim.0.join("contexts")).unwrap();
        },
    );
    // The restored processes find every byte of their device buffers, and go on.
    assert!(
        job.verify_gpu_memory(1),
        "device memory differs after the move"
    );
    job.wait_ticks(2);
    // It crossed through the image's gpu/ files, which the destination keeps.
    let kept = entries(images);
    assert_eq!(kept.len(), 1, "{kept:?}");
    let image = images.join(&kept[0]);
    let manifest = manifest_json(&image);
    if driver.is_empty() {
        // The KFD model: device memory in the image's buffers.
        let buffers = manifest["gpu"]["stats"]["buffers"].as_u64().unwrap();
        assert!(buffers >= 2, "{}", manifest["gpu"]);
        let raw = manifest["gpu"]["stats"]["raw_bytes"].as_u64().unwrap();
        assert!(raw >= 32 << 20, "{}", manifest["gpu"]);
        let compressed = manifest["gpu"]["stats"]["compressed_chunks"].as_u64();
        assert_eq!(compressed, Some(0), "{}", manifest["gpu"]);
        assert!(image.join("gpu/index").exists());
        // The receiver's report has the restore's GPU transfer, as `gpucr restore`'s.
        let report: serde_json::Value = serde_json::from_str(&moved.received).unwrap();
        let filled = &report["gpu"];
        for field in ["buffers", "raw_bytes"] {
            assert_eq!(
                filled["stats"][field], manifest["gpu"]["stats"][field],
                "{report}"
            );
        }
        let timings = filled["timings"].as_array().expect("the fill of each task");
        assert_eq!(timings.len(), 2, "{report}");
        assert!(
            timings.iter().all(|t| t["bytes"].as_u64() > Some(0)),
            "{report}"
        );
    } else {
        // The NVIDIA model: each task's device state, its memory staged in the host's.
        let tasks = manifest["gpu"]["tasks"].as_array().unwrap();
        assert_eq!(tasks.len(), 2, "{}", manifest["gpu"]);
        for task in tasks {
            let state = task["state"]["file"].as_str().unwrap();
            assert!(image.join(state).exists(), "{state}");
        }
    }
    assert_success(&gpucr(&["inspect", "--verify", image.to_str().unwrap()]));
}

#[test]
fn a_failed_restore_at_the_destination_lets_the_job_run_on_at_the_source() {
    let scene = Scene::new();
    let (dir, images, hosts) = scene.parts();
    let job = Job::start(hosts, &dir.join("state"), 16);
    // The destination's CRIU fails at once (a program that only exits 1): the whole
    // image crossed by then.
    let broken = dir.join("broken-criu");
    gpucr_abi::testing::write_script(&broken, "#!/bin/sh\nexit 1\n");
    let receiver = start_receiver(hosts, dir, images, &["--criu", broken.to_str().unwrap()]);
    let out = migrate(hosts, dir, &job, "source", &[]);
    let (status, _, receiver_err) = receiver.finish();
    assert!(!status.success(), "{receiver_err}");
    assert!(
        receiver_err.contains("restoring the received image"),
        "{receiver_err}"
    );
    assert_fails_with(&out, 12, "the job runs on here");
    assert!(entries(images).is_empty(), "kept: {:?}", entries(images));
    job.runs_on_at_the_source();
}

#[test]
fn a_signal_ends_the_wait_for_a_migration() {
    let tmp = tempfile::tempdir().unwrap();
    keys(tmp.path());
    let mut args = vec![
        "receive".to_owned(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--dir".into(),
        tmp.path().to_str().unwrap().to_owned(),
    ];
    args.extend(identity_args(tmp.path(), "receiver", "source"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut child = spawn_gpucr(&args, &[]);
    let mut lines = Lines::of(child.stderr.take().unwrap());
    lines.wait_for_line(Duration::from_secs(30), "listening on");
    signal_child(&child, nix::sys::signal::Signal::SIGINT);
    let status = child.wait().unwrap();
    let err = lines.all();
    assert_eq!(
        status.code(),
        Some(i32::from(gpucr_core::exit_code::INTERRUPTED)),
        "{err}"
    );
    assert!(err.contains("interrupted by SIGINT"), "{err}");
}

#[test]
fn a_link_lost_after_the_commit_keeps_the_source_copy_stopped() {
    let scene = Scene::new();
    let (dir, images, hosts) = scene.parts();
    let job = Job::start(hosts, &dir.join("state"), 16);
    // The receiver lets the job run on the Commit, then the link goes before Resumed.
    let receiver = start_receiver_with(
        hosts,
        dir,
        images,
        &[],
        &[("GPUCR_TEST_MIGRATE_NO_RESUMED", "1")],
    );
    let out = migrate(hosts, dir, &job, "source", &[]);
    let (status, received, receiver_err) = receiver.finish();
    assert!(status.success(), "{receiver_err}");
    let _restored = Restored(received.trim().parse().unwrap());
    assert_fails_with(&out, 13, &format!("pid {} is kept stopped here", job.pid));
    // Never two copies running: the source's stays stopped, the destination's goes on.
    assert!(alive(job.pid));
    assert!(gpucr_abi::procfs::is_stopped(job.pid));
    job.wait_ticks(3);
    assert!(gpucr_abi::procfs::is_stopped(job.pid));
    for role in ROLES {
        assert_journal_continuous(&job.state, role);
    }
}

/// The image directory a receiver kept beneath `images` (exactly one), checked: 0700,
/// and whole as `gpucr inspect --verify` sees it.
fn kept_image(images: &Path) -> PathBuf {
    let kept = entries(images);
    assert_eq!(kept.len(), 1, "{kept:?}");
    let image = images.join(&kept[0]);
    let mode = std::fs::metadata(&image).unwrap().permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o700
    );
    assert_success(&gpucr(&["inspect", "--verify", image.to_str().unwrap()]));
    image
}

/// The pid a receiver's note names as running its tree before its memory is in.
fn pulled_pid(line: &str) -> i32 {
    line.split_whitespace()
        .skip_while(|w| *w != "pid")
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {line:?}"))
}

/// Move `job` with `--post-copy --json` to a receiver keeping its image beneath
/// `images`: the restored job, the receiver's stderr and the source's report.
fn move_post_copy(
    hosts: &Hosts,
    keys: &Path,
    images: &Path,
    job: &Job,
) -> (Restored, String, serde_json::Value) {
    let receiver = start_receiver(hosts, keys, images, &[]);
    let out = migrate_with(hosts, keys, job, "source", &[], &["--post-copy", "--json"]);
    let (restored, receiver_err) = both_succeeded(&out, receiver);
    let report = serde_json::from_str(&stdout(&out)).unwrap();
    (restored, receiver_err, report)
}

#[test]
fn post_copy_runs_the_job_at_the_destination_before_its_memory_is_there() {
    let scene = Scene::new();
    let (dir, images, hosts) = scene.parts();
    let job = Job::start(hosts, &dir.join("state"), 64);
    let (restored, receiver_err, report) = move_post_copy(hosts, dir, images, &job);
    let remote = restored.0;
    // It ran there before its memory was in: the pages files crossed after the resume.
    let note = receiver_err
        .lines()
        .find(|l| l.contains("its memory is pulled from"))
        .unwrap_or_else(|| panic!("{receiver_err}"));
    assert_eq!(pulled_pid(note), remote);
    assert_eq!(report["post_copy"], true);
    // The job's 64 MiB were served from its stopped copy, and never were on the
    // source's disk: it held no more than the files' last partial blocks (4 MiB at
    // most, of the job's one pages file) and the odd page the tree could not give.
    let in_tree = report["pages_in_tree_bytes"].as_u64().unwrap();
    assert!(in_tree >= 60 << 20, "{report}");
    let staged = report["pages_staged_bytes"].as_u64().unwrap();
    assert!(staged <= 5 << 20, "{report}");
    let downtime = report["downtime_ms"].as_f64().unwrap();
    assert!(
        downtime <= report["frozen_ms"].as_f64().unwrap(),
        "{report}"
    );
    // The record of the move: the source's steps, its dump's among them, in order.
    let events: Vec<(&str, f64)> = report["events"]
        .as_array()
        .unwrap_or_else(|| panic!("no events: {report}"))
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["at_ms"].as_f64().unwrap()))
        .collect();
    let at = |name: &str| {
        events
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("no {name} event: {report}"))
            .1
    };
    assert!(at("authenticated") <= at("freeze"), "{report}");
    assert!(at("freeze") <= at("criu-done"), "{report}");
    assert!(events.windows(2).all(|w| w[0].1 <= w[1].1), "{report}");
    wait_for(Duration::from_secs(10), "the source's copy to die", || {
        (!alive(job.pid)).then_some(())
    });
    // Every page it had, checked by the workload at every tick ("mem=ok").
    job.wait_ticks(3);
    for role in ROLES {
        assert_journal_continuous(&job.state, role);
    }
    // Every block pulled, the image whole.
    let image = kept_image(images);
    assert!(std::fs::read_dir(&image).unwrap().any(|e| e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .starts_with("pages-")));
}

/// A Debian program without sockets (so that every CRIU gpucr drives can dump it,
/// 4.1 too): Python holding 48 MiB of random bytes, which it checks against their
/// digest every tick, and a journal of its ticks.
const PYTHON_HOLDER: &str = r#"#!/usr/bin/python3
import hashlib, os, sys, time
state = sys.argv[sys.argv.index("--state") + 1]
memory = bytearray(os.urandom(48 << 20))
want = hashlib.sha256(memory).digest()
journal = open(os.path.join(state, "journal-parent"), "a", buffering=1)
open(os.path.join(state, "ready"), "w").close()
tick = 0
while True:
    tick += 1
    ok = hashlib.sha256(memory).digest() == want
    journal.write("tick=%d mem=%s\n" % (tick, "ok" if ok else "BAD"))
    if not ok:
        sys.exit(3)
    time.sleep(0.1)
"#;

#[test]
fn post_copy_moves_a_python_program_whose_memory_never_touches_the_source_disk() {
    let scene = Scene::new();
    let (dir, images, hosts) = scene.parts();
    let holder = dir.join("holder.py");
    gpucr_abi::testing::write_script(&holder, PYTHON_HOLDER);
    let state = dir.join("state");
    let job = Job::start_program(hosts, &holder, &state, &[], &[], vec!["parent"]);
    wait_for(Duration::from_secs(30), "python to be ready", || {
        state.join("ready").exists().then_some(())
    });
    job.wait_ticks(2);
    let (_restored, _, report) = move_post_copy(hosts, dir, images, &job);
    // The pages came from the stopped program, through gpucr's page server: the
    // source's disk held at most a file's last partial block of them.
    assert!(
        report["pages_in_tree_bytes"].as_u64().unwrap() >= 40 << 20,
        "{report}"
    );
    assert!(
        report["pages_staged_bytes"].as_u64().unwrap() <= 5 << 20,
        "{report}"
    );
    wait_for(Duration::from_secs(10), "the source's copy to die", || {
        (!alive(job.pid)).then_some(())
    });
    // It goes on there, every byte of its memory as it was.
    job.wait_ticks(3);
    let lines = read_journal(&state, "parent");
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line.num("tick"), i as u64 + 1, "{line:?}");
        assert_eq!(
            line.0.get("mem").map(String::as_str),
            Some("ok"),
            "{line:?}"
        );
    }
    kept_image(images);
}

#[test]
fn a_link_cut_during_post_copy_kills_the_destination_tree_and_the_source_says_so() {
    let scene = Scene::new();
    let (dir, images, hosts) = scene.parts();
    let job = Job::start(hosts, &dir.join("state"), 64);
    // A second before each block is placed there: 64 MiB take the destination well
    // over ten seconds to pull.
    let mut receiver = start_receiver_with(
        hosts,
        dir,
        images,
        &[],
        &[("GPUCR_TEST_LAZY_THROTTLE_MS", "1000")],
    );
    let (out, there) = std::thread::scope(|scope| {
        let migrating =
            scope.spawn(|| migrate_with(hosts, dir, &job, "source", &[], &["--post-copy"]));
        let note = receiver
            .stderr
            .wait_for_line(Duration::from_secs(60), "its memory is pulled from");
        let there = pulled_pid(&note);
        assert!(alive(there), "{note}");
        hosts.cut(Host::Source);
        (migrating.join().unwrap(), there)
    });
    let (status, _, receiver_err) = receiver.finish();
    // The destination's tree could not get its memory: killed, nothing kept.
    assert_eq!(
        status.code(),
        Some(i32::from(gpucr_core::exit_code::MIGRATION_FAILED)),
        "{receiver_err}"
    );
    assert!(
        receiver_err.contains("post-copy failed after the job ran here"),
        "{receiver_err}"
    );
    wait_for(
        Duration::from_secs(10),
        "the destination's tree to die",
        || (!alive(there)).then_some(()),
    );
    assert!(entries(images).is_empty(), "kept: {:?}", entries(images));
    // The source says so, and never lets its copy run on its own.
    assert_fails_with(&out, 13, "post-copy");
    assert!(alive(job.pid) && gpucr_abi::procfs::is_stopped(job.pid));
}

/// `gpucr migrate --post-copy` killed outright once the destination runs the job: the
/// destination, its memory no longer coming, kills its tree, and the source's guard
/// keeps the source's copy stopped (the job may have run on there), and says so.
#[test]
fn a_gpucr_migrate_killed_outright_after_the_commit_keeps_the_source_copy_stopped() {
    let scene = Scene::new();
    let (dir, images, hosts) = scene.parts();
    let job = Job::start(hosts, &dir.join("state"), 64);
    let mut receiver = start_receiver_with(
        hosts,
        dir,
        images,
        &[],
        &[("GPUCR_TEST_LAZY_THROTTLE_MS", "1000")],
    );
    let (mut migrating, mut said) = spawn_migrate(hosts, dir, &job, &[], &["--post-copy"]);
    let note = receiver
        .stderr
        .wait_for_line(Duration::from_secs(60), "its memory is pulled from");
    let there = pulled_pid(&note);
    kill(Pid::from_raw(migrating.id() as i32), Signal::SIGKILL).unwrap();
    migrating.wait().unwrap();
    let kept = said.wait_for_line(Duration::from_secs(60), "its copy here is kept stopped");
    assert!(kept.contains(&job.pid.to_string()), "{kept}");
    let (status, _, receiver_err) = receiver.finish();
    assert!(!status.success(), "{receiver_err}");
    wait_for(
        Duration::from_secs(10),
        "the destination's tree to die",
        || (!alive(there)).then_some(()),
    );
    assert!(alive(job.pid) && gpucr_abi::procfs::is_stopped(job.pid));
}

#[test]
fn post_copy_moves_a_simulated_gpu_tree_with_its_device_memory() {
    post_copy_moves_a_gpu_tree("migrate-gpu-post-copy", &[]);
}

#[test]
fn post_copy_moves_a_simulated_nvidia_model_tree_with_its_device_memory() {
    post_copy_moves_a_gpu_tree("migrate-nv-post-copy", &["--driver", "nvidia"]);
}

fn post_copy_moves_a_gpu_tree(name: &str, driver: &[&str]) {
    let scene = Scene::new();
    let (dir, images, hosts) = scene.parts();
    let sim = SimRoot::new(name);
    let mut args = vec!["--parent-mib", "24", "--child-mib", "8", "--cpu-mib", "32"];
    args.extend_from_slice(driver);
    let job = Job::start_gpu(hosts, &dir.join("state"), &sim, &args);
    let receiver = start_receiver_with(hosts, dir, images, &[], &sim.env());
    let flags = ["--post-copy", "--json"];
    let moved = move_wiping_the_source(scene.places(), &job, receiver, &sim.env(), &flags, || {
        std::fs::remove_dir_all(sim.0.join("contexts")).unwrap();
    });
    assert!(
        moved.log.contains("its memory is pulled from"),
        "{}",
        moved.log
    );
    assert!(
        job.verify_gpu_memory(1),
        "device memory differs after the move"
    );
    // The tree's CPU memory, 2 x 32 MiB, is served from the stopped tree, never on the
    // source's disk: the KFD model's give-back leaves it as CRIU dumped it, and the
    // NVIDIA model's, which would write the device memory back into it, waits until
    // the move is decided (never, as the move succeeds), so its 32 MiB of device
    // memory staged in the process's memory is served from the tree too.
    let report: serde_json::Value = serde_json::from_str(&moved.sent).unwrap();
    let (in_tree, staged) = (
        report["pages_in_tree_bytes"].as_u64().unwrap(),
        report["pages_staged_bytes"].as_u64().unwrap(),
    );
    assert!(in_tree >= 56 << 20 && staged <= 10 << 20, "{report}");
    job.wait_ticks(2);
    let image = kept_image(images);
    assert!(image.join("gpu/index").exists());
}

#[test]
fn a_post_copy_the_destination_cannot_restore_gives_the_job_its_devices_back_at_the_source() {
    let scene = Scene::new();
    let (dir, images, hosts) = scene.parts();
    let (sim, job, receiver) =
        nvidia_job_and_receiver(&scene, "migrate-nv-post-copy-refused", "exit 1");
    let out = migrate_with(hosts, dir, &job, "source", &sim.env(), &["--post-copy"]);
    let (status, _, receiver_err) = receiver.finish();
    assert!(!status.success(), "{receiver_err}");
    assert_fails_with(&out, 12, "the job runs on here");
    assert!(!stderr(&out).contains("device back"), "{}", stderr(&out));
    assert!(entries(images).is_empty(), "kept: {:?}", entries(images));
    runs_on_with_its_devices(&job);
}

/// A post-copy of the simulator's NVIDIA model, its devices left as the dump made them
/// (the give-back deferred), with `gpucr migrate` killed outright while the destination
/// restores: the migrate guard lets the job run on at the source, and the dump's
/// give-back guard gives it its devices back; its kernels go on, its memory whole.
#[test]
fn a_post_copy_gpucr_killed_outright_before_the_commit_gives_the_job_its_devices_back() {
    let scene = Scene::new();
    let (dir, images, hosts) = scene.parts();
    // The destination's restore takes long enough to kill the source meanwhile.
    let (sim, job, receiver) =
        nvidia_job_and_receiver(&scene, "migrate-nv-post-copy-killed", "sleep 10\nexit 1");
    let (mut migrating, mut said) = spawn_migrate(hosts, dir, &job, &sim.env(), &["--post-copy"]);
    // The manifest crosses last: then the destination restores.
    wait_for(Duration::from_secs(60), "the manifest to cross", || {
        entries(images)
            .first()
            .filter(|d| images.join(d).join("gpucr.json").exists())
            .map(|_| ())
    });
    kill(Pid::from_raw(migrating.id() as i32), Signal::SIGKILL).unwrap();
    migrating.wait().unwrap();
    said.wait_for_line(Duration::from_secs(60), "the job runs on here");
    let (status, _, receiver_err) = receiver.finish();
    assert!(!status.success(), "{receiver_err}");
    assert!(entries(images).is_empty(), "kept: {:?}", entries(images));
    runs_on_with_its_devices(&job);
}

/// The simulator's NVIDIA model (its devices stay locked, its kernels parked, until
/// the give-back a post-copy dump defers), started at the source of `scene`, and a
/// receiver whose CRIU is a shell script running `criu_script`.
fn nvidia_job_and_receiver(
    scene: &Scene,
    name: &str,
    criu_script: &str,
) -> (SimRoot, Job, Receiver) {
    let (dir, images, hosts) = scene.parts();
    let sim = SimRoot::new(name);
    let args = [
        "--parent-mib",
        "8",
        "--child-mib",
        "4",
        "--cpu-mib",
        "24",
        "--driver",
        "nvidia",
    ];
    let job = Job::start_gpu(hosts, &dir.join("state"), &sim, &args);
    let criu = dir.join("stand-in-criu");
    gpucr_abi::testing::write_script(&criu, &format!("#!/bin/sh\n{criu_script}\n"));
    let receiver = start_receiver_with(
        hosts,
        dir,
        images,
        &["--criu", criu.to_str().unwrap()],
        &sim.env(),
    );
    (sim, job, receiver)
}

/// The job runs on at the source with its devices given back: its kernels run again
/// (they park while the devices are locked), and its device memory is whole.
fn runs_on_with_its_devices(job: &Job) {
    assert!(alive(job.pid), "the job's root {} is gone", job.pid);
    job.wait_ticks(2);
    assert!(
        !gpucr_abi::procfs::is_stopped(job.pid),
        "the job is stopped"
    );
    assert!(
        job.verify_gpu_memory(1),
        "device memory differs after the give-back"
    );
}

/// `gpucr receive --once` on the loopback, its images beneath `dir`, with `args`.
fn receive_once_on_loopback(dir: &Path, args: &[&str]) -> Output {
    let mut all = vec!["receive", "--once", "--listen", "127.0.0.1:0", "--dir"];
    all.push(dir.to_str().unwrap());
    all.extend_from_slice(args);
    gpucr(&all)
}

#[test]
fn a_receiver_without_criu_says_so_before_it_listens() {
    let tmp = tempfile::tempdir().unwrap();
    keys(tmp.path());
    let missing = tmp.path().join("no-criu-here");
    let out = receive_once_on_loopback(
        tmp.path(),
        &[
            "--criu",
            missing.to_str().unwrap(),
            "--key",
            tmp.path().join("receiver.key").to_str().unwrap(),
            "--cert",
            tmp.path().join("receiver.crt").to_str().unwrap(),
            "--peer-cert",
            tmp.path().join("source.crt").to_str().unwrap(),
        ],
    );
    assert_fails_with(
        &out,
        gpucr_core::exit_code::CRIU_UNAVAILABLE.into(),
        "no-criu-here",
    );
    assert!(!stderr(&out).contains("listening on"), "{}", stderr(&out));
}

#[test]
fn a_certificate_of_another_key_is_refused_before_either_side_starts() {
    let tmp = tempfile::tempdir().unwrap();
    keys(tmp.path());
    let file = |name: &str| tmp.path().join(name).to_str().unwrap().to_owned();
    // The receiver given the source's certificate beside its own key.
    let out = receive_once_on_loopback(
        tmp.path(),
        &[
            "--key",
            &file("receiver.key"),
            "--cert",
            &file("source.crt"),
            "--peer-cert",
            &file("source.crt"),
        ],
    );
    assert_fails_with(
        &out,
        gpucr_core::exit_code::USAGE.into(),
        "receiver.key does not belong to",
    );
    assert!(stderr(&out).contains("source.crt"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("listening on"), "{}", stderr(&out));
    // The source the same way round, before it connects or touches the job.
    let out = gpucr(&[
        "migrate",
        "1",
        "127.0.0.1:9",
        "--key",
        &file("source.key"),
        "--cert",
        &file("receiver.crt"),
        "--peer-cert",
        &file("receiver.crt"),
    ]);
    assert_fails_with(
        &out,
        gpucr_core::exit_code::USAGE.into(),
        "source.key does not belong to",
    );
    assert!(!stderr(&out).contains("connect"), "{}", stderr(&out));
}
