//! Device memory survives checkpoint and restore byte for byte (host staging), also
//! onto other GPUs (UUID pairs).

mod common;

use gpucr_cuda_driver::{result, ProcessState, Uuid};
use gpucr_fake_cuda::config::gpu_uuid;

#[test]
fn memory_survives_checkpoint_and_restore_onto_other_gpus() {
    // This machine has four GPUs; the application uses the first two.
    let w = common::world(&[("GPUCR_FAKE_CUDA_GPUS", "4")]);
    let d = &w.driver;
    let mut app = common::App::start(&[("GPUCR_FAKE_CUDA_GPUS", "2")]);
    let pid = app.pid();
    assert_eq!(app.ask("rewrite 77"), "ok");
    let before = app.memory_files(&w);
    assert_eq!(
        before,
        vec![
            format!("mem-{}", gpu_uuid(0)),
            format!("mem-{}", gpu_uuid(1))
        ]
    );
    let ctx = app.context(&w);
    let bytes_before: Vec<Vec<u8>> = before
        .iter()
        .map(|f| std::fs::read(ctx.join(f)).unwrap())
        .collect();

    // Checkpoint: the memory moves into the process; nothing is left on the "GPUs".
    d.lock(pid, None).unwrap();
    d.checkpoint(pid).unwrap();
    assert!(app.memory_files(&w).is_empty());
    // Wipe whatever else might hold it: only the control file and mailbox remain.
    for e in std::fs::read_dir(&ctx).unwrap().flatten() {
        let name = e.file_name().into_string().unwrap();
        assert!(
            ["gpucr-fake-cuda.control", "request", "answer"].contains(&name.as_str()),
            "{name}"
        );
    }

    // Pairs that leave a checkpointed GPU out, or name a GPU this machine lacks, fail.
    let (g0, g1, g2, g3) = (gpu_uuid(0), gpu_uuid(1), gpu_uuid(2), gpu_uuid(3));
    let err = d.restore(pid, &[(g0, g2)]).unwrap_err();
    assert_eq!(err.cuda_code(), Some(result::INVALID_VALUE), "{err}");
    let absent = Uuid([0xab; 16]);
    let err = d.restore(pid, &[(g0, g2), (g1, absent)]).unwrap_err();
    assert_eq!(err.cuda_code(), Some(result::INVALID_VALUE), "{err}");
    assert_eq!(d.process_state(pid).unwrap(), ProcessState::Checkpointed);

    // Restore onto GPUs 2 and 3 (swapped order, to be sure the pairs are honoured).
    d.restore(pid, &[(g1, g2), (g0, g3)]).unwrap();
    assert_eq!(d.process_state(pid).unwrap(), ProcessState::Locked);
    let after = app.memory_files(&w);
    assert_eq!(after, vec![format!("mem-{g2}"), format!("mem-{g3}")]);
    assert_eq!(
        std::fs::read(ctx.join(format!("mem-{g3}"))).unwrap(),
        bytes_before[0]
    );
    assert_eq!(
        std::fs::read(ctx.join(format!("mem-{g2}"))).unwrap(),
        bytes_before[1]
    );
    d.unlock(pid).unwrap();
    assert_eq!(app.ask("uuids"), format!("uuids {g3} {g2}"));
    assert_eq!(app.ask("verify"), "ok");

    // And once more without pairs, after new writes.
    assert_eq!(app.ask("rewrite 78"), "ok");
    d.lock(pid, None).unwrap();
    d.checkpoint(pid).unwrap();
    d.restore(pid, &[]).unwrap();
    d.unlock(pid).unwrap();
    assert_eq!(app.ask("verify"), "ok");
}
