//! The helper's clock and progress: each task's copy times for the manifest, and the
//! count of bytes moved that keeps a copying request within `--device-timeout`
//! ([`super::control::Handler::progress`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::gpu::TaskTiming;
use crate::transfer::{no_events, BufferKey, Event, EventSink};

/// Per-task progress, fed by the transfer engine's events.
#[derive(Debug, Default)]
pub struct Timeline {
    started: Option<Instant>,
    /// Each task's timing and how many of its buffers are still moving.
    pub(super) tasks: BTreeMap<u32, (TaskTiming, usize)>,
    /// Grows with every byte the transfer engines move (the writer's, the restorer's,
    /// a refill's): what keeps a copying request within `--device-timeout`.
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
    let timeline = Arc::new(Mutex::new(Timeline {
        started: Some(Instant::now()),
        ..Default::default()
    }));
    let t = timeline.clone();
    let moved = counting(
        timeline
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .moved
            .clone(),
        no_events(),
    );
    let sink: EventSink = Arc::new(move |event| {
        match event {
            Event::BufferDone(key) => t.lock().unwrap_or_else(|e| e.into_inner()).buffer_done(key),
            Event::Bytes { .. } => moved(event),
        }
        extra(event);
    });
    (sink, timeline)
}

/// `then`, after counting the bytes each [`Event::Bytes`] says moved into `moved`.
pub(super) fn counting(moved: Arc<AtomicU64>, then: EventSink) -> EventSink {
    let last = AtomicU64::new(0);
    Arc::new(move |event| {
        if let Event::Bytes { done, .. } = event {
            let before = last.swap(done, Ordering::Relaxed);
            moved.fetch_add(done.saturating_sub(before).max(1), Ordering::Relaxed);
        }
        then(event);
    })
}
