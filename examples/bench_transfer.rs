//! Benchmark driver for the transfer engine (`scripts/bench-transfer.sh`).
//!
//! * `generate --out FILE [--compressible-mib N] [--random-mib N]`: write the benchmark's
//!   buffer contents to FILE (put it on tmpfs): first N MiB of text-like records (log
//!   lines with varying numbers, as zstd -1 compresses them about 3x), then N MiB of
//!   random bytes.
//! * `dump --input FILE --dir DIR [--buffers N] [--compress none|zstd:L] [--jobs N]
//!   [--chunk-size BYTES]`: split FILE into N equal buffers (file ranges read with
//!   pread, as the simulator's copy engine reads its tmpfs buffers), dump them with
//!   [`DumpWriter`] into DIR, and print the stats as one JSON line.
//! * `restore --dir DIR --out FILE [--jobs N] [--no-prefetch]`: restore every buffer of
//!   DIR into FILE (buffers back to back, in key order) and print the stats.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::thread;

use clap::{Parser, Subcommand};
use gpucr::transfer::{
    no_events, BufferKey, Compression, DumpWriter, FileRange, Restorer, TransferConfig,
    TransferError,
};

#[derive(Parser)]
#[command(about = "Benchmark driver for gpucr's transfer engine")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write the benchmark input: compressible records, then random bytes.
    Generate {
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 2048)]
        compressible_mib: u64,
        #[arg(long, default_value_t = 2048)]
        random_mib: u64,
    },
    /// Dump FILE, split into buffers, into DIR/gpu.
    Dump {
        #[arg(long)]
        input: PathBuf,
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 16)]
        buffers: u64,
        #[arg(long, default_value = "zstd:1")]
        compress: Compression,
        #[arg(long)]
        jobs: Option<usize>,
        #[arg(long)]
        chunk_size: Option<usize>,
    },
    /// Restore DIR/gpu into FILE.
    Restore {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        jobs: Option<usize>,
        #[arg(long)]
        no_prefetch: bool,
    },
}

#[derive(Debug, thiserror::Error)]
enum BenchError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Transfer(#[from] TransferError),
    #[error("{0}")]
    Json(#[from] serde_json::Error),
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match args.command {
        Command::Generate {
            out,
            compressible_mib,
            random_mib,
        } => generate(&out, compressible_mib << 20, random_mib << 20),
        Command::Dump {
            input,
            dir,
            buffers,
            compress,
            jobs,
            chunk_size,
        } => dump(&input, &dir, buffers, config(compress, jobs, chunk_size)),
        Command::Restore {
            dir,
            out,
            jobs,
            no_prefetch,
        } => restore(
            &dir,
            &out,
            config(Compression::None, jobs, None),
            !no_prefetch,
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_transfer: {e}");
            ExitCode::FAILURE
        }
    }
}

fn config(
    compression: Compression,
    jobs: Option<usize>,
    chunk_size: Option<usize>,
) -> TransferConfig {
    let d = TransferConfig::default();
    TransferConfig {
        jobs: jobs.unwrap_or(d.jobs),
        chunk_size: chunk_size.unwrap_or(d.chunk_size),
        compression,
        ..d
    }
}

/// xorshift64*: fast, deterministic, good enough to defeat any compressor.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

const BLOCK: u64 = 8 << 20;

/// One block of log-like records: fixed field names, varying numbers.
fn records(block: u64, len: usize) -> Vec<u8> {
    const NAMES: &[&str] = &["loss", "grad_norm", "lr", "tokens", "step_ms", "mem_mib"];
    let mut rng = Rng(block.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut out = Vec::with_capacity(len + 256);
    let mut step = block * 10_000;
    while out.len() < len {
        step += 1;
        let _ = write!(out, "step={step} rank={} ", rng.next() % 8);
        for name in NAMES {
            let r = rng.next();
            let _ = write!(out, "{name}={}.{:04} ", (r >> 40) % 100, r % 10_000);
        }
        out.push(b'\n');
    }
    out.truncate(len);
    out
}

fn random_block(block: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng(block.wrapping_mul(0xD1B5_4A32_D192_ED03) | 1);
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        out.extend_from_slice(&rng.next().to_le_bytes());
    }
    out.truncate(len);
    out
}

fn generate(out: &Path, compressible: u64, random: u64) -> Result<(), BenchError> {
    let file = File::create(out)?;
    file.set_len(compressible + random)?;
    let threads = thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let blocks = (compressible + random).div_ceil(BLOCK);
    thread::scope(|s| -> Result<(), BenchError> {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let file = &file;
                s.spawn(move || -> io::Result<()> {
                    for b in (t..blocks).step_by(threads as usize) {
                        let start = b * BLOCK;
                        let (data, end) = if start < compressible {
                            let end = (start + BLOCK).min(compressible);
                            (records(b, (end - start) as usize), end)
                        } else {
                            let end = (start + BLOCK).min(compressible + random);
                            (random_block(b, (end - start) as usize), end)
                        };
                        debug_assert_eq!(end - start, data.len() as u64);
                        std::os::unix::fs::FileExt::write_all_at(file, &data, start)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().expect("generator thread")?;
        }
        Ok(())
    })
}

fn dump(input: &Path, dir: &Path, buffers: u64, cfg: TransferConfig) -> Result<(), BenchError> {
    let size = File::open(input)?.metadata()?.len();
    let per = size.div_ceil(buffers.max(1));
    let writer = DumpWriter::start(dir, cfg, no_events())?;
    for b in 0..buffers {
        let start = b * per;
        let len = per.min(size.saturating_sub(start));
        let range = FileRange::new(File::open(input)?, start, len);
        writer.add(BufferKey::new(1, b as u32), Box::new(range))?;
    }
    let stats = writer.finish()?;
    println!("{}", serde_json::to_string(&stats)?);
    Ok(())
}

fn restore(dir: &Path, out: &Path, cfg: TransferConfig, prefetch: bool) -> Result<(), BenchError> {
    // One copy queue per job, as one copy engine per GPU would be.
    let queues = cfg.jobs as u32;
    let restorer = Restorer::open(dir, cfg, prefetch, no_events())?;
    let buffers = restorer.buffers();
    let total: u64 = buffers.iter().map(|(_, len)| len).sum();
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(out)?;
    file.set_len(total)?;
    let mut at = 0;
    let mut keys = Vec::new();
    for (key, len) in buffers {
        let range = FileRange::new(file.try_clone()?, at, len)
            .starting_zeroed()
            .on_queue(key.buffer % queues);
        restorer.attach(key, Box::new(range))?;
        keys.push(key);
        at += len;
    }
    restorer.wait(&keys)?;
    let stats = restorer.finish()?;
    let mut stdout = BufWriter::new(io::stdout().lock());
    writeln!(stdout, "{}", serde_json::to_string(&stats)?)?;
    Ok(())
}
