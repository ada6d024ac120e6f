//! End-to-end tests with real programs from Debian's packages, each tree in its own PID
//! namespace (and network namespace where it talks TCP), dumped with `gpucr dump` while
//! it is in the middle of its work, restored with `gpucr restore`, and its results
//! compared afterwards: PostgreSQL with a client inside an open transaction, a Python
//! `multiprocessing` pool with shared memory, and nginx holding a keep-alive connection.
//!
//! A missing program fails its test with the Debian package to install
//! (`scripts/setup.sh` installs them). docs/real-programs.md says what each test shows
//! and what this machine's CRIU cannot do.

mod common;

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

const PYTHON: &str = "/usr/bin/python3";
const NGINX: &str = "/usr/sbin/nginx";
const POSTGRES_BIN: &str = "/usr/lib/postgresql/15/bin";

/// `path`, which Debian's `package` installs; fails the test naming the package when it
/// is missing.
fn program(path: &str, package: &str) -> PathBuf {
    let p = PathBuf::from(path);
    assert!(
        p.exists(),
        "{path} is missing: install Debian's {package} \
         (`apt-get install --no-install-recommends {package}`, as scripts/setup.sh does)"
    );
    p
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/real-programs")
        .join(name)
}

/// Whether this process has CAP_SYS_RESOURCE. CRIU reads each task's resource limits
/// with prlimit(2) from outside it, which the kernel refuses for a task of another user
/// unless the caller has that capability: without it CRIU cannot dump a tree with a
/// process of another user ("Can't get rlimit 0: Operation not permitted").
fn has_cap_sys_resource() -> bool {
    let status = fs::read_to_string("/proc/self/status").unwrap();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .expect("CapEff in /proc/self/status");
    let bits = u64::from_str_radix(eff.trim(), 16).unwrap();
    // CAP_SYS_RESOURCE is capability 24 (linux/capability.h).
    bits & (1 << 24) != 0
}

/// A test's directory: a temporary directory that other users may enter (the programs'
/// own users read their files there).
fn test_dir() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    tmp
}

/// A tree of real programs: `sh -c SCRIPT sh ARGS...` as the init of a new PID
/// namespace (`unshare --pid --fork setsid`, and the other namespaces of `namespaces`),
/// inheriting no descriptor but its standard ones, all three /dev/null.
struct ProgramTree {
    unshare: Child,
    /// The root's pid in the test's PID namespace.
    pid: i32,
}

impl ProgramTree {
    fn start(namespaces: &[&str], script: &str, args: &[&str]) -> ProgramTree {
        ProgramTree::start_from(Command::new("unshare"), namespaces, script, args)
    }

