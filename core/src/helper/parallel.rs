//! One step for many tasks at once, each task on a thread of its own.

/// `f` for every pid at once, one thread each; the outcomes in the order of `pids`.
pub(super) fn in_parallel<T: Send>(pids: &[i32], f: impl Fn(i32) -> T + Sync) -> Vec<T> {
    if let [pid] = pids {
        return vec![f(*pid)];
    }
    std::thread::scope(|scope| {
        let f = &f;
        let running: Vec<_> = pids
            .iter()
            .map(|&pid| scope.spawn(move || f(pid)))
            .collect();
        running
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    })
}
