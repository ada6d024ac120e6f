//! The amdgpu backend's whole dump and restore sequences against the fake kernel
//! (`gpucr_amdgpu::fake`), through the code CRIU's hooks run (`gpucr_plugin::flow`: a
//! new plugin run for each dump and each restore, with explicit settings) and
//! gpucr's helpers (`gpucr::helper::DumpHelper`, `RestoreHelper`) over the real helper
//! protocol: PAUSE and CHECKPOINT_DEVICES (PROCESS_INFO, CHECKPOINT, dmabufs to the
//! helper), DUMP_EXT_FILE of /dev/kfd and the render nodes, the SDMA copies into the
//! image, `exit(DUMP)` (UNPAUSE); then RESTORE_EXT_FILE (KFD RESTORE on the mapped
//! GPUs, the new dmabufs to the helper), UPDATE_VMA_MAP, RESUME_DEVICES_LATE (the
//! task's buffers, then RESUME), and a dispatch on the restored queues. Every buffer
//! byte is checked after the restore.
//!
//! The dumped processes are real child processes holding the fake's kfd and render
//! files, so the helper finds them through /proc and kcmp as it would on a machine with
//! AMD GPUs. The restored tasks all run in this test process, whose pid the helper
//! knows them by, so they are restored one after the other (RESTORE_EXT_FILE then
//! RESUME_DEVICES_LATE for each); tests/gpu.rs covers CRIU's own order on the same
//! helper code with the simulator.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpucr::gpu::amdgpu::AmdgpuBackend;
use gpucr::gpu::{Backend, DeviceRole, GpuRef, TaskDevice};
use gpucr::helper::{timeline_events, DumpHelper, RestoreHelper};
use gpucr::transfer::{DumpWriter, Restorer, TransferConfig};
use gpucr_abi::plugin_abi::stage;
use gpucr_amdgpu::fake::{BoSpec, FakeGpu, FakeKernel, FakeOp, FakeTask, Queues};
use gpucr_plugin::flow::{AmdgpuHalf, PluginHalf, PluginRun, Settings};
use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};

/// One sequence at a time (the failure tests' time limits are 300 ms).
static SERIAL: Mutex<()> = Mutex::new(());

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/topology")
        .join(name)
}

fn me() -> i32 {
    std::process::id() as i32
}

/// A fake machine with the GPUs of a topology fixture.
struct Machine {
    kernel: Arc<FakeKernel>,
    root: PathBuf,
    /// gpu_ids, in node order.
    gpus: Vec<u32>,
}

impl Machine {
    fn new(fixture_name: &str) -> Machine {
        let root = fixture(fixture_name);
        let topology = gpucr_topology::read_local(Some(&root)).unwrap();
        let gpus: Vec<FakeGpu> = topology
            .kfd_nodes
            .iter()
            .filter(|n| n.is_gpu())
            .map(|n| FakeGpu::new(n.gpu_id, n.prop("drm_render_minor") as u32))
            .collect();
        Machine {
            gpus: gpus.iter().map(|g| g.gpu_id).collect(),
            kernel: FakeKernel::new(gpus),
            root,
        }
    }

    /// A new gpucr (the helper's backend) on this machine.
    fn backend(&self, fence_timeout: Duration) -> Arc<AmdgpuBackend> {
        Arc::new(
            AmdgpuBackend::new(
                self.kernel.kfd(me()),
                self.kernel.drm(),
                Some(self.root.clone()),
                fence_timeout,
            )
            .unwrap(),
        )
    }
}

/// A deterministic pattern for buffer `bo` of task `task` at `offset`.
fn pattern(task: usize, bo: usize, offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| {
            let x = (offset + i).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ ((task as u64) << 40)
                ^ ((bo as u64) << 32);
            (x >> 29) as u8 | 1
        })
        .collect()
}

/// The byte ranges of a buffer of `size` bytes that a test fills and checks: the
/// whole buffer when small, else its start, around 2^31 and 2^32, and its end.
fn ranges(size: u64) -> Vec<(u64, usize)> {
    if size <= 64 * MIB {
        return vec![(8, (size - 8) as usize)];
    }
    let mut r = vec![(8, MIB as usize), (size - MIB, MIB as usize)];
    for at in [1u64 << 31, 1u64 << 32] {
        if at + MIB < size {
            r.push((at - 4096 + 3, 2 * 4096));
        }
    }
    r
}

