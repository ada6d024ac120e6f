//! The fake kernel's own rules: its SDMA rings execute copy packets as the hardware
//! generation says, refuse what the hardware would, and its KFD keeps the CRIU order.

use std::os::fd::AsFd;
use std::time::Duration;

use gpucr_abi::amdgpu_drm::sdma::{emit_copy, pad_ib, CountEncoding};
use gpucr_amdgpu::fake::{BoSpec, FakeGpu, FakeKernel, Queues};
use gpucr_amdgpu::RenderNode;

/// Two GTT buffers of `len` bytes mapped at 4 GiB and 8 GiB, an IB at 12 GiB, the
/// source filled with a pattern: (src, dst, ib) handles and the source's bytes.
fn setup(node: &dyn RenderNode, len: u64) -> ([u32; 3], Vec<u8>) {
    let src = node.create_gtt(len).unwrap();
    let dst = node.create_gtt(len).unwrap();
    let ib = node.create_gtt(4096).unwrap();
    node.va_map(src, 1 << 32, len).unwrap();
    node.va_map(dst, 2 << 32, len).unwrap();
    node.va_map(ib, 3 << 32, 4096).unwrap();
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
    node.map_cpu(src, len).unwrap().copy_from_slice(&data);
    ([src, dst, ib], data)
}

fn run(
    node: &dyn RenderNode,
    enc: CountEncoding,
    handles: [u32; 3],
    len: u64,
    list: &[u32],
) -> Result<(), String> {
    let mut ib = Vec::new();
    emit_copy(&mut ib, enc, 1 << 32, 2 << 32, len).unwrap();
    pad_ib(&mut ib);
    let mut map = node.map_cpu(handles[2], 4096).unwrap();
    for (d, w) in map.chunks_exact_mut(4).zip(&ib) {
        d.copy_from_slice(&w.to_le_bytes());
    }
    let ctx = node.ctx_create().unwrap();
    let list = node.bo_list(list).unwrap();
    let seq = node
        .submit(ctx, list, 1, 3 << 32, ib.len() as u32)
        .map_err(|e| e.to_string())?;
    assert!(node.wait(ctx, 1, seq, Duration::from_secs(1)).unwrap());
    Ok(())
}

#[test]
fn rings_copy_by_the_count_encoding_of_their_generation() {
    for (sdma_major, enc) in [(4, CountEncoding::BytesMinusOne), (3, CountEncoding::Bytes)] {
        let gpu = FakeGpu {
            sdma_major,
            ..FakeGpu::new(0x1000, 128)
        };
        let kernel = FakeKernel::new(vec![gpu]);
        let node = kernel.drm().open(128).unwrap();
        let len = 5 << 20;
        let (h, data) = setup(node.as_ref(), len);
        run(node.as_ref(), enc, h, len - 1, &h).unwrap();
        let out = node.map_cpu(h[1], len).unwrap();
        assert!(
            out[..(len - 1) as usize] == data[..(len - 1) as usize],
            "SDMA {sdma_major}"
        );
        assert_eq!(
            out[(len - 1) as usize],
            0,
            "SDMA {sdma_major}: one byte too many"
        );
        assert_eq!(kernel.ring_bytes()[&(0x1000, 1)], len - 1);
    }
}

#[test]
fn rings_refuse_what_the_hardware_would() {
    let kernel = FakeKernel::new(vec![FakeGpu::new(0x1000, 128)]);
    let node = kernel.drm().open(128).unwrap();
    let (h, _) = setup(node.as_ref(), 1 << 20);
    let enc = CountEncoding::BytesMinusOne;
    let err = run(node.as_ref(), enc, h, 1 << 20, &[h[0], h[2]]).unwrap_err();
    assert!(err.contains("not in the submission's BO list"), "{err}");
    let err = run(node.as_ref(), enc, h, (1 << 20) + 1, &h).unwrap_err();
    assert!(err.contains("run past the buffer"), "{err}");
    let ctx = node.ctx_create().unwrap();
    let list = node.bo_list(&h).unwrap();
    assert!(
        node.submit(ctx, list, 1, 3 << 32, 7).is_err(),
        "unpadded IB"
    );
    assert!(node.submit(ctx, list, 2, 3 << 32, 8).is_err(), "no ring 2");
    assert!(
        node.va_map(h[0], (1 << 32) + 4096, 4096).is_err(),
        "overlapping VA"
    );
}

#[test]
fn kfd_keeps_the_criu_order() {
    let kernel = FakeKernel::new(vec![FakeGpu::new(0x1000, 128)]);
    let task = kernel.spawn_process(&[0x1000], &[BoSpec::vram(0x1000, 8192)], 0);
    let kfd = kernel.kfd(std::process::id() as i32);
    let fd = task.kfd.as_fd();
    assert_eq!(kernel.dispatch(fd).unwrap(), 1);
    assert!(kfd.unpause(fd).is_err(), "UNPAUSE of running queues");
    let info = kfd.process_info(fd).unwrap();
    assert_eq!(kernel.queues(fd), Some(Queues::Paused));
    assert!(kernel.dispatch(fd).unwrap_err().contains("never run"));
    let checkpoint = kfd.checkpoint(fd, &info).unwrap();
    assert_eq!(checkpoint.dmabufs.iter().flatten().count(), 1);
    kfd.unpause(fd).unwrap();
    assert!(
        kfd.checkpoint(fd, &info).is_err(),
        "CHECKPOINT of running queues"
    );
    assert_eq!(kernel.dispatch(fd).unwrap(), 2);
    assert!(
        kfd.resume(fd, task.pid).is_err(),
        "RESUME of a process never restored"
    );
}
