//! A small CUDA application for the fake library's tests (it runs on a real driver too):
//! allocates buffers round-robin over the GPUs, fills them deterministically, then answers
//! one command per stdin line with one stdout line.
//!
//! Options: `--sizes B,B,...` (bytes of each buffer; default 4096,65553,1048576,300000).
//! Commands: `verify` (`ok`, or `bad <buffer> <offset>`), `rewrite <seed>` (`ok`),
//! `uuids` (`uuids <uuid>...`, by ordinal), `sync` (starts `cuCtxSynchronize` on another
//! thread: `started`), `exit`. A failure answers `error <message>`; at start-up it also
//! ends the process with status 1.

use std::io::{BufRead, Write};
use std::process::exit;

use gpucr_cuda_driver::{Context, DevicePtr, Driver, Error};

struct Buffer {
    context: Context,
    ptr: DevicePtr,
    size: usize,
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The content of buffer `index` for `seed`.
fn content(seed: u64, index: usize, size: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(size + 8);
    let mut word = 0u64;
    while out.len() < size {
        let x = splitmix(seed ^ (index as u64).wrapping_mul(0x1000_0000_01B3) ^ word);
        out.extend_from_slice(&x.to_le_bytes());
        word += 1;
    }
    out.truncate(size);
    out
}

fn setup(driver: &Driver, sizes: &[usize]) -> Result<Vec<Buffer>, Error> {
    let count = driver.device_count()?;
    let contexts = (0..count)
        .map(|i| driver.primary_ctx_retain(driver.device_get(i)?))
        .collect::<Result<Vec<_>, _>>()?;
    let mut buffers = Vec::new();
    for (i, size) in sizes.iter().enumerate() {
        let context = contexts[i % count.max(1)];
        driver.ctx_set_current(context)?;
        let ptr = driver.mem_alloc(*size)?;
        buffers.push(Buffer {
            context,
            ptr,
            size: *size,
        });
    }
    Ok(buffers)
}

fn fill(driver: &Driver, buffers: &[Buffer], seed: u64) -> Result<(), Error> {
    for (i, b) in buffers.iter().enumerate() {
        driver.ctx_set_current(b.context)?;
        driver.memcpy_htod(b.ptr, &content(seed, i, b.size))?;
    }
    Ok(())
}

fn verify(driver: &Driver, buffers: &[Buffer], seed: u64) -> Result<String, Error> {
    for (i, b) in buffers.iter().enumerate() {
        driver.ctx_set_current(b.context)?;
        let mut actual = vec![0u8; b.size];
        driver.memcpy_dtoh(&mut actual, b.ptr)?;
        let expected = content(seed, i, b.size);
        if let Some(at) = actual.iter().zip(&expected).position(|(a, e)| a != e) {
            return Ok(format!("bad {i} {at}"));
        }
    }
    Ok("ok".into())
}

fn main() {
    let mut sizes = vec![4096, 65553, 1 << 20, 300_000];
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--sizes", Some(v)) => {
                sizes = v
                    .split(',')
                    .map(|s| {
                        s.parse()
                            .unwrap_or_else(|_| fail(&format!("bad size {s:?}")))
                    })
                    .collect()
            }
            _ => fail(&format!("unknown argument {arg}")),
        }
    }
    let driver = std::sync::Arc::new(Driver::load().unwrap_or_else(|e| fail(&e.to_string())));
    let buffers = setup(&driver, &sizes).unwrap_or_else(|e| fail(&e.to_string()));
    let mut seed = 1;
    fill(&driver, &buffers, seed).unwrap_or_else(|e| fail(&e.to_string()));
    say(&format!("ready {}", buffers.len()));
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        let reply = match words.as_slice() {
            ["verify"] => verify(&driver, &buffers, seed),
            ["rewrite", s] => match s.parse() {
                Ok(s) => {
                    seed = s;
                    fill(&driver, &buffers, seed).map(|()| "ok".into())
                }
                Err(_) => Ok(format!("error bad seed {s:?}")),
            },
            ["uuids"] => (0..driver.device_count().unwrap_or(0))
                .map(|i| driver.device_uuid(driver.device_get(i)?))
                .collect::<Result<Vec<_>, _>>()
                .map(|u| {
                    let u: Vec<String> = u.iter().map(ToString::to_string).collect();
                    format!("uuids {}", u.join(" "))
                }),
            ["sync"] => {
                let (driver, context) = (driver.clone(), buffers[0].context);
                std::thread::spawn(move || {
                    let _ = driver
                        .ctx_set_current(context)
                        .and_then(|()| driver.ctx_synchronize());
                });
                Ok("started".into())
            }
            ["exit"] => exit(0),
            _ => Ok(format!("error unknown command {line:?}")),
        };
        say(&reply.unwrap_or_else(|e| format!("error {e}")));
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn fail(msg: &str) -> ! {
    say(&format!("error {msg}"));
    exit(1)
}
