//! Process trees as /proc shows them, for gpucr and its plugin alike.

/// The threads of `pid` (`/proc/PID/task`), none once it is gone.
pub fn threads(pid: i32) -> Vec<i32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks
                .flatten()
                .filter_map(|t| t.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// `pid` and all its descendants (through /proc/PID/task/TID/children), each once,
/// parents before their children.
pub fn tree_pids(pid: i32) -> Vec<i32> {
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        for tid in threads(p) {
            let children = std::fs::read_to_string(format!("/proc/{p}/task/{tid}/children"))
                .unwrap_or_default();
            for c in children
                .split_whitespace()
                .filter_map(|c| c.parse::<i32>().ok())
            {
                if !out.contains(&c) {
                    out.push(c);
                }
            }
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_is_in_its_parents_tree() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let me = std::process::id() as i32;
        let tree = tree_pids(me);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(tree[0], me);
        assert!(tree.contains(&(child.id() as i32)), "{tree:?}");
    }
}