    /// [`ProgramTree::start`] with `unshare` run by `cmd` (`nsenter --net=... unshare`:
    /// in another host's network namespace).
    fn start_from(
        mut cmd: Command,
        namespaces: &[&str],
        script: &str,
        args: &[&str],
    ) -> ProgramTree {
        cmd.args(namespaces)
            .args(["--pid", "--fork", "setsid", "sh", "-c", script, "sh"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        inherit_no_fds(&mut cmd);
        let unshare = cmd.spawn().expect("spawn unshare");
        let pid = first_child(unshare.id(), "the tree's root process");
        ProgramTree { unshare, pid }
    }

    /// `gpucr dump [EXTRA] PID IMAGE`, which must succeed and kill the tree.
    fn dump(&self, image: &Path, extra: &[&str]) -> Duration {
        let started = Instant::now();
        let pid = self.pid.to_string();
        let mut args = vec!["dump"];
        args.extend(extra);
        args.extend([pid.as_str(), image.to_str().unwrap()]);
        let out = gpucr(&args);
        let took = started.elapsed();
        assert_success(&out);
        wait_for(
            Duration::from_secs(10),
            "the dumped tree to be killed",
            || (!alive(self.pid)).then_some(()),
        );
        took
    }
}

impl Drop for ProgramTree {
    fn drop(&mut self) {
        kill_and_wait(self.pid);
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
    }
}

/// `gpucr restore --detach IMAGE`, which must succeed; the restored tree (killed when
/// dropped) and how long the restore took.
fn restore(image: &Path) -> (Restored, Duration) {
    let started = Instant::now();
    let out = gpucr(&["restore", "--detach", image.to_str().unwrap()]);
    let took = started.elapsed();
    (Restored::from_output(&out), took)
}

/// Wait up to `timeout` for `f`, failing with `what` and the tree's own logs.
fn wait_or_show<T>(
    timeout: Duration,
    what: &str,
    logs: &[&Path],
    mut f: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() > deadline {
            let shown: String = logs
                .iter()
                .map(|l| {
                    let text = fs::read_to_string(l).unwrap_or_default();
                    format!("--- {}:\n{text}\n", l.display())
                })
                .collect();
            panic!("timed out waiting for {what}\n{shown}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} failed: {:?}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

// ---------------------------------------------------------------------------------------
// Python multiprocessing

/// f(i) of pool.py: ROUNDS rounds of a 64-bit LCG.
fn pool_task(i: u64, rounds: u64) -> u64 {
    let mut x = i;
    for _ in 0..rounds {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407)
            .wrapping_add(i);
    }
    x
}

/// Removes the pool's shared memory block from /dev/shm if the pool did not.
struct ShmBlock(String);

impl Drop for ShmBlock {
    fn drop(&mut self) {
        let _ = fs::remove_file(Path::new("/dev/shm").join(&self.0));
    }
}

/// A `multiprocessing` pool of four workers, dumped with some of its tasks done and the
/// rest in the workers' hands, finishes them after the restore: every result, as the
/// pool returned it and as the workers wrote it into the shared Array and the
/// SharedMemory block, is the one computed here.
#[test]
fn python_multiprocessing_pool_finishes_its_tasks_after_restore() {
    const TASKS: u64 = 24;
    const ROUNDS: u64 = 300_000;
    let python = program(PYTHON, "python3");
    let _lock = criu_lock();
    let tmp = test_dir();
    let dir = tmp.path();
    let (log, image) = (dir.join("pool.log"), dir.join("image"));
    let script = r#"log=$1; shift; exec "$@" </dev/null >>"$log" 2>&1"#;
    let tree = ProgramTree::start(
        &[],
        script,
        &[
            log.to_str().unwrap(),
            python.to_str().unwrap(),
            fixture("pool.py").to_str().unwrap(),
            dir.to_str().unwrap(),
            &TASKS.to_string(),
            &ROUNDS.to_string(),
        ],
    );
    let shm_name = wait_or_show(Duration::from_secs(30), "the pool", &[&log], || {
        fs::read_to_string(dir.join("ready")).ok()
    });
    let _shm = ShmBlock(shm_name);
    let progress = || -> u64 {
        fs::read_to_string(dir.join("progress"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    };
    wait_or_show(Duration::from_secs(60), "4 tasks done", &[&log], || {
        (progress() >= 4).then_some(())
    });
    let workers = children(tree.pid);
    let dump = tree.dump(&image, &[]);
    let at_dump = progress();
    assert!(
        at_dump < TASKS && !dir.join("result").exists(),
        "the pool was done before the dump ({at_dump} of {TASKS} tasks): more ROUNDS needed"
    );
    assert!(
        workers.len() >= 4,
        "the pool's processes at the dump: {workers:?}"
    );

    let (_restored, restore) = restore(&image);
    let result = wait_or_show(
        Duration::from_secs(60),
        "the restored pool's result",
        &[&log],
        || fs::read_to_string(dir.join("result")).ok(),
    );
    let lines: Vec<&str> = result.lines().collect();
    assert_eq!(lines.len() as u64, TASKS, "{result}");
    for (i, line) in lines.iter().enumerate() {
        let want = pool_task(i as u64, ROUNDS);
        assert_eq!(
            *line,
            format!("{i} {want} {want} {want}"),
            "task {i}: pool result, shared Array, SharedMemory"
        );
    }
    eprintln!("pool: dumped with {at_dump}/{TASKS} tasks done; dump {dump:?}, restore {restore:?}");
}

// ---------------------------------------------------------------------------------------
// nginx

/// A body of `len` bytes that no two offsets of share a 4-byte window with.
fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32 / 4 + 1)
        .flat_map(|i| (i.wrapping_mul(2654435761) ^ seed).to_le_bytes())
        .take(len)
        .collect()
}

/// nginx (Debian's, in a network namespace of the tree's own) serves a keep-alive
/// connection of a Python client in the same tree; the tree is dumped between two
/// requests, and after the restore the same connection (same client port, same
/// nginx connection number, its request count going on) serves two more, whose bodies
/// are the files served.
#[test]
fn nginx_serves_a_keep_alive_connection_across_dump_and_restore() {
    let nginx = program(NGINX, "nginx");
    let python = program(PYTHON, "python3");
    let _lock = criu_lock();
    let tmp = test_dir();
    let dir = tmp.path();
    let www = dir.join("www");
    fs::create_dir_all(&www).unwrap();
    fs::create_dir_all(dir.join("tmp")).unwrap();
    let files: [(&str, Vec<u8>); 2] = [
        ("blob.bin", pattern(300 << 10, 0x5eed)),
        (
            "page.html",
            b"<html><body>restored</body></html>\n".to_vec(),
        ),
    ];
    for (name, body) in &files {
        fs::write(www.join(name), body).unwrap();
        fs::set_permissions(www.join(name), fs::Permissions::from_mode(0o644)).unwrap();
    }
    // Workers run as www-data, as Debian's configuration has them, where CRIU can dump
    // another user's processes.
    let user = if has_cap_sys_resource() {
        "www-data"
    } else {
        "root"
    };
    let conf = fs::read_to_string(fixture("nginx.conf"))
        .unwrap()
        .replace("@USER@", user);
    fs::write(dir.join("nginx.conf"), conf).unwrap();
    let logs = [
        dir.join("tree.log"),
        dir.join("error.log"),
        dir.join("error"),
    ];
    let logs: Vec<&Path> = logs.iter().map(PathBuf::as_path).collect();
    let script = r#"dir=$1; nginx=$2; python=$3; client=$4
        exec </dev/null >>"$dir/tree.log" 2>&1
        ip link set lo up
        "$nginx" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" &
        "$python" "$client" "$dir" 8080 /blob.bin /page.html /blob.bin &
        wait"#;
    let tree = ProgramTree::start(
        &["--net"],
        script,
        &[
            dir.to_str().unwrap(),
            nginx.to_str().unwrap(),
            python.to_str().unwrap(),
            fixture("http_client.py").to_str().unwrap(),
        ],
    );
    let meta = |n: u32| -> Option<Vec<String>> {
        let text = fs::read_to_string(dir.join(format!("meta-{n}"))).ok()?;
        Some(text.split_whitespace().map(str::to_owned).collect())
    };
    let body = |n: u32| fs::read(dir.join(format!("body-{n}"))).unwrap();
    let first = wait_or_show(Duration::from_secs(30), "the first response", &logs, || {
        meta(1)
    });
    assert_eq!(first[0], "200", "{first:?}");
    assert_eq!(first[3], "1", "the connection's first request: {first:?}");
    assert!(body(1) == files[0].1, "body 1 differs from blob.bin");

    let image = dir.join("image");
    let dump = tree.dump(&image, &["--tcp-established"]);
    let (_restored, restore) = restore(&image);
    for (n, file) in [(2, &files[1]), (3, &files[0])] {
        fs::write(dir.join(format!("go-{n}")), "").unwrap();
        let got = wait_or_show(
            Duration::from_secs(30),
            &format!("response {n} after the restore"),
            &logs,
            || meta(n),
        );
        assert_eq!(
            got,
            [
                "200".to_owned(),
                first[1].clone(),
                first[2].clone(),
                n.to_string()
            ],
            "status, client port, nginx's connection number, its request count"
        );
        assert!(body(n) == file.1, "body {n} differs from {}", file.0);
    }
    assert!(!dir.join("error").exists());
    eprintln!("nginx ({user} workers): dump {dump:?}, restore {restore:?}");
}

/// nginx (Debian's) serves the job's address on one host (a network namespace standing for
/// a machine) to a client on another (`tests/common/hosts.rs`), on one keep-alive
/// connection. nginx's tree is dumped on the source, the job's address is moved to the
/// destination as a floating address moves, and the tree is restored there: the
/// client's connection goes on (same client port, nginx's same connection number, its
/// request count 2 and 3). Here with the dump and the restore on each host.
#[test]
fn nginx_keeps_its_client_connection_when_restored_on_another_host_with_its_address() {
    nginx_moves_to_another_host(Move::DumpAndRestore);
}

/// As above, moved by `gpucr migrate` (stop-and-copy) to `gpucr receive`.
#[test]
fn nginx_keeps_its_client_connection_when_migrated_with_its_address() {
    nginx_moves_to_another_host(Move::Migrate(&[]));
}

/// As above, moved by `gpucr migrate --post-copy`: nginx answers on the destination
/// while its memory is pulled from the source.
#[test]
fn nginx_keeps_its_client_connection_when_migrated_post_copy_with_its_address() {
    nginx_moves_to_another_host(Move::Migrate(&["--post-copy"]));
}

/// How a tree goes from one host to the other.
enum Move {
    /// `gpucr dump` on the source, the address moved, `gpucr restore` on the destination.
    DumpAndRestore,
    /// The address moved (the job's connection idle meanwhile), then `gpucr migrate`
    /// with these flags to `gpucr receive --once` on the destination.
    Migrate(&'static [&'static str]),
}

/// Move `tree` (its root's pid) from the source to the destination `how`, `dir` holding
/// what the move needs; the restored tree.
fn move_tree(hosts: &common::hosts::Hosts, tree: &ProgramTree, dir: &Path, how: &Move) -> Restored {
    use common::hosts::Host;
    match how {
        Move::DumpAndRestore => {
            let image = dir.join("image");
            run(hosts
                .command(Host::Source, gpucr_bin())
                .args(["dump", "--tcp-established"])
                .arg(tree.pid.to_string())
                .arg(&image));
            wait_for(
                Duration::from_secs(10),
                "the dumped tree to be killed",
                || (!alive(tree.pid)).then_some(()),
            );
            hosts.move_job_address();
            let out = run(hosts
                .command(Host::Destination, gpucr_bin())
                .args(["restore", "--detach"])
                .arg(&image));
            Restored::from_output(&out)
        }
        Move::Migrate(flags) => {
            let keys = dir.join("keys");
            let images = dir.join("received");
            fs::create_dir_all(&keys).unwrap();
            fs::create_dir_all(&images).unwrap();
            for name in ["source", "receiver"] {
                assert_success(&gpucr(&["keygen", name, "--dir", keys.to_str().unwrap()]));
            }
            let identity = |me: &str, peer: &str| -> Vec<PathBuf> {
                vec![
                    "--key".into(),
                    keys.join(format!("{me}.key")),
                    "--cert".into(),
                    keys.join(format!("{me}.crt")),
                    "--peer-cert".into(),
                    keys.join(format!("{peer}.crt")),
                ]
            };
            let mut receiver = hosts
                .command(Host::Destination, gpucr_bin())
                .args(["receive", "--once", "--link-timeout", "10"])
                .args(["--listen", "0.0.0.0:7431", "--dir"])
                .arg(&images)
                .args(identity("receiver", "source"))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let mut lines = Lines::of(receiver.stderr.take().unwrap());
            lines.wait_for_line(Duration::from_secs(30), "listening on");
            hosts.move_job_address();
            let out = run(hosts
                .command(Host::Source, gpucr_bin())
                .args(["migrate", "--tcp-established", "--link-timeout", "10"])
                .args(*flags)
                .arg(tree.pid.to_string())
                .arg(format!("{}:7431", hosts.address(Host::Destination)))
                .args(identity("source", "receiver")));
            let status = receiver.wait().unwrap();
            let mut received = String::new();
            std::io::Read::read_to_string(&mut receiver.stdout.take().unwrap(), &mut received)
                .unwrap();
            assert!(status.success(), "{status:?}\n{}", lines.all());
            assert!(
                String::from_utf8_lossy(&out.stdout).contains("migrated pid"),
                "{out:?}"
            );
            wait_for(
                Duration::from_secs(10),
                "the source's copy to be killed",
                || (!alive(tree.pid)).then_some(()),
            );
            Restored(received.trim().parse().unwrap())
        }
    }
}

fn nginx_moves_to_another_host(how: Move) {
    use common::hosts::{Host, Hosts, JOB_ADDRESS};
    let nginx = program(NGINX, "nginx");
    let python = program(PYTHON, "python3");
    let _lock = criu_lock();
    let hosts = Hosts::new();
    let tmp = test_dir();
    let dir = tmp.path();
    let www = dir.join("www");
    fs::create_dir_all(&www).unwrap();
    fs::create_dir_all(dir.join("tmp")).unwrap();
    let blob = pattern(300 << 10, 0x0a11);
    fs::write(www.join("blob.bin"), &blob).unwrap();
    fs::write(www.join("page.html"), b"moved\n").unwrap();
    for name in ["blob.bin", "page.html"] {
        fs::set_permissions(www.join(name), fs::Permissions::from_mode(0o644)).unwrap();
    }
    let conf = fs::read_to_string(fixture("nginx.conf"))
        .unwrap()
        .replace("@USER@", "root")
        .replace(
            "listen 127.0.0.1:8080",
            &format!("listen {JOB_ADDRESS}:8080"),
        );
    fs::write(dir.join("nginx.conf"), conf).unwrap();
    let logs = [
        dir.join("tree.log"),
        dir.join("client.log"),
        dir.join("error.log"),
    ];
    let logs: Vec<&Path> = logs.iter().map(PathBuf::as_path).collect();
    let script = r#"dir=$1; nginx=$2
        exec </dev/null >>"$dir/tree.log" 2>&1
        exec "$nginx" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log""#;
    let tree = ProgramTree::start_from(
        hosts.command(Host::Source, "unshare"),
        &[],
        script,
        &[dir.to_str().unwrap(), nginx.to_str().unwrap()],
    );
    let client_log = fs::File::create(dir.join("client.log")).unwrap();
    let mut client = Client(
        hosts
            .command(Host::Client, &python)
            .arg(fixture("http_client.py"))
            .arg(dir)
            .arg(format!("{JOB_ADDRESS}:8080"))
            .args(["/blob.bin", "/page.html", "/blob.bin"])
            .stdin(Stdio::null())
            .stdout(client_log.try_clone().unwrap())
            .stderr(client_log)
            .spawn()
            .unwrap(),
    );
    let meta = |n: u32| -> Option<Vec<String>> {
        let text = fs::read_to_string(dir.join(format!("meta-{n}"))).ok()?;
        Some(text.split_whitespace().map(str::to_owned).collect())
    };
    let first = wait_or_show(Duration::from_secs(30), "the first response", &logs, || {
        meta(1)
    });
    assert_eq!(first[0], "200", "{first:?}");
    assert!(fs::read(dir.join("body-1")).unwrap() == blob);

    let restored = move_tree(&hosts, &tree, dir, &how);
    let in_destination = fs::read_link(format!("/proc/{}/ns/net", restored.0)).unwrap();
    let destination = fs::metadata(hosts.path(Host::Destination)).unwrap();
    assert_eq!(
        in_destination.to_string_lossy(),
        format!(
            "net:[{}]",
            std::os::unix::fs::MetadataExt::ino(&destination)
        ),
        "the tree runs in the destination's network namespace"
    );
    for (n, body) in [(2, b"moved\n".to_vec()), (3, blob.clone())] {
        fs::write(dir.join(format!("go-{n}")), "").unwrap();
        let got = wait_or_show(
            Duration::from_secs(30),
            &format!("response {n} on the destination"),
            &logs,
            || meta(n),
        );
        assert_eq!(
            got,
            [
                "200".to_owned(),
                first[1].clone(),
                first[2].clone(),
                n.to_string()
            ],
            "status, client port, nginx's connection number, its request count"
        );
        assert!(fs::read(dir.join(format!("body-{n}"))).unwrap() == body);
    }
    assert!(!dir.join("error").exists());
    assert!(client.0.wait().unwrap().success());
}

/// A client outside the tree, killed should its test fail.
struct Client(Child);

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// ---------------------------------------------------------------------------------------
// PostgreSQL

/// psql's lines that start with `tag|` (the test's queries tag their rows).
fn tagged(out: &str, tag: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.strip_prefix(&format!("{tag}|")))
        .map(str::to_owned)
        .collect()
}

/// Send `sql` to the tree's psql through its FIFO.
fn send(fifo: &Path, sql: &str) {
    let mut f = fs::OpenOptions::new().write(true).open(fifo).unwrap();
    f.write_all(sql.as_bytes()).unwrap();
}

/// A query on a new connection from outside the tree, over TCP in the network
/// namespace of the tree whose root is `pid`; its rows.
fn query_from_outside(pid: i32, sql: &str) -> String {
    let out = run(Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .arg(format!("{POSTGRES_BIN}/psql"))
        .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
        .args(["-h", "127.0.0.1", "-p", "5432", "-U", "postgres", "-c", sql]));
    String::from_utf8(out.stdout).unwrap()
}

/// PostgreSQL (Debian's, in its own PID, network and IPC namespaces) with a psql
/// connected over TCP inside an open transaction: dumped there, restored, and the same
/// connection (same backend pid and client port) goes on in the same transaction (same
/// transaction id), inserts more and commits. A new connection from outside the tree
/// then finds every row, and found none of them before the commit.
#[test]
fn postgres_transaction_goes_on_after_restore() {
    let postgres = program(&format!("{POSTGRES_BIN}/postgres"), "postgresql-15");
    program(&format!("{POSTGRES_BIN}/psql"), "postgresql-client-15");
    let _lock = criu_lock();
    let tmp = test_dir();
    let dir = tmp.path();
    let data = dir.join("data");
    fs::create_dir(&data).unwrap();
    let pg_user = nix::unistd::User::from_name("postgres")
        .unwrap()
        .expect("the postgres user (made by Debian's postgresql-common)");
    nix::unistd::chown(&data, Some(pg_user.uid), Some(pg_user.gid)).unwrap();
    run(Command::new("setpriv")
        .args(["--reuid=postgres", "--regid=postgres", "--clear-groups"])
        .arg(postgres.with_file_name("initdb"))
        .args([
            "-D",
            data.to_str().unwrap(),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
        ])
        .env("LC_ALL", "C.UTF-8"));
    // Where CRIU cannot dump another user's processes, the server runs as root and is
    // told it runs as postgres (euid.c).
    let run_as = if has_cap_sys_resource() {
        "postgres".to_owned()
    } else {
        let lib = dir.join("euid.so");
        run(Command::new("cc")
            .args(["-shared", "-fPIC", "-O2"])
            .arg(format!("-DTEST_UID={}", pg_user.uid))
            .arg("-o")
            .arg(&lib)
            .arg(fixture("euid.c")));
        lib.to_str().unwrap().to_owned()
    };
    let fifo = dir.join("sql");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits(0o600).unwrap()).unwrap();
    let (tree_log, psql_out) = (dir.join("tree.log"), dir.join("psql.out"));
    let logs = [tree_log.as_path(), psql_out.as_path()];
    let tree = ProgramTree::start(
        &["--net", "--ipc"],
        r#"exec sh "$@""#,
        &[
            fixture("postgres-tree.sh").to_str().unwrap(),
            POSTGRES_BIN,
            dir.to_str().unwrap(),
            &run_as,
        ],
    );
    wait_or_show(Duration::from_secs(60), "psql to start", &logs, || {
        fs::read_to_string(&tree_log)
            .ok()?
            .contains("psql started")
            .then_some(())
    });
    send(
        &fifo,
        "SELECT 'conn', pg_backend_pid(), inet_client_port();\n\
         CREATE TABLE t (id int PRIMARY KEY, note text NOT NULL);\n\
         BEGIN;\n\
         INSERT INTO t SELECT g, 'before ' || g FROM generate_series(1, 1000) g;\n\
         SELECT 'txid', txid_current();\n\
         \\echo in-transaction\n",
    );
    let psql = || fs::read_to_string(&psql_out).unwrap_or_default();
    wait_or_show(
        Duration::from_secs(30),
        "the open transaction",
        &logs,
        || psql().contains("in-transaction").then_some(()),
    );
    let before = psql();
    assert_eq!(
        query_from_outside(tree.pid, "SELECT count(*) FROM t").trim(),
        "0",
        "rows of a transaction not committed are seen"
    );

    let image = dir.join("image");
    let dump = tree.dump(&image, &["--tcp-established"]);
    let (restored, restore) = restore(&image);
    send(
        &fifo,
        "INSERT INTO t SELECT g, 'after ' || g FROM generate_series(1001, 1500) g;\n\
         SELECT 'conn', pg_backend_pid(), inet_client_port();\n\
         SELECT 'txid', txid_current();\n\
         COMMIT;\n\
         \\echo committed\n",
    );
    wait_or_show(Duration::from_secs(30), "the commit", &logs, || {
        psql().contains("committed").then_some(())
    });
    let after = psql();
    let (conn, txid) = (tagged(&after, "conn"), tagged(&after, "txid"));
    assert_eq!(conn.len(), 2, "{after}");
    assert_eq!(conn[0], conn[1], "the connection changed:\n{after}");
    assert_eq!(txid.len(), 2, "{after}");
    assert_eq!(txid[0], txid[1], "the transaction changed:\n{after}");
    assert_eq!(tagged(&before, "conn"), conn[..1], "{before}");
    assert!(
        !after.contains("ERROR") && !after.contains("FATAL"),
        "{after}"
    );

    let rows = query_from_outside(restored.0, "SELECT 'row', id, note FROM t ORDER BY id");
    let want: Vec<String> = (1..=1500)
        .map(|id| {
            let when = if id <= 1000 { "before" } else { "after" };
            format!("{id}|{when} {id}")
        })
        .collect();
    assert_eq!(tagged(&rows, "row"), want);
    eprintln!(
        "postgres (server as {}): dump {dump:?}, restore {restore:?}",
        if run_as == "postgres" {
            "postgres"
        } else {
            "root, told postgres"
        }
    );
}
