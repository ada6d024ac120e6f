//! A context's mailbox: a controlling process writes a request (`request`, with a
//! sequence number, renamed into place), the target's restore thread acts on the newest
//! request it has not answered and writes its answer (`answer`, renamed into place).
//!
//! Request: `<seq> <op> [timeout=<ms>] [pair=<old>,<new>]...`
//! Answer: `<seq> <CUresult> <state>` then one `gpu <ordinal> <uuid> <size>` line per GPU
//! for the custom-storage steps.

use std::fs;
use std::io;
use std::path::Path;

use gpucr_cuda_driver::sys::CUresult;
use gpucr_cuda_driver::Uuid;

/// The request file in a context directory.
pub const REQUEST_FILE: &str = "request";
/// Every request is padded with spaces to this many bytes (its newline included): the
/// target's restore thread polls the request file, and a target frozen while it reads
/// has the file open; CRIU records the file's size and refuses to restore a file whose
/// size changed, so every request has the same size. Room for 64 GPU pairs.
pub const REQUEST_SIZE: usize = 8192;
/// The answer file in a context directory.
pub const ANSWER_FILE: &str = "answer";

/// What a controlling process asks of a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// RUNNING to LOCKED, waiting at most `timeout_ms` (0: no limit) for calls in flight.
    Lock {
        /// The lock's timeout.
        timeout_ms: u32,
    },
    /// LOCKED to CHECKPOINTED, device memory staged in the process.
    Checkpoint,
    /// CHECKPOINTED to LOCKED from the staged memory.
    Restore {
        /// (old, new) GPU pairs.
        pairs: Vec<(Uuid, Uuid)>,
    },
    /// LOCKED to RUNNING.
    Unlock,
    /// Custom storage: name the device memory to map.
    CheckpointBegin,
    /// Custom storage: drop the device memory (CHECKPOINTED).
    CheckpointComplete,
    /// Custom storage: recreate empty device memory to map.
    RestoreBegin {
        /// (old, new) GPU pairs.
        pairs: Vec<(Uuid, Uuid)>,
    },
    /// Custom storage: the memory is filled (LOCKED).
    RestoreComplete,
    /// Withdraw the request before (a controlling call that gave up waiting).
    Cancel,
}

/// A request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Its sequence number.
    pub seq: u64,
    /// What it asks.
    pub op: Op,
}

/// One GPU's memory, in an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuMemory {
    /// The ordinal.
    pub ordinal: u8,
    /// The GPU's UUID.
    pub uuid: Uuid,
    /// The memory's length.
    pub size: u64,
}

/// An answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The request's sequence number.
    pub seq: u64,
    /// The result.
    pub code: CUresult,
    /// The process state after it.
    pub state: i32,
    /// The GPUs' memory, for the custom-storage steps.
    pub gpus: Vec<GpuMemory>,
}

impl Request {
    /// As a line, padded to [`REQUEST_SIZE`].
    pub fn encode(&self) -> String {
        let mut s = format!("{} ", self.seq);
        let pairs = |s: &mut String, pairs: &[(Uuid, Uuid)]| {
            for (old, new) in pairs {
                s.push_str(&format!(" pair={old},{new}"));
            }
        };
        match &self.op {
            Op::Lock { timeout_ms } => s.push_str(&format!("lock timeout={timeout_ms}")),
            Op::Checkpoint => s.push_str("checkpoint"),
            Op::Restore { pairs: p } => {
                s.push_str("restore");
                pairs(&mut s, p);
            }
            Op::Unlock => s.push_str("unlock"),
            Op::CheckpointBegin => s.push_str("checkpoint-begin"),
            Op::CheckpointComplete => s.push_str("checkpoint-complete"),
            Op::RestoreBegin { pairs: p } => {
                s.push_str("restore-begin");
                pairs(&mut s, p);
            }
            Op::RestoreComplete => s.push_str("restore-complete"),
            Op::Cancel => s.push_str("cancel"),
        }
        debug_assert!(s.len() < REQUEST_SIZE, "a request of {} bytes", s.len());
        format!("{s:<width$}\n", width = REQUEST_SIZE - 1)
    }