/// A dumped process: the child holding its files, its buffers and its counter.
struct Task {
    fake: FakeTask,
    bos: Vec<BoSpec>,
    counter: u64,
}

fn spawn(m: &Machine, index: usize, devices: &[u32], bos: &[BoSpec]) -> Task {
    let fake = m.kernel.spawn_process(devices, bos, 0);
    let counter = 1000 + index as u64;
    m.kernel
        .write_bo(fake.kfd.as_fd(), 0, 0, &counter.to_le_bytes());
    for (b, spec) in bos.iter().enumerate() {
        for (at, len) in ranges(spec.size) {
            m.kernel
                .write_bo(fake.kfd.as_fd(), b, at, &pattern(index, b, at, len));
        }
    }
    Task {
        fake,
        bos: bos.to_vec(),
        counter,
    }
}

/// A new connector between a helper and the plugin side of this process: (helper's
/// end, criu's end).
fn connector() -> (OwnedFd, OwnedFd) {
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .unwrap()
}

/// A plugin run of `stage` with `half`, set up as gpucr sets up its CRIU: the connector
/// `criu_end` named as `GPUCR_HELPER_FD` names it.
fn run(stage: i32, criu_end: &OwnedFd, half: Arc<AmdgpuHalf>) -> PluginRun {
    let settings = Settings {
        helper_fd: Some(criu_end.as_raw_fd().to_string()),
        ..Settings::default()
    };
    PluginRun::with_half(stage, settings, half)
}

fn file_id(task: usize, file: usize) -> i32 {
    (task * 16 + file + 1) as i32
}

/// A hook's failure as CRIU's log shows it, after "gpucr: ": its kind's mark, then what
/// failed ("device error: fake ProcessInfo ...").
fn marked(e: gpucr_plugin::flow::HookFailure) -> String {
    format!("{}{}", e.kind.mark(), e.message)
}

/// Dump `tasks` into `dir` as CRIU and gpucr would: the device state of each task.
fn dump(
    m: &Machine,
    backend: Arc<AmdgpuBackend>,
    tasks: &[&Task],
    dir: &Path,
) -> Result<Vec<TaskDevice>, String> {
    let (helper_end, criu_end) = connector();
    let (events, timeline) = timeline_events(Arc::new(|_| {}));
    let writer = DumpWriter::start(dir, TransferConfig::default(), events).unwrap();
    let helper = DumpHelper::start_dump(
        helper_end,
        backend,
        writer,
        (dir.to_path_buf(), TransferConfig::default()),
        timeline,
        false,
        gpucr::helper::StepControl {
            device_timeout: Duration::from_secs(20),
            operation: gpucr::cancel::Cancel::new(),
        },
    )
    .unwrap();
    let mut plugin = run(
        stage::DUMP,
        &criu_end,
        Arc::new(AmdgpuHalf::new(m.kernel.kfd(me()))),
    );
    let mut steps = || -> Result<Vec<TaskDevice>, String> {
        let fail = marked;
        for t in tasks {
            plugin.pause_devices(t.fake.pid).map_err(fail)?;
        }
        for t in tasks {
            plugin.checkpoint_devices(t.fake.pid).map_err(fail)?;
        }
        for (i, t) in tasks.iter().enumerate() {
            for (f, file) in t.fake.files.iter().enumerate() {
                let ret = plugin
                    .dump_ext_file(file.as_raw_fd(), file_id(i, f))
                    .map_err(fail)?;
                assert_eq!(ret, 0, "file {f} of task {i} is gpucr's");
            }
        }
        // CRIU's post-dump: gpucr waits for every copy.
        helper
            .finish_dump()
            .map(|o| o.tasks)
            .map_err(|e| e.to_string())
    };
    let result = steps();
    // exit(DUMP) runs on success and failure alike; what fails there (the image already
    // complete) reaches the helper, as `gpucr dump` asks for it after CRIU.
    plugin.exit(stage::DUMP, if result.is_ok() { 0 } else { -1 });
    let devices = result?;
    match helper.take_failure() {
        Some(e) => Err(format!("after the dump: {e}")),
        None => Ok(devices),
    }
}

