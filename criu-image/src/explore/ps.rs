//! The process tree: pstree.img plus each thread's core image (`crit x ps`).

use std::collections::{HashMap, HashSet};

use crate::dir::ImageDir;
use crate::error::{ImageError, Result};

/// A task's state when it was dumped (CRIU's TASK_*).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskState {
    Alive,
    Dead,
    Stopped,
    Zombie,
    Unknown(u32),
}

impl TaskState {
    pub fn from_raw(raw: u32) -> TaskState {
        match raw {
            1 => TaskState::Alive,
            2 => TaskState::Dead,
            3 => TaskState::Stopped,
            6 => TaskState::Zombie,
            other => TaskState::Unknown(other),
        }
    }

    /// Lower-case name: "alive", "dead", "stopped", "zombie", "unknown".
    pub fn name(&self) -> &'static str {
        match self {
            TaskState::Alive => "alive",
            TaskState::Dead => "dead",
            TaskState::Stopped => "stopped",
            TaskState::Zombie => "zombie",
            TaskState::Unknown(_) => "unknown",
        }
    }

    /// Whether the task has an address space, files and so on in the image.
    pub fn has_resources(&self) -> bool {
        matches!(self, TaskState::Alive | TaskState::Stopped)
    }
}

/// One thread of a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Thread {
    pub tid: u32,
    /// The thread's name (`comm`), when its core image records one.
    pub comm: Option<String>,
}

/// One process, with ids as seen inside its PID namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    pub pid: u32,
    pub ppid: u32,
    pub pgid: u32,
    pub sid: u32,
    pub comm: String,
    pub state: TaskState,
    pub exit_code: u32,
    /// Every thread, the main thread (tid == pid) included, in pstree order.
    pub threads: Vec<Thread>,
}

/// All processes of an image.
#[derive(Debug, Clone, Default)]
pub struct ProcessTree {
    processes: Vec<Process>,
    index: HashMap<u32, usize>,
    /// Indexes of each pid's children, in pstree order.
    children: HashMap<u32, Vec<usize>>,
}

impl ProcessTree {
    /// Read pstree.img and the core image of every thread.
    pub fn load(dir: &ImageDir) -> Result<ProcessTree> {
        let pstree_path = dir.file("pstree.img");
        let entries = dir.pstree()?;
        let mut tree = ProcessTree::default();
        for (i, entry) in entries.into_iter().enumerate() {
            let core = dir.core(entry.pid)?;
            let tc = core.tc.ok_or_else(|| {
                ImageError::invalid(
                    &dir.file(&format!("core-{}.img", entry.pid)),
                    8,
                    "the main thread's core has no task_core_entry",
                )
            })?;
            let mut threads = Vec::with_capacity(entry.threads.len());
            for &tid in &entry.threads {
                let comm = if tid == entry.pid {
                    core.thread_core
                        .as_ref()
                        .and_then(|t| t.comm.clone())
                        .or(Some(tc.comm.clone()))
                } else {
                    dir.core(tid)?.thread_core.and_then(|t| t.comm)
                };
                threads.push(Thread { tid, comm });
            }
            if tree.index.insert(entry.pid, i).is_some() {
                return Err(ImageError::invalid(
                    &pstree_path,
                    0,
                    format!("pid {} is listed twice", entry.pid),
                ));
            }
            tree.processes.push(Process {
                pid: entry.pid,
                ppid: entry.ppid,
                pgid: entry.pgid,
                sid: entry.sid,
                comm: tc.comm,
                state: TaskState::from_raw(tc.task_state),
                exit_code: tc.exit_code,
                threads,
            });
        }
        for (i, p) in tree.processes.iter().enumerate() {
            if p.ppid != p.pid {
                tree.children.entry(p.ppid).or_default().push(i);
            }
        }
        Ok(tree)
    }

    /// Processes in pstree.img order.
    pub fn processes(&self) -> &[Process] {
        &self.processes
    }

    pub fn get(&self, pid: u32) -> Option<&Process> {
        self.index.get(&pid).map(|&i| &self.processes[i])
    }

    pub fn len(&self) -> usize {
        self.processes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.processes.is_empty()
    }

    /// The children of `pid`, in pstree order.
    pub fn children(&self, pid: u32) -> Vec<&Process> {
        self.children
            .get(&pid)
            .map(|list| list.iter().map(|&i| &self.processes[i]).collect())
            .unwrap_or_default()
    }

    /// Processes whose parent is not in the image (normally just the root).
    pub fn roots(&self) -> Vec<&Process> {
        self.processes
            .iter()
            .filter(|p| p.ppid == 0 || self.get(p.ppid).is_none())
            .collect()
    }

    /// Every process with its depth, depth first from the roots. Processes that a broken
    /// image leaves unreachable (a ppid cycle) come last, as extra roots.
    pub fn walk(&self) -> Vec<(usize, &Process)> {
        let mut out = Vec::with_capacity(self.processes.len());
        let mut seen = HashSet::new();
        for root in self.roots() {
            self.walk_from(root.pid, &mut seen, &mut out);
        }
        for p in &self.processes {
            if !seen.contains(&p.pid) {
                self.walk_from(p.pid, &mut seen, &mut out);
            }
        }
        out
    }

    /// `pid` and its descendants, depth first; empty if `pid` is not in the image.
    pub fn subtree(&self, pid: u32) -> Vec<(usize, &Process)> {
        let mut out = Vec::new();
        if self.get(pid).is_some() {
            self.walk_from(pid, &mut HashSet::new(), &mut out);
        }
        out
    }

    fn walk_from<'a>(
        &'a self,
        pid: u32,
        seen: &mut HashSet<u32>,
        out: &mut Vec<(usize, &'a Process)>,
    ) {
        // Iterative, so a deep or cyclic tree cannot overflow the stack.
        let mut stack = vec![(0usize, pid)];
        while let Some((depth, pid)) = stack.pop() {
            if !seen.insert(pid) {
                continue;
            }
            let Some(p) = self.get(pid) else { continue };
            out.push((depth, p));
            for child in self.children(pid).into_iter().rev() {
                stack.push((depth + 1, child.pid));
            }
        }
    }
}
