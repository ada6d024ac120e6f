//! The helper's clock and progress: each task's copy times for the manifest, and the
//! count of bytes moved that keeps a copying request within `--device-timeout`
//! ([`super::control::Handler::progress`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::gpu::TaskTiming;
use crate::transfer::{BufferKey, Event, EventSink};

/// Per-task progress, fed by the transfer engine's events.
#[derive(Debug, Default)]
pub struct Timeline {
    started: Option<Instant>,
    /// Each task's timing and how many of its buffers are still moving.
    pub(super) tasks: BTreeMap<u32, (TaskTiming, usize)>,
    /// Grows with every progress report of the transfer engines (the writer's, the
    /// restorer's, a refill's): what keeps a copying request within `--device-timeout`.
    pub(super) moved: Arc<AtomicU64>,
}

impl Timeline {
    /// Milliseconds since the helper started.
    pub(super) fn ms(&self) -> f64 {
        self.started
            .map(|s| s.elapsed().as_secs_f64() * 1e3)
            .unwrap_or(0.0)
    }

    /// Task `ns_pid`'s `buffers` (of `bytes` in all) start moving.
    pub(super) fn begin(&mut self, ns_pid: u32, buffers: usize, bytes: u64) {
        let at = self.ms();
        let entry = self.tasks.entry(ns_pid).or_insert_with(|| {
            (
                TaskTiming {
                    ns_pid,
                    ..Default::default()
                },
                0,
            )
        });
        entry.0.start_ms.get_or_insert(at);
        entry.0.bytes += bytes;
        entry.1 += buffers;
        if entry.1 == 0 {
            entry.0.end_ms.get_or_insert(at);
        }
    }

    fn buffer_done(&mut self, key: BufferKey) {
        let at = self.ms();
        if let Some((timing, remaining)) = self.tasks.get_mut(&key.task) {
            *remaining = remaining.saturating_sub(1);
            if *remaining == 0 {
                timing.end_ms = Some(at);
            }
        }
    }
}

/// The event sink that keeps a timeline, plus an extra consumer (progress display).
pub fn timeline_events(extra: EventSink) -> (EventSink, Arc<Mutex<Timeline>>) {
    let moved = Arc::new(AtomicU64::new(0));
    let timeline = Arc::new(Mutex::new(Timeline {
        started: Some(Instant::now()),
        moved: moved.clone(),
        ..Default::default()
    }));
    let t = timeline.clone();
    let sink = counting(
        moved,
        Arc::new(move |event| {
            if let Event::BufferDone(key) = event {
                t.lock().unwrap_or_else(|e| e.into_inner()).buffer_done(key);
            }
            extra(event);
        }),
    );
    (sink, timeline)
}

/// `then`, after counting each [`Event::Bytes`] (bytes moved) into `moved`.
pub(super) fn counting(moved: Arc<AtomicU64>, then: EventSink) -> EventSink {
    Arc::new(move |event| {
        if let Event::Bytes { .. } = event {
            moved.fetch_add(1, Ordering::Relaxed);
        }
        then(event);
    })
}