/// A restored task: its kfd fd (from RESTORE_EXT_FILE) and its plugin half.
struct Restored {
    kfd: OwnedFd,
    _half: Arc<AmdgpuHalf>,
}

/// Restore `tasks` (remapped with `map`) from `dir`.
fn restore(
    m: &Machine,
    backend: Arc<AmdgpuBackend>,
    dumped: &[&Task],
    mut tasks: Vec<TaskDevice>,
    dir: &Path,
    map: &[(GpuRef, GpuRef)],
    parallel: bool,
) -> Result<Vec<Restored>, String> {
    for t in &mut tasks {
        backend.remap_gpus(t, map).unwrap();
    }
    let (helper_end, criu_end) = connector();
    let (events, timeline) = timeline_events(Arc::new(|_| {}));
    let restorer = Restorer::open(dir, TransferConfig::default(), parallel, events).unwrap();
    let helper = RestoreHelper::start_restore(
        helper_end,
        backend,
        restorer,
        tasks.clone(),
        (parallel, false, None),
        timeline,
        gpucr::helper::StepControl {
            device_timeout: Duration::from_secs(20),
            operation: gpucr::cancel::Cancel::new(),
        },
    )
    .unwrap();
    let half = Arc::new(AmdgpuHalf::new(m.kernel.kfd(me())));
    let mut criu_main = run(stage::RESTORE, &criu_end, half);
    let outcome = restore_tasks(m, &helper, &mut criu_main, &criu_end, &tasks, dumped);
    // CRIU's exit hook ends every restore, whatever its outcome.
    criu_main.exit(stage::RESTORE, if outcome.is_ok() { 0 } else { -1 });
    outcome
}

/// The hooks of a restore for each of `tasks`, then the helper's checks, as CRIU and
/// gpucr call them: `criu_main`'s in CRIU's process, and in each restored task those of
/// its own run (the copy of CRIU's that its fork gives it).
fn restore_tasks(
    m: &Machine,
    helper: &RestoreHelper,
    criu_main: &mut PluginRun,
    criu_end: &OwnedFd,
    tasks: &[TaskDevice],
    dumped: &[&Task],
) -> Result<Vec<Restored>, String> {
    let fail = marked;
    let mut restored = Vec::new();
    for (task, original) in tasks.iter().zip(dumped) {
        // Inside the restored task.
        let half = Arc::new(AmdgpuHalf::new(m.kernel.kfd(me())));
        let in_task = run(stage::RESTORE, criu_end, half.clone());
        let mut kfd = None;
        for file in &task.device_files {
            let fd = in_task.restore_ext_file(file.id as i32).map_err(fail)?;
            assert!(fd >= 0);
            // SAFETY: RESTORE_EXT_FILE returns a new descriptor CRIU would own.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            match file.role {
                DeviceRole::Device => kfd = Some(fd),
                _ => check_render_fd(m, fd.as_fd(), &file.path, task),
            }
        }
        let kfd = kfd.ok_or("no kfd file restored")?;
        check_vmas(m, &half, original, kfd.as_fd());
        // criu main, the task stopped: its buffers, then RESUME.
        criu_main.resume_devices_late(me()).map_err(fail)?;
        restored.push(Restored { kfd, _half: half });
    }
    helper.check_resumed().map_err(|e| e.to_string())?;
    helper.wait_restored().map_err(|e| e.to_string())?;
    helper.finish_restore().map_err(|e| e.to_string())?;
    Ok(restored)
}

/// A restored render node is one of the task's (remapped) GPUs.
fn check_render_fd(m: &Machine, fd: BorrowedFd<'_>, path: &str, task: &TaskDevice) {
    let stat = nix::sys::stat::fstat(fd).unwrap();
    let kind = m.kernel.kfd(me()).kind_of(&stat);
    let Some(gpucr_amdgpu::DeviceKind::Render { minor }) = kind else {
        panic!("{path} came back as {kind:?}");
    };
    let topology = gpucr_topology::read_local(Some(&m.root)).unwrap();
    let gpu = topology
        .kfd_nodes
        .iter()
        .find(|n| n.prop("drm_render_minor") as u32 == minor)
        .unwrap()
        .gpu_id;
    assert!(task.gpus.contains(&GpuRef::Kfd(gpu)), "{path}: GPU {gpu}");
}