    /// From a line.
    pub fn decode(text: &str) -> Option<Self> {
        let mut words = text.split_whitespace();
        let seq = words.next()?.parse().ok()?;
        let op = words.next()?;
        let mut timeout_ms = 0;
        let mut pairs = Vec::new();
        for w in words {
            if let Some(t) = w.strip_prefix("timeout=") {
                timeout_ms = t.parse().ok()?;
            } else if let Some(p) = w.strip_prefix("pair=") {
                let (old, new) = p.split_once(',')?;
                pairs.push((old.parse().ok()?, new.parse().ok()?));
            } else {
                return None;
            }
        }
        let op = match op {
            "lock" => Op::Lock { timeout_ms },
            "checkpoint" => Op::Checkpoint,
            "restore" => Op::Restore { pairs },
            "unlock" => Op::Unlock,
            "checkpoint-begin" => Op::CheckpointBegin,
            "checkpoint-complete" => Op::CheckpointComplete,
            "restore-begin" => Op::RestoreBegin { pairs },
            "restore-complete" => Op::RestoreComplete,
            "cancel" => Op::Cancel,
            _ => return None,
        };
        Some(Self { seq, op })
    }
}

impl Answer {
    /// As text.
    pub fn encode(&self) -> String {
        let mut s = format!("{} {} {}\n", self.seq, self.code, self.state);
        for g in &self.gpus {
            s.push_str(&format!("gpu {} {} {}\n", g.ordinal, g.uuid, g.size));
        }
        s
    }

    /// From text.
    pub fn decode(text: &str) -> Option<Self> {
        let mut lines = text.lines();
        let mut head = lines.next()?.split_whitespace();
        let seq = head.next()?.parse().ok()?;
        let code = head.next()?.parse().ok()?;
        let state = head.next()?.parse().ok()?;
        let gpus = lines
            .map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                match w.as_slice() {
                    ["gpu", ordinal, uuid, size] => Some(GpuMemory {
                        ordinal: ordinal.parse().ok()?,
                        uuid: uuid.parse().ok()?,
                        size: size.parse().ok()?,
                    }),
                    _ => None,
                }
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Self {
            seq,
            code,
            state,
            gpus,
        })
    }
}

/// Writes `text` to `dir/name` atomically (a temporary file renamed into place).
pub fn put(dir: &Path, name: &str, text: &str) -> io::Result<()> {
    let tmp = dir.join(format!(
        ".{name}.{}.{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    fs::write(&tmp, text)?;
    fs::rename(&tmp, dir.join(name))
}

/// The file `dir/name`, if there is one.
pub fn get(dir: &Path, name: &str) -> Option<String> {
    fs::read_to_string(dir.join(name)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_for_64_gpus_fits_the_fixed_size() {
        let u = |i| crate::config::gpu_uuid(i);
        let pairs = (0..64).map(|i| (u(i), u(63 - i))).collect();
        let r = Request {
            seq: u64::MAX,
            op: Op::RestoreBegin { pairs },
        };
        assert_eq!(r.encode().len(), REQUEST_SIZE);
        assert_eq!(Request::decode(&r.encode()), Some(r));
    }

    #[test]
    fn requests_and_answers_round_trip() {
        let u = |i| crate::config::gpu_uuid(i);
        for op in [
            Op::Lock { timeout_ms: 250 },
            Op::Checkpoint,
            Op::Restore {
                pairs: vec![(u(0), u(2)), (u(1), u(3))],
            },
            Op::Unlock,
            Op::CheckpointBegin,
            Op::CheckpointComplete,
            Op::RestoreBegin { pairs: vec![] },
            Op::RestoreComplete,
            Op::Cancel,
        ] {
            let r = Request { seq: 17, op };
            assert_eq!(r.encode().len(), REQUEST_SIZE);
            assert_eq!(Request::decode(&r.encode()), Some(r));
        }
        let a = Answer {
            seq: 9,
            code: 401,
            state: 1,
            gpus: vec![GpuMemory {
                ordinal: 1,
                uuid: u(1),
                size: 8192,
            }],
        };
        assert_eq!(Answer::decode(&a.encode()), Some(a));
        assert_eq!(Request::decode("1 explode"), None);
    }
}
