//! The fake CUDA driver (`gpucr-fake-cuda`, loaded through `GPUCR_CUDA_LIBRARY` by the
//! workload and by gpucr alike): its library, a temporary directory for the device
//! memory it keeps, and the environment that points at both.

use std::fs;
use std::path::PathBuf;

use super::gpucr_bin;

/// A temporary fake-driver directory and the environment that points at it.
pub struct FakeCuda {
    pub dir: tempfile::TempDir,
    pub library: PathBuf,
}

impl FakeCuda {
    pub fn new() -> FakeCuda {
        let library = gpucr_bin().parent().unwrap().join("libgpucr_fake_cuda.so");
        assert!(
            library.exists(),
            "{} is missing: run `cargo build --workspace --lib`",
            library.display()
        );
        FakeCuda {
            dir: tempfile::tempdir().unwrap(),
            library,
        }
    }

    pub fn env(&self) -> Vec<(&str, &str)> {
        vec![
            ("GPUCR_CUDA_LIBRARY", self.library.to_str().unwrap()),
            ("GPUCR_FAKE_CUDA_DIR", self.dir.path().to_str().unwrap()),
            ("GPUCR_FAKE_CUDA_GPUS", "2"),
        ]
    }

    /// Every process's device-memory files (`CTX/mem-<uuid>`).
    pub fn device_memory_files(&self) -> Vec<PathBuf> {
        fs::read_dir(self.dir.path())
            .unwrap()
            .flatten()
            .filter_map(|ctx| fs::read_dir(ctx.path()).ok())
            .flat_map(|files| files.flatten())
            .filter(|f| f.file_name().to_string_lossy().starts_with("mem-"))
            .map(|f| f.path())
            .collect()
    }

    /// Delete every process's device memory, as a dead process's is on a real GPU.
    pub fn wipe_device_memory(&self) -> usize {
        let files = self.device_memory_files();
        for file in &files {
            fs::remove_file(file).unwrap();
        }
        files.len()
    }
}