/// UPDATE_VMA_MAP gives each buffer's new offset: through a render node the task
/// holds for a render-node mapping, by reopening for a /dev/kfd one.
fn check_vmas(m: &Machine, half: &AmdgpuHalf, dumped: &Task, kfd: BorrowedFd<'_>) {
    let restored = m.kernel.bos(kfd);
    let dumped_bos = m.kernel.bos(dumped.fake.kfd.as_fd());
    for ((old, new), spec) in dumped_bos.iter().zip(&restored).zip(&dumped.bos) {
        let (addr, _, old_offset, mapped) = *old;
        assert_eq!(new.0, addr, "restored at the same VA");
        if !mapped {
            continue;
        }
        assert_eq!(half.update_vma(c"/dev/kfd", addr, old_offset + 1), None);
        if spec.alloc_flags & gpucr_abi::kfd::KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL != 0 {
            // Mapped through /dev/kfd: CRIU reopens it by path.
            assert_eq!(
                half.update_vma(c"/dev/kfd", addr, old_offset),
                Some((new.2, -1))
            );
            continue;
        }
        let (offset, fd) = half
            .update_vma(c"/dev/dri//renderD128", addr, old_offset)
            .expect("a restored buffer's mapping");
        assert_eq!(offset, new.2);
        assert!(fd >= 0);
        // SAFETY: UPDATE_VMA_MAP hands over a new descriptor CRIU would own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let stat = nix::sys::stat::fstat(fd.as_fd()).unwrap();
        assert!(matches!(
            m.kernel.kfd(me()).kind_of(&stat),
            Some(gpucr_amdgpu::DeviceKind::Render { .. })
        ));
    }
    // Every render-node file and mapping restored: no render fd is left in the task.
    assert_eq!(half.held_render_fds(), 0);
    assert_eq!(half.update_vma(c"/dev/null", restored[0].0, 0), None);
}

/// The restored task runs again: its dispatch increments the counter it was dumped
/// with, and every byte of its buffers is as it was.
fn check_restored(m: &Machine, task: &Task, index: usize, restored: &Restored) {
    let kfd = restored.kfd.as_fd();
    assert_eq!(m.kernel.queues(kfd), Some(Queues::Running));
    assert_eq!(m.kernel.dispatch(kfd).unwrap(), task.counter + 1);
    for (b, spec) in task.bos.iter().enumerate() {
        if !gpucr_abi::kfd::bo_has_contents(spec.alloc_flags) {
            continue;
        }
        for (at, len) in ranges(spec.size) {
            let got = m.kernel.read_bo(kfd, b, at, len);
            assert!(
                got == pattern(index, b, at, len),
                "task {index} buffer {b}: bytes {at}..+{len} differ after the restore"
            );
        }
    }
}

/// Dump `tasks`, check the dumped processes run again (UNPAUSE), restore, check.
fn round_trip(
    m: &Machine,
    tasks: &[&Task],
    map: &[(GpuRef, GpuRef)],
    parallel: bool,
) -> Vec<TaskDevice> {
    let dir = tempfile::tempdir().unwrap();
    let devices = dump(m, m.backend(Duration::from_secs(20)), tasks, dir.path()).unwrap();
    assert_eq!(devices.len(), tasks.len());
    for t in tasks {
        assert_eq!(m.kernel.queues(t.fake.kfd.as_fd()), Some(Queues::Running));
    }
    let restored = restore(
        m,
        m.backend(Duration::from_secs(20)),
        tasks,
        devices.clone(),
        dir.path(),
        map,
        parallel,
    )
    .unwrap();
    for (i, (t, r)) in tasks.iter().zip(&restored).enumerate() {
        check_restored(m, t, i, r);
    }
    devices
}

