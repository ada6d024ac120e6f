//! Custom storage at CUDA 13.4: the caller maps the target's memory, copies it out, the
//! target drops it; on restore the caller copies it back into fresh memory.

mod common;

use gpucr_cuda_driver::{ProcessState, Uuid};
use gpucr_fake_cuda::config::gpu_uuid;

#[test]
fn custom_storage_round_trip() {
    let w = common::world(&[
        ("GPUCR_FAKE_CUDA_VERSION", "13040"),
        ("GPUCR_FAKE_CUDA_GPUS", "3"),
    ]);
    let d = &w.driver;
    assert!(d.has_custom_storage());
    let mut app = common::App::start(&[("GPUCR_FAKE_CUDA_GPUS", "2")]);
    let pid = app.pid();
    let ctx = app.context(&w);
    let files = app.memory_files(&w);
    let originals: Vec<Vec<u8>> = files
        .iter()
        .map(|f| std::fs::read(ctx.join(f)).unwrap())
        .collect();

    // Copies need a context current in this process.
    let context = d.primary_ctx_retain(d.device_get(0).unwrap()).unwrap();
    d.ctx_set_current(context).unwrap();

    d.lock(pid, None).unwrap();
    let storage = d.checkpoint_custom(pid).unwrap();
    assert_eq!(storage.devices.len(), 2);
    let mut saved = Vec::new();
    for (region, original) in storage.devices.iter().zip(&originals) {
        assert_eq!(region.size, original.len());
        assert_ne!(region.stream, 0);
        let mut copy = vec![0u8; region.size];
        d.memcpy_dtoh(&mut copy, region.dev_ptr).unwrap();
        assert_eq!(&copy, original);
        saved.push(copy);
    }
    // Until the operation completes, the process is not checkpointed.
    assert_eq!(d.process_state(pid).unwrap(), ProcessState::Locked);
    d.operation_complete(&storage.handle).unwrap();
    assert_eq!(d.process_state(pid).unwrap(), ProcessState::Checkpointed);
    assert!(app.memory_files(&w).is_empty());
    // A host restore of a custom-storage checkpoint has nothing to restore from.
    assert!(d.restore(pid, &[]).is_err());

    // Restore onto GPU 2 instead of GPU 0.
    let pairs: [(Uuid, Uuid); 2] = [(gpu_uuid(0), gpu_uuid(2)), (gpu_uuid(1), gpu_uuid(1))];
    let storage = d.restore_custom(pid, &pairs).unwrap();
    assert_eq!(storage.devices.len(), 2);
    for (region, data) in storage.devices.iter().zip(&saved) {
        assert_eq!(region.size, data.len());
        let mut fresh = vec![1u8; region.size];
        d.memcpy_dtoh(&mut fresh, region.dev_ptr).unwrap();
        assert!(
            fresh.iter().all(|b| *b == 0),
            "restored memory starts empty"
        );
        d.memcpy_htod(region.dev_ptr, data).unwrap();
    }
    // Out of bounds of a region.
    let last = storage.devices[0];
    assert!(d.memcpy_htod(last.dev_ptr.offset(last.size), &[0]).is_err());
    d.operation_complete(&storage.handle).unwrap();
    assert_eq!(d.process_state(pid).unwrap(), ProcessState::Locked);
    d.unlock(pid).unwrap();
    assert_eq!(
        app.ask("uuids"),
        format!("uuids {} {}", gpu_uuid(2), gpu_uuid(1))
    );
    assert_eq!(app.ask("verify"), "ok");
}
