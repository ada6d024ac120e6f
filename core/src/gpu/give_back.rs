//! What the give-back guards of the GPU backends share: which recorded processes are
//! still there once CRIU has let them go, and giving each of them back on a thread of
//! its own.
//!
//! A backend whose dump changes a process's driver state before the freeze (the cuda
//! backend, the simulator's `nvidia` model) starts a guard (`crate::guard`) that is told
//! of every process it touches, with the process's start time, which tells it from a
//! later process with the same pid. Should gpucr die during the dump, the guard gives
//! back those that are still the same process: [`live_once_untraced`], then [`each`].

use std::time::Duration;

use super::GpuError;
use crate::target;

/// What became of one process a guard gave back.
#[derive(Debug)]
pub struct GivenBack {
    pub pid: i32,
    /// The driver calls made (none: it already was as it had been).
    pub result: Result<Vec<&'static str>, GpuError>,
}

/// The records `parse` reads from a guard's `lines`, each process once (its last
/// record wins, `pid` telling whose it is); lines that are not records are skipped.
pub fn last_records<T>(
    lines: &[String],
    parse: impl Fn(&str) -> Option<T>,
    pid: impl Fn(&T) -> i32,
) -> Vec<T> {
    let mut records: Vec<T> = Vec::new();
    for record in lines.iter().filter_map(|l| parse(l)) {
        records.retain(|r| pid(r) != pid(&record));
        records.push(record);
    }
    records
}

/// Those of `tasks` that are still the process recorded (`id` gives its pid and
/// [`target::start_time`]), once CRIU has let them go (no tracer), waiting up to
/// `wait`. Tasks that are gone, or whose pid is another process's now, are left out.
pub fn live_once_untraced<T: Clone>(
    tasks: &[T],
    id: impl Fn(&T) -> (i32, u64),
    wait: Duration,
) -> Vec<T> {
    let live = || -> Vec<T> {
        let same = |t: &&T| {
            let (pid, start) = id(t);
            target::start_time(pid) == Some(start)
        };
        tasks.iter().filter(same).cloned().collect()
    };
    crate::guard::until_untraced(wait, Duration::from_millis(50), || {
        live().iter().map(|t| id(t).0).collect()
    });
    live()
}

/// `give_back` for each of `tasks` (whose pid `pid` gives) on a thread of its own; a
/// thread that panics is reported as a failure for its process.
pub fn each<T: Sync>(
    tasks: &[T],
    pid: impl Fn(&T) -> i32,
    give_back: impl Fn(&T) -> Result<Vec<&'static str>, GpuError> + Sync,
) -> Vec<GivenBack> {
    std::thread::scope(|s| {
        let handles: Vec<_> = tasks
            .iter()
            .map(|t| {
                let give_back = &give_back;
                s.spawn(move || give_back(t))
            })
            .collect();
        handles
            .into_iter()
            .zip(tasks)
            .map(|(h, t)| GivenBack {
                pid: pid(t),
                result: h.join().unwrap_or_else(|_| {
                    Err(GpuError::Task {
                        pid: pid(t),
                        detail: "giving it back panicked".into(),
                    })
                }),
            })
            .collect()
    })
}

/// One clause per process: the calls made, or the failure.
pub fn summary(given: &[GivenBack]) -> String {
    given
        .iter()
        .map(|g| match &g.result {
            Ok(calls) if calls.is_empty() => format!("pid {} was already as before", g.pid),
            Ok(calls) => format!("pid {}: {}", g.pid, calls.join(", ")),
            // The error names the pid.
            Err(e) => format!("not given back: {e}"),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_that_are_gone_or_another_are_left_out() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let start = target::start_time(pid).unwrap();
        let wait = Duration::from_secs(1);
        let ids = |t: &(i32, u64)| *t;
        assert_eq!(
            live_once_untraced(&[(pid, start)], ids, wait),
            [(pid, start)]
        );
        assert!(live_once_untraced(&[(pid, start + 1)], ids, wait).is_empty());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(live_once_untraced(&[(pid, start)], ids, wait).is_empty());
    }

    #[test]
    fn each_pid_once_its_last_record_winning() {
        let lines: Vec<String> = ["7 a", "garbage", "7 b", "8 c"].map(String::from).into();
        let parse = |l: &str| {
            let (pid, what) = l.split_once(' ')?;
            Some((pid.parse::<i32>().ok()?, what.to_owned()))
        };
        let found = last_records(&lines, parse, |r| r.0);
        assert_eq!(found, [(7, "b".to_owned()), (8, "c".to_owned())]);
    }

    #[test]
    fn each_process_is_given_back_and_a_panic_is_a_failure() {
        let given = each(
            &[1, 2, 3],
            |&p| p,
            |&p| match p {
                1 => Ok(vec![]),
                2 => Ok(vec!["resume"]),
                _ => panic!("no"),
            },
        );
        assert_eq!(given.iter().map(|g| g.pid).collect::<Vec<_>>(), [1, 2, 3]);
        let text = summary(&given);
        assert!(
            text.starts_with("pid 1 was already as before; pid 2: resume; "),
            "{text}"
        );
        assert!(
            text.contains("pid 3") && text.contains("panicked"),
            "{text}"
        );
    }
}