#[test]
fn one_gpu() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let m = Machine::new("mi50-2x");
    let gpu = m.gpus[0];
    let gtt = BoSpec {
        alloc_flags: gpucr_abi::kfd::KFD_IOC_ALLOC_MEM_FLAGS_GTT,
        ..BoSpec::vram(gpu, 3 * MIB + 4096)
    };
    let doorbell = BoSpec {
        alloc_flags: gpucr_abi::kfd::KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL,
        ..BoSpec::vram(gpu, 8192)
    };
    let unmapped = BoSpec {
        mapped: false,
        ..BoSpec::vram(gpu, 2 * MIB)
    };
    let t = spawn(
        &m,
        0,
        &[gpu],
        &[BoSpec::vram(gpu, 5 * MIB + 12), gtt, doorbell, unmapped],
    );
    let devices = round_trip(&m, &[&t], &[], true);
    let d = &devices[0];
    assert_eq!(d.gpus, [GpuRef::Kfd(gpu)]);
    assert_eq!(d.buffers.len(), 3, "the doorbell has no contents to copy");
    assert_eq!(
        d.device_files.iter().map(|f| f.role).collect::<Vec<_>>(),
        [DeviceRole::Device, DeviceRole::Render]
    );
    let log = m.kernel.log();
    let count = |op: &str| log.iter().filter(|l| l.starts_with(op)).count();
    assert_eq!(count("ProcessInfo"), 1);
    assert_eq!(count("Unpause"), 1, "{log:#?}");
    assert_eq!(count("Resume"), 1);
}

#[test]
fn four_gpus_with_xgmi_use_every_sdma_ring() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let m = Machine::new("mi100-4x-xgmi");
    assert_eq!(m.gpus.len(), 4);
    let bos: Vec<BoSpec> = m
        .gpus
        .iter()
        .flat_map(|&g| [BoSpec::vram(g, 6 * MIB + 100), BoSpec::vram(g, 2 * MIB)])
        .collect();
    let t = spawn(&m, 0, &m.gpus, &bos);
    round_trip(&m, &[&t], &[], true);
    let rings = m.kernel.ring_bytes();
    for &g in &m.gpus {
        for ring in 0..2 {
            let bytes = rings.get(&(g, ring)).copied().unwrap_or(0);
            assert!(bytes > 0, "GPU {g} ring {ring} copied nothing: {rings:?}");
        }
    }
}

/// A migration offers the destination only the GPUs whose render nodes the tree holds
/// open, read before anything is frozen.
#[test]
fn the_gpus_in_use_are_those_whose_render_nodes_the_tree_holds() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let m = Machine::new("mi100-4x-xgmi");
    let local = gpucr_topology::read_local(Some(&m.root)).unwrap();
    let backend = m.backend(Duration::from_secs(10));
    let first = spawn(&m, 0, &[m.gpus[1]], &[BoSpec::vram(m.gpus[1], MIB)]);
    let second = spawn(&m, 1, &[m.gpus[3]], &[BoSpec::vram(m.gpus[3], MIB)]);
    let used = backend.gpus_in_use(&[first.fake.pid, second.fake.pid], &local);
    // In gpu_id order.
    let mut want = vec![GpuRef::Kfd(m.gpus[1]), GpuRef::Kfd(m.gpus[3])];
    want.sort();
    assert_eq!(used, Some(want));
    // A tree holding no render node (this process holds the fakes' too): the backend
    // cannot tell.
    let mut bare = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let none = backend.gpus_in_use(&[bare.id() as i32], &local);
    let _ = bare.kill();
    let _ = bare.wait();
    assert_eq!(none, None);
}

