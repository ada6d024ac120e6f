//! A workload that answers requests: a small TCP server holding N MiB of anonymous
//! memory, each request touching a small hot set of it. What "time to ready" means for a
//! restored inference replica: how soon after the restore starts the first answer comes,
//! and whether every byte came back.
//!
//! Run it as the init of its own PID namespace:
//!
//! ```text
//! unshare --pid --fork setsid serve_memory --state DIR --memory-mib 1024 [--hot-mib 8]
//!     [--listen 127.0.0.1:0]
//! ```
//!
//! It fills its memory with a pattern known from each 4 KiB page's index, listens, writes
//! the address it listens on to `DIR/address` and then creates `DIR/ready`. Each
//! connection sends lines and gets one line back for each:
//!
//! * `hot` — reads the hot set (`--hot-mib` MiB in the middle of the region, one word in
//!   each 4 KiB page of it: what a request of a served model touches, the rest being
//!   memory it holds for other requests), checks every word against the pattern, and
//!   answers `ok N` with the number of requests answered so far, or `BAD page P` for the
//!   first page that does not hold its pattern;
//! * `all` — checks one word of every page of the region: `ok PAGES` or `BAD page P`;
//! * `quit` — ends the connection.
//!
//! The request counter lives in the server's memory, so it carries over a checkpoint.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::exit;

const PAGE: usize = 4096;
const SEED: u64 = 0x9E37_79B9_7F4A_7C15;

struct Options {
    state: PathBuf,
    memory_mib: usize,
    hot_mib: usize,
    listen: String,
}

fn usage(problem: &str) -> ! {
    eprintln!("serve_memory: {problem}");
    eprintln!(
        "usage: serve_memory --state DIR [--memory-mib N] [--hot-mib N] [--listen ADDR:PORT]"
    );
    exit(2);
}

fn options() -> Options {
    let mut opts = Options {
        state: PathBuf::new(),
        memory_mib: 256,
        hot_mib: 8,
        listen: "127.0.0.1:0".into(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .unwrap_or_else(|| usage(&format!("{flag} needs a value")));
        let number = |v: &str| {
            v.parse::<usize>()
                .unwrap_or_else(|_| usage(&format!("{flag}: not a number: {v}")))
        };
        match flag.as_str() {
            "--state" => opts.state = PathBuf::from(value),
            "--memory-mib" => opts.memory_mib = number(&value),
            "--hot-mib" => opts.hot_mib = number(&value),
            "--listen" => opts.listen = value,
            _ => usage(&format!("unknown option {flag}")),
        }
    }
    if opts.state.as_os_str().is_empty() {
        usage("--state is required");
    }
    if opts.memory_mib == 0 || opts.hot_mib == 0 || opts.hot_mib > opts.memory_mib {
        usage("--memory-mib and --hot-mib must be positive, the hot set no larger");
    }
    opts
}

/// The word page `page` holds at its start (and, shifted, at every 8 bytes).
fn pattern(page: usize) -> u64 {
    (page as u64 + 1).wrapping_mul(SEED)
}

/// The server's memory and its request counter.
struct Memory {
    words: Vec<u64>,
    pages: usize,
    hot_pages: usize,
    answered: u64,
}

impl Memory {
    fn new(memory_mib: usize, hot_mib: usize) -> Memory {
        let pages = memory_mib * 1024 * 1024 / PAGE;
        let per_page = PAGE / 8;
        let mut words = vec![0u64; pages * per_page];
        for (page, chunk) in words.chunks_exact_mut(per_page).enumerate() {
            let p = pattern(page);
            for (i, w) in chunk.iter_mut().enumerate() {
                *w = p.rotate_left(i as u32 % 64);
            }
        }
        Memory {
            words,
            pages,
            hot_pages: hot_mib * 1024 * 1024 / PAGE,
            answered: 0,
        }
    }

    /// The first of `pages` whose first word is not its pattern.
    fn check(&self, pages: impl Iterator<Item = usize>) -> Result<usize, usize> {
        let per_page = PAGE / 8;
        let mut seen = 0;
        for page in pages {
            if self.words[page * per_page] != pattern(page) {
                return Err(page);
            }
            seen += 1;
        }
        Ok(seen)
    }

    fn answer(&mut self, request: &str) -> Option<String> {
        let first_hot = (self.pages - self.hot_pages) / 2;
        let checked = match request {
            "hot" => self.check(first_hot..first_hot + self.hot_pages),
            "all" => self.check(0..self.pages),
            "quit" => return None,
            other => return Some(format!("unknown request {other:?}")),
        };
        Some(match checked {
            Ok(seen) => {
                self.answered += 1;
                match request {
                    "hot" => format!("ok {}", self.answered),
                    _ => format!("ok {seen}"),
                }
            }
            Err(page) => format!("BAD page {page}"),
        })
    }
}

fn serve(memory: &mut Memory, stream: TcpStream) -> std::io::Result<()> {
    let mut out = stream.try_clone()?;
    for line in BufReader::new(stream).lines() {
        match memory.answer(line?.trim()) {
            Some(reply) => writeln!(out, "{reply}")?,
            None => break,
        }
    }
    Ok(())
}

fn main() {
    let opts = options();
    let mut memory = Memory::new(opts.memory_mib, opts.hot_mib);
    let listener = TcpListener::bind(&opts.listen).unwrap_or_else(|e| {
        eprintln!("serve_memory: cannot listen on {}: {e}", opts.listen);
        exit(1);
    });
    let address = listener.local_addr().expect("the listening address");
    let write = |name: &str, text: String| {
        if let Err(e) = fs::write(opts.state.join(name), text) {
            eprintln!(
                "serve_memory: cannot write {}: {e}",
                opts.state.join(name).display()
            );
            exit(1);
        }
    };
    write("address", format!("{address}\n"));
    write("ready", String::new());
    // One connection at a time: the requests are short, and the answer's timing is
    // what is measured.
    for stream in listener.incoming() {
        match stream {
            Ok(stream) => {
                if let Err(e) = serve(&mut memory, stream) {
                    eprintln!("serve_memory: connection: {e}");
                }
            }
            Err(e) => eprintln!("serve_memory: accept: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hot_set_and_the_whole_region_check_and_a_changed_page_is_named() {
        let mut m = Memory::new(4, 1);
        assert_eq!(m.answer("hot").as_deref(), Some("ok 1"));
        assert_eq!(m.answer("all").as_deref(), Some("ok 1024"));
        assert_eq!(m.answer("hot").as_deref(), Some("ok 3"));
        m.words[5 * PAGE / 8] ^= 1;
        assert_eq!(
            m.answer("hot").as_deref(),
            Some("ok 4"),
            "page 5 is not hot"
        );
        assert_eq!(m.answer("all").as_deref(), Some("BAD page 5"));
        // The hot set is the middle MiB: pages 384 to 639 of 1024.
        m.words[400 * PAGE / 8] ^= 1;
        assert_eq!(m.answer("hot").as_deref(), Some("BAD page 400"));
        assert_eq!(m.answer("quit"), None);
    }
}
