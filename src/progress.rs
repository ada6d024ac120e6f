//! Progress: a spinner with CRIU's current phase on a terminal, and phase timestamps.
//!
//! The core records [`TimedEvent`]s as they happen (gpucr's steps and CRIU's
//! notifications); the [`Progress`] reporter shows them. It draws on stderr only when
//! both stdout and stderr are terminals and `--json` is off, so scripts and pipes see
//! nothing but the result.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::image::manifest::TimedEvent;

/// Shows progress and records when each phase began.
#[derive(Debug)]
pub struct Progress {
    start: Instant,
    bar: Option<ProgressBar>,
    verbose: bool,
    events: Vec<TimedEvent>,
}

impl Progress {
    /// A reporter that draws only where a person is watching.
    pub fn new(json: bool, verbose: bool) -> Progress {
        let interactive =
            !json && std::io::stdout().is_terminal() && std::io::stderr().is_terminal();
        Self::with_display(interactive, verbose && !json)
    }

    /// A reporter that never draws (tests, library use).
    pub fn silent() -> Progress {
        Self::with_display(false, false)
    }

    fn with_display(spinner: bool, verbose: bool) -> Progress {
        let bar = spinner.then(|| {
            let bar = ProgressBar::new_spinner();
            bar.set_style(
                ProgressStyle::with_template("{spinner} {elapsed_precise} {msg}")
                    .expect("template is valid"),
            );
            bar.enable_steady_tick(Duration::from_millis(100));
            bar
        });
        Progress {
            start: Instant::now(),
            bar,
            verbose,
            events: Vec::new(),
        }
    }

    /// Milliseconds since the command started.
    pub fn elapsed_ms(&self) -> f64 {
        self.start.elapsed().as_secs_f64() * 1e3
    }

    /// Record an event (a gpucr step or a CRIU notification) and show it.
    pub fn event(&mut self, name: &str, message: &str) {
        let at_ms = self.elapsed_ms();
        self.events.push(TimedEvent {
            name: name.to_owned(),
            at_ms,
        });
        if let Some(bar) = &self.bar {
            bar.set_message(message.to_owned());
        }
        if self.verbose {
            self.println(&format!("[{:>9.1} ms] {message}", at_ms));
        }
    }

    /// A sink for the transfer engine's events: a bar of GPU bytes under the spinner on
    /// a terminal, nothing otherwise.
    pub fn gpu_events(&self) -> crate::transfer::EventSink {
        let Some(spinner) = &self.bar else {
            return crate::transfer::no_events();
        };
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template(
                "  GPU memory {bar:30} {bytes}/{total_bytes} {bytes_per_sec}",
            )
            .expect("template is valid"),
        );
        let multi = indicatif::MultiProgress::new();
        let spinner = multi.add(spinner.clone());
        spinner.tick();
        let bar = multi.add(bar);
        std::sync::Arc::new(move |event| {
            if let crate::transfer::Event::Bytes { done, total } = event {
                bar.set_length(total);
                bar.set_position(done);
                if done >= total {
                    bar.finish_and_clear();
                }
            }
        })
    }

    /// Print a warning without tearing the spinner.
    pub fn warn(&self, text: &str) {
        self.println(&format!("gpucr: warning: {text}"));
    }

    /// Print a note (something the user should know, not wrong) without tearing the
    /// spinner.
    pub fn note(&self, text: &str) {
        self.println(&format!("gpucr: note: {text}"));
    }

    /// The events recorded so far.
    pub fn events(&self) -> &[TimedEvent] {
        &self.events
    }

    /// Stop the spinner and hand back the recorded events.
    pub fn finish(mut self) -> Vec<TimedEvent> {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        std::mem::take(&mut self.events)
    }

    fn println(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.suspend(|| crate::errln!("{line}")),
            None => crate::errln!("{line}"),
        }
    }
}

/// Spans between consecutive events: `(from, to, milliseconds)`.
pub fn spans(events: &[TimedEvent]) -> Vec<(String, String, f64)> {
    events
        .windows(2)
        .map(|w| {
            (
                w[0].name.clone(),
                w[1].name.clone(),
                w[1].at_ms - w[0].at_ms,
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_ordered_and_spans_follow() {
        let mut p = Progress::silent();
        p.event("a", "first");
        p.event("b", "second");
        let events = p.finish();
        assert_eq!(events.len(), 2);
        assert!(events[1].at_ms >= events[0].at_ms);
        let s = spans(&events);
        assert_eq!(s.len(), 1);
        assert_eq!((s[0].0.as_str(), s[0].1.as_str()), ("a", "b"));
    }
}