#[test]
fn restore_onto_other_gpu_ids() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let m = Machine::new("mi100-4x-xgmi");
    let (a, b) = (m.gpus[0], m.gpus[1]);
    let (c, d) = (m.gpus[2], m.gpus[3]);
    let t = spawn(
        &m,
        0,
        &[a, b],
        &[BoSpec::vram(a, 3 * MIB), BoSpec::vram(b, MIB + 1)],
    );
    let map = [
        (GpuRef::Kfd(a), GpuRef::Kfd(c)),
        (GpuRef::Kfd(b), GpuRef::Kfd(d)),
    ];
    let dir = tempfile::tempdir().unwrap();
    let devices = dump(&m, m.backend(Duration::from_secs(20)), &[&t], dir.path()).unwrap();
    let restored = restore(
        &m,
        m.backend(Duration::from_secs(20)),
        &[&t],
        devices,
        dir.path(),
        &map,
        false,
    )
    .unwrap();
    check_restored(&m, &t, 0, &restored[0]);
    // The process keeps its gpu_ids and runs on the others.
    assert_eq!(m.kernel.devices(restored[0].kfd.as_fd()), [(a, c), (b, d)]);
    let rings = m.kernel.ring_bytes();
    assert!(rings.keys().any(|&(g, _)| g == c) && rings.keys().any(|&(g, _)| g == d));
}

#[test]
fn a_two_process_tree() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let m = Machine::new("mi50-2x");
    let (a, b) = (m.gpus[0], m.gpus[1]);
    let parent = spawn(&m, 0, &[a], &[BoSpec::vram(a, 2 * MIB + 3)]);
    let child = spawn(
        &m,
        1,
        &[a, b],
        &[BoSpec::vram(b, 4 * MIB), BoSpec::vram(a, 4096)],
    );
    let devices = round_trip(&m, &[&parent, &child], &[], true);
    assert_eq!(devices[0].ns_pid, parent.fake.pid as u32);
    assert_eq!(devices[1].ns_pid, child.fake.pid as u32);
}

#[test]
fn a_buffer_above_4_gib() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let m = Machine::new("mi50-2x");
    let gpu = m.gpus[0];
    // Sparse: only the checked ranges hold data.
    let t = spawn(
        &m,
        0,
        &[gpu],
        &[
            BoSpec::vram(gpu, 4096),
            BoSpec::vram(gpu, 4 * GIB + 6 * MIB + 4096),
        ],
    );
    let devices = round_trip(&m, &[&t], &[], true);
    assert_eq!(devices[0].buffers[1].size, 4 * GIB + 6 * MIB + 4096);
}

/// A one-GPU process with two buffers on a fresh fake machine.
fn small_machine() -> (Machine, Task) {
    let m = Machine::new("mi50-2x");
    let gpu = m.gpus[0];
    let t = spawn(
        &m,
        0,
        &[gpu],
        &[BoSpec::vram(gpu, 3 * MIB), BoSpec::vram(gpu, 64 * 1024)],
    );
    (m, t)
}

const SHORT: Duration = Duration::from_millis(300);

#[test]
fn a_failure_at_each_dump_step_leaves_the_queues_running() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let steps = [
        FakeOp::TaskKfd,
        FakeOp::ProcessInfo,
        FakeOp::Checkpoint,
        FakeOp::OpenRender,
        FakeOp::Userptr,
        FakeOp::CreateGtt,
        FakeOp::VaMap,
        FakeOp::Import,
        FakeOp::Submit,
        FakeOp::Wait,
    ];
    let plugin_half_ops = [FakeOp::TaskKfd, FakeOp::ProcessInfo, FakeOp::Checkpoint];
    for op in steps {
        let (m, t) = small_machine();
        m.kernel.fail_next(op, libc::EIO);
        let dir = tempfile::tempdir().unwrap();
        let err = dump(&m, m.backend(SHORT), &[&t], dir.path()).unwrap_err();
        assert!(err.contains(&format!("fake {op:?}")), "{op:?}: {err}");
        // KFD failing under the plugin half is the device's failure (gpucr exits 11
        // when CRIU fails because of it); the helper's own failures reach gpucr
        // directly.
        if plugin_half_ops.contains(&op) {
            assert!(err.starts_with("device error: "), "{op:?}: {err}");
        }
        assert_eq!(
            m.kernel.queues(t.fake.kfd.as_fd()),
            Some(Queues::Running),
            "{op:?}: the dumped process's queues must run again"
        );
        let paused = m.kernel.log().iter().any(|l| l.starts_with("ProcessInfo"));
        let unpaused = m
            .kernel
            .log()
            .iter()
            .filter(|l| l.starts_with("Unpause"))
            .count();
        assert_eq!(
            unpaused,
            usize::from(paused),
            "{op:?}: {:#?}",
            m.kernel.log()
        );
    }
    // A hung copy engine: the fence wait gives up with a clear error.
    let (m, t) = small_machine();
    m.kernel.stall_fences(true);
    let dir = tempfile::tempdir().unwrap();
    let err = dump(&m, m.backend(SHORT), &[&t], dir.path()).unwrap_err();
    assert!(err.contains("did not signal within 300ms"), "{err}");
    assert_eq!(m.kernel.queues(t.fake.kfd.as_fd()), Some(Queues::Running));
}

