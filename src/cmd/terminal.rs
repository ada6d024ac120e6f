//! The command line's progress reporter: a spinner with CRIU's current phase and a bar
//! of GPU bytes, on stderr, only when both stdout and stderr are terminals and `--json`
//! is off, so that scripts and pipes see nothing but the result.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use crate::progress::{step_line, Lines, Progress, Reporter};
use crate::transfer::{no_events, Event, EventSink};

/// Progress for a command: drawn on a terminal where a person is watching, plain lines
/// (each step with `verbose`) otherwise.
pub fn progress(json: bool, verbose: bool) -> Progress {
    let interactive = !json && std::io::stdout().is_terminal() && std::io::stderr().is_terminal();
    let verbose = verbose && !json;
    if interactive {
        Progress::new(Box::new(Terminal::start(verbose)))
    } else {
        Progress::new(Box::new(Lines { verbose }))
    }
}

/// A spinner showing the current step; lines printed above it.
struct Terminal {
    spinner: ProgressBar,
    verbose: bool,
}

impl Terminal {
    fn start(verbose: bool) -> Terminal {
        let spinner = ProgressBar::new_spinner();
        spinner.set_style(
            ProgressStyle::with_template("{spinner} {elapsed_precise} {msg}")
                .expect("template is valid"),
        );
        spinner.enable_steady_tick(Duration::from_millis(100));
        Terminal { spinner, verbose }
    }
}

impl Reporter for Terminal {
    fn step(&mut self, at_ms: f64, message: &str) {
        self.spinner.set_message(message.to_owned());
        if self.verbose {
            self.line(&step_line(at_ms, message));
        }
    }

    fn line(&self, text: &str) {
        self.spinner.suspend(|| crate::errln!("{text}"));
    }

    /// A bar of GPU bytes under the spinner.
    fn transfer_events(&self) -> EventSink {
        if self.spinner.is_finished() {
            return no_events();
        }
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template(
                "  GPU memory {bar:30} {bytes}/{total_bytes} {bytes_per_sec}",
            )
            .expect("template is valid"),
        );
        let multi = MultiProgress::new();
        let spinner = multi.add(self.spinner.clone());
        spinner.tick();
        let bar = multi.add(bar);
        Arc::new(move |event| {
            if let Event::Bytes { done, total } = event {
                bar.set_length(total);
                bar.set_position(done);
                if done >= total {
                    bar.finish_and_clear();
                }
            }
        })
    }

    fn finish(&mut self) {
        self.spinner.finish_and_clear();
    }
}
