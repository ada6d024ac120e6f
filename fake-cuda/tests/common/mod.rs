//! Shared by the integration tests. Each test file holds one test, so each runs in a
//! process of its own: the fake reads its configuration from the environment once per
//! process, and each test sets that environment (for itself, the controlling process,
//! and for the application children it starts) before it loads the library.
//!
//! The library is found next to the test application binary: cargo puts
//! `CARGO_BIN_EXE_gpucr-fake-cuda-app` and the package's cdylib
//! (`libgpucr_fake_cuda.so`) in the same `target/<profile>/` directory, and builds both
//! before it runs integration tests. `GPUCR_FAKE_CUDA_LIB` overrides the path.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use gpucr_cuda_driver::Driver;

/// The application binary.
pub const APP: &str = env!("CARGO_BIN_EXE_gpucr-fake-cuda-app");

/// The built fake library.
pub fn fake_library() -> PathBuf {
    if let Some(p) = std::env::var_os("GPUCR_FAKE_CUDA_LIB") {
        return PathBuf::from(p);
    }
    let lib = Path::new(APP)
        .parent()
        .expect("the binary is in a directory")
        .join(gpucr_fake_cuda::LIBRARY_FILE);
    assert!(lib.exists(), "{} was not built", lib.display());
    lib
}

/// A test's world: its shared directory and this process's driver (the controlling
/// side).
pub struct World {
    pub dir: tempfile::TempDir,
    pub driver: Driver,
}

/// Sets this process's environment (`vars` plus the shared directory and the library)
/// and loads the fake.
pub fn world(vars: &[(&str, &str)]) -> World {
    let dir = tempfile::tempdir().expect("tempdir");
    std::env::set_var("GPUCR_FAKE_CUDA_DIR", dir.path());
    std::env::set_var("GPUCR_CUDA_LIBRARY", fake_library());
    for (k, v) in vars {
        std::env::set_var(k, v);
    }
    let driver = Driver::load().expect("load the fake library");
    World { dir, driver }
}

/// A running application.
pub struct App {
    pub child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl App {
    /// Starts the application with extra environment `vars`; waits for `ready`.
    pub fn start(vars: &[(&str, &str)]) -> Self {
        let mut app = Self::spawn(vars);
        let line = app.line();
        assert!(line.starts_with("ready"), "application said {line:?}");
        app
    }

    /// Starts it without waiting.
    pub fn spawn(vars: &[(&str, &str)]) -> Self {
        let mut cmd = Command::new(APP);
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start the application");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Self {
            child,
            stdin,
            stdout,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// The next line it writes.
    pub fn line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read");
        line.trim_end().to_owned()
    }

    /// Sends a command, returns its answer.
    pub fn ask(&mut self, command: &str) -> String {
        writeln!(self.stdin, "{command}").expect("write");
        self.stdin.flush().expect("flush");
        self.line()
    }

    /// The application's context directory.
    pub fn context(&self, world: &World) -> PathBuf {
        let prefix = format!("ctx-{}-", self.pid());
        std::fs::read_dir(world.dir.path())
            .expect("shared dir")
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&prefix))
            })
            .expect("the application has a context")
    }

    /// Its device memory files, sorted.
    pub fn memory_files(&self, world: &World) -> Vec<String> {
        let mut files: Vec<String> = std::fs::read_dir(self.context(world))
            .expect("context dir")
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(str::to_owned))
            .filter(|n| n.starts_with("mem-"))
            .collect();
        files.sort();
        files
    }
}

impl Drop for App {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl App {
    /// Sends a command without waiting for its answer.
    pub fn ask_later(&mut self, command: &str) {
        writeln!(self.stdin, "{command}").expect("write");
        self.stdin.flush().expect("flush");
    }
}

impl App {
    /// Whether it has written a line not read yet (without waiting).
    pub fn has_output(&mut self) -> bool {
        use std::os::fd::AsRawFd;
        if !self.stdout.buffer().is_empty() {
            return true;
        }
        let mut fd = libc::pollfd {
            fd: self.stdout.get_ref().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        unsafe { libc::poll(&mut fd, 1, 0) > 0 }
    }
}