/// UNPAUSE failing at `exit(DUMP)`: the plugin half tells the helper, so the failure
/// reaches the user (`gpucr dump --leave-running` exits 10 with it) instead of staying
/// in CRIU's log.
#[test]
fn an_unpause_failure_after_the_dump_is_reported() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (m, t) = small_machine();
    m.kernel.fail_next(FakeOp::Unpause, libc::EIO);
    let dir = tempfile::tempdir().unwrap();
    let err = dump(&m, m.backend(SHORT), &[&t], dir.path()).unwrap_err();
    assert!(err.starts_with("after the dump: "), "{err}");
    assert!(err.contains("cannot unpause its GPU queues"), "{err}");
    assert!(err.contains("fake Unpause"), "{err}");
}

/// The helper gone in the middle of a dump (gpucr killed while it copies): the next
/// hook that needs it fails, CRIU gives up, and its `exit(DUMP)` hook, which needs no
/// helper, runs the queues again, once.
#[test]
fn a_helper_gone_mid_dump_leaves_the_queues_running() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (m, t) = small_machine();
    let dir = tempfile::tempdir().unwrap();
    let (helper_end, criu_end) = connector();
    let (events, timeline) = timeline_events(Arc::new(|_| {}));
    let writer = DumpWriter::start(dir.path(), TransferConfig::default(), events).unwrap();
    let helper = DumpHelper::start_dump(
        helper_end,
        m.backend(SHORT),
        writer,
        (dir.path().to_path_buf(), TransferConfig::default()),
        timeline,
        false,
        gpucr::helper::StepControl {
            device_timeout: Duration::from_secs(20),
            operation: gpucr::cancel::Cancel::new(),
        },
    )
    .unwrap();
    let half = Arc::new(AmdgpuHalf::new(m.kernel.kfd(me())));
    let mut plugin = run(stage::DUMP, &criu_end, half);
    plugin.pause_devices(t.fake.pid).unwrap();
    plugin.checkpoint_devices(t.fake.pid).unwrap();
    assert_eq!(m.kernel.queues(t.fake.kfd.as_fd()), Some(Queues::Paused));
    drop(helper);
    let err = plugin
        .dump_ext_file(t.fake.files[0].as_raw_fd(), file_id(0, 0))
        .map(|_| ())
        .unwrap_err();
    assert!(
        err.message.contains("the peer closed the connection"),
        "{}",
        err.message
    );
    assert_eq!(
        err.kind,
        gpucr_abi::PluginFailureKind::Plugin,
        "{}",
        err.message
    );
    plugin.exit(stage::DUMP, -1);
    assert_eq!(m.kernel.queues(t.fake.kfd.as_fd()), Some(Queues::Running));
    let unpaused = m
        .kernel
        .log()
        .iter()
        .filter(|l| l.starts_with("Unpause"))
        .count();
    assert_eq!(unpaused, 1, "{:#?}", m.kernel.log());
}

