//! Progress: the phase timestamps of a command, and a [`Reporter`] that shows them.
//!
//! The library records [`TimedEvent`]s as they happen (gpucr's steps and CRIU's
//! notifications) and hands each to the reporter it was given, with the warnings and
//! notes a user must see. The library draws nothing itself: [`Lines`] writes plain lines
//! to stderr (the default, and engine mode's), and the command line brings its own
//! terminal reporter (a spinner and a GPU byte bar).

use std::time::Instant;

use crate::image::manifest::TimedEvent;
use crate::transfer::{no_events, EventSink};

/// Where a command's progress goes: a terminal, a log, plain lines.
pub trait Reporter: Send {
    /// A step began, `at_ms` after the command started; `message` is for a person.
    fn step(&mut self, at_ms: f64, message: &str);
    /// A line the user must see (a warning or a note, already prefixed with "gpucr:").
    fn line(&self, text: &str);
    /// A sink for the transfer engine's events, to show the GPU bytes moved.
    fn transfer_events(&self) -> EventSink {
        no_events()
    }
    /// The command is over: clear what was drawn.
    fn finish(&mut self) {}
}

/// Plain lines on stderr: warnings and notes always, each step with `verbose`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Lines {
    pub verbose: bool,
}

/// The line a verbose reporter shows for a step `at_ms` into the command.
pub fn step_line(at_ms: f64, message: &str) -> String {
    format!("[{at_ms:>9.1} ms] {message}")
}

impl Reporter for Lines {
    fn step(&mut self, at_ms: f64, message: &str) {
        if self.verbose {
            self.line(&step_line(at_ms, message));
        }
    }
    fn line(&self, text: &str) {
        crate::errln!("{text}");
    }
}

/// Records when each phase began and passes it to its [`Reporter`].
pub struct Progress {
    start: Instant,
    reporter: Box<dyn Reporter>,
    events: Vec<TimedEvent>,
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Progress")
            .field("events", &self.events)
            .finish_non_exhaustive()
    }
}

impl Progress {
    /// Progress shown by `reporter`.
    pub fn new(reporter: Box<dyn Reporter>) -> Progress {
        Progress {
            start: Instant::now(),
            reporter,
            events: Vec::new(),
        }
    }

    /// Progress that shows only warnings and notes, as plain lines (tests, engine mode,
    /// library use).
    pub fn silent() -> Progress {
        Progress::new(Box::new(Lines { verbose: false }))
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
        self.reporter.step(at_ms, message);
    }

    /// A sink for the transfer engine's events (the reporter's GPU byte count).
    pub fn gpu_events(&self) -> EventSink {
        self.reporter.transfer_events()
    }

    /// Tell the user of something wrong that did not stop the command.
    pub fn warn(&self, text: &str) {
        self.reporter.line(&format!("gpucr: warning: {text}"));
    }

    /// Tell the user something they should know (not wrong).
    pub fn note(&self, text: &str) {
        self.reporter.line(&format!("gpucr: note: {text}"));
    }

    /// The events recorded so far.
    pub fn events(&self) -> &[TimedEvent] {
        &self.events
    }

    /// End the reporter and hand back the recorded events.
    pub fn finish(mut self) -> Vec<TimedEvent> {
        self.reporter.finish();
        std::mem::take(&mut self.events)
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

    /// A reporter that keeps what it was given.
    struct Recording(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

    impl Reporter for Recording {
        fn step(&mut self, _at_ms: f64, message: &str) {
            self.0.lock().unwrap().push(format!("step {message}"));
        }
        fn line(&self, text: &str) {
            self.0.lock().unwrap().push(text.to_owned());
        }
        fn finish(&mut self) {
            self.0.lock().unwrap().push("finished".into());
        }
    }

    #[test]
    fn every_step_warning_and_note_reaches_the_reporter_in_order() {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut p = Progress::new(Box::new(Recording(seen.clone())));
        p.event("start", "checking the target");
        p.warn("w");
        p.note("n");
        assert_eq!(p.finish().len(), 1);
        assert_eq!(
            *seen.lock().unwrap(),
            [
                "step checking the target",
                "gpucr: warning: w",
                "gpucr: note: n",
                "finished"
            ]
        );
    }
}