#[test]
fn a_failure_at_each_restore_step_leaves_nothing_running() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let steps = [
        FakeOp::OpenRender,
        FakeOp::Restore,
        FakeOp::Userptr,
        FakeOp::Import,
        FakeOp::Submit,
        FakeOp::Wait,
        FakeOp::Resume,
    ];
    let restored_running = |m: &Machine| {
        m.kernel
            .all_queues()
            .iter()
            .any(|&(pid, q)| pid == me() && q == Queues::Running)
    };
    for op in steps.into_iter().map(Some).chain([None]) {
        let (m, t) = small_machine();
        let dir = tempfile::tempdir().unwrap();
        let devices = dump(&m, m.backend(SHORT), &[&t], dir.path()).unwrap();
        match op {
            Some(op) => m.kernel.fail_next(op, libc::EIO),
            None => m.kernel.stall_fences(true),
        }
        let err = restore(&m, m.backend(SHORT), &[&t], devices, dir.path(), &[], false)
            .err()
            .unwrap_or_else(|| panic!("{op:?}: the restore went through"));
        match op {
            Some(op) => assert!(err.contains(&format!("fake {op:?}")), "{op:?}: {err}"),
            None => assert!(err.contains("did not signal within"), "{err}"),
        }
        if op.is_some_and(|op| [FakeOp::OpenRender, FakeOp::Restore, FakeOp::Resume].contains(&op))
        {
            assert!(err.starts_with("device error: "), "{op:?}: {err}");
        }
        assert!(!restored_running(&m), "{op:?}: a restored task runs");
        // The dumped process was left alone.
        assert_eq!(m.kernel.queues(t.fake.kfd.as_fd()), Some(Queues::Running));
    }
}

#[test]
fn a_restore_onto_a_gpu_the_machine_lacks_is_refused() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (m, t) = small_machine();
    let dir = tempfile::tempdir().unwrap();
    let devices = dump(&m, m.backend(SHORT), &[&t], dir.path()).unwrap();
    let map = [(GpuRef::Kfd(m.gpus[0]), GpuRef::Kfd(0xdead))];
    let err = restore(&m, m.backend(SHORT), &[&t], devices, dir.path(), &map, true)
        .err()
        .unwrap();
    assert!(err.contains("no GPU with this gpu_id"), "{err}");
    assert!(m.kernel.all_queues().iter().all(|&(pid, _)| pid != me()));
}

#[test]
fn copies_stay_on_the_rings_asked_for() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (m, t) = small_machine();
    let only_ring_1 = |m: &Machine| {
        let backend = AmdgpuBackend::new(
            m.kernel.kfd(me()),
            m.kernel.drm(),
            Some(m.root.clone()),
            SHORT,
        )
        .unwrap()
        .only_rings(vec![1]);
        Arc::new(backend)
    };
    let dir = tempfile::tempdir().unwrap();
    let devices = dump(&m, only_ring_1(&m), &[&t], dir.path()).unwrap();
    let restored = restore(&m, only_ring_1(&m), &[&t], devices, dir.path(), &[], true).unwrap();
    check_restored(&m, &t, 0, &restored[0]);
    let rings = m.kernel.ring_bytes();
    assert!(rings.keys().all(|&(_, ring)| ring == 1), "{rings:?}");
    assert!(rings.values().sum::<u64>() >= 2 * (3 * MIB + 64 * 1024));
}

#[test]
fn restore_writes_are_double_buffered() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // One buffer of three chunks: one writer thread.
    let m = Machine::new("mi50-2x");
    let gpu = m.gpus[0];
    let t = spawn(&m, 0, &[gpu], &[BoSpec::vram(gpu, 3 * MIB)]);
    let dir = tempfile::tempdir().unwrap();
    let devices = dump(&m, m.backend(SHORT), &[&t], dir.path()).unwrap();
    let restored = restore(&m, m.backend(SHORT), &[&t], devices, dir.path(), &[], false).unwrap();
    check_restored(&m, &t, 0, &restored[0]);
    // After KFD RESTORE, each write is submitted before the one before it is waited for.
    let log = m.kernel.log();
    let start = log.iter().position(|l| l.starts_with("Restore")).unwrap();
    let copies: Vec<&String> = log[start..]
        .iter()
        .filter(|l| l.starts_with("Submit") || l.starts_with("Wait"))
        .collect();
    assert_eq!(copies.len(), 6, "{copies:#?}");
    assert!(
        copies[0].starts_with("Submit") && copies[1].starts_with("Submit"),
        "the second write waited for the first: {copies:#?}"
    );
    assert!(copies[5].starts_with("Wait"), "{copies:#?}");
    let submits = copies.iter().filter(|l| l.starts_with("Submit")).count();
    let waits = copies.len() - submits;
    assert_eq!(submits, waits, "every write is waited for: {copies:#?}");
}
