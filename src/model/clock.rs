//! A time split of a stretch of work (a training step, a decode step) by phase, layer kind and
//! op: a clock installed on this thread takes a mark after each op, and the time between two
//! marks is the later mark's. On the CPU a mark is the wall clock; on a GPU it is a CUDA event
//! recorded on candle's stream, so a split is the device's time, read once when the clock stops
//! (one synchronisation for the whole stretch). Where the host cannot launch fast enough, the
//! device waits between the ops, and that wait is the time of the op the host was launching:
//! a split says where the step's time goes, whichever side is the bound.
//!
//! Marks come from the counting wrapper (`layer_ops::Counts::add`) and from the few
//! places outside the ops that bracket work of their own (an attention backward inside candle's
//! backward pass, the optimizer). With no clock installed, a mark is one thread-local read.
//! Knows nothing of what the ops compute.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::Instant;

use candle_core::{Device, Result};

use super::config::LayerKind;

/// One mark's time.
enum Stamp {
    Wall(Instant),
    #[cfg(feature = "cuda")]
    Event(candle_core::cuda_backend::cudarc::driver::CudaEvent),
}

/// What a mark closes: the phase, the layer kind (`None` outside the layers) and the op.
type Key = (&'static str, Option<LayerKind>, &'static str);

struct Clock {
    dev: Device,
    phase: &'static str,
    /// The layer kind of the last mark.
    kind: Option<LayerKind>,
    start: Instant,
    /// The first stamp, then one per mark with the key of the work it closes.
    first: Stamp,
    marks: Vec<(Key, Stamp)>,
}

thread_local! {
    static CLOCK: RefCell<Option<Clock>> = const { RefCell::new(None) };
}

fn stamp(dev: &Device) -> Result<Stamp> {
    match dev {
        #[cfg(feature = "cuda")]
        Device::Cuda(c) => {
            use candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags;
            let e = c
                .cuda_stream()
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| candle_core::Error::Msg(format!("CUDA event: {e:?}")))?;
            Ok(Stamp::Event(e))
        }
        _ => Ok(Stamp::Wall(Instant::now())),
    }
}

/// Seconds from `a` to `b` (both recorded and, on a GPU, complete).
fn between(a: &Stamp, b: &Stamp) -> Result<f64> {
    match (a, b) {
        (Stamp::Wall(a), Stamp::Wall(b)) => Ok(b.duration_since(*a).as_secs_f64()),
        #[cfg(feature = "cuda")]
        (Stamp::Event(a), Stamp::Event(b)) => a
            .elapsed_ms(b)
            .map(|ms| f64::from(ms) / 1e3)
            .map_err(|e| candle_core::Error::Msg(format!("CUDA event: {e:?}"))),
        #[cfg(feature = "cuda")]
        _ => candle_core::bail!("a time split mixes the wall clock and CUDA events"),
    }
}

/// Installs a clock for `dev` on this thread (replacing any), in phase `phase`.
pub fn start(dev: &Device, phase: &'static str) -> Result<()> {
    dev.synchronize()?;
    let clock = Clock {
        dev: dev.clone(),
        phase,
        kind: None,
        start: Instant::now(),
        first: stamp(dev)?,
        marks: Vec::new(),
    };
    CLOCK.with(|c| *c.borrow_mut() = Some(clock));
    Ok(())
}

/// A clock taken off its thread (see [`take`]).
pub struct Carried(Clock);

/// Takes this thread's clock off it, to run work on another thread under it ([`put`] there,
/// then back here).
pub fn take() -> Option<Carried> {
    CLOCK.with(|c| c.borrow_mut().take()).map(Carried)
}

/// Installs a clock taken by [`take`] on this thread.
pub fn put(clock: Option<Carried>) {
    if let Some(Carried(clock)) = clock {
        CLOCK.with(|c| *c.borrow_mut() = Some(clock));
    }
}

/// Removes this thread's clock when dropped: held by work that runs under a carried clock, so
/// that a panic there leaves no clock behind on a pool's thread.
pub struct Unset;

impl Drop for Unset {
    fn drop(&mut self) {
        drop(take());
    }
}

/// Whether a clock is installed on this thread.
pub fn running() -> bool {
    CLOCK.with(|c| c.borrow().is_some())
}

/// The phase of the marks that follow.
pub fn phase(name: &'static str) {
    CLOCK.with(|c| {
        if let Some(clock) = c.borrow_mut().as_mut() {
            clock.phase = name;
        }
    });
}

/// Closes the work since the last mark as `op` in a layer of `kind` (`None`: outside the
/// layers); nothing without a clock.
pub fn mark(kind: Option<LayerKind>, op: &'static str) {
    CLOCK.with(|c| {
        if let Some(clock) = c.borrow_mut().as_mut() {
            clock.kind = kind;
            // a stamp that cannot be taken loses this mark's split, never the work
            if let Ok(s) = stamp(&clock.dev) {
                clock.marks.push(((clock.phase, kind, op), s));
            }
        }
    });
}

/// [`mark`] in the layer kind of the last mark (for work that does not know its layer).
pub fn mark_here(op: &'static str) {
    let kind = CLOCK.with(|c| c.borrow().as_ref().map(|clock| clock.kind));
    if let Some(k) = kind {
        mark(k, op);
    }
}

/// One row of a split.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub phase: &'static str,
    pub kind: Option<LayerKind>,
    pub op: &'static str,
    pub calls: u64,
    pub seconds: f64,
}

/// Where a stretch of work's time went.
#[derive(Debug, Clone, Default)]
pub struct Split {
    /// By phase (in the order first seen), then by time, longest first.
    pub rows: Vec<Row>,
    /// Host wall time from the start to the stop (after the device finished).
    pub wall: f64,
    /// The device time from the first stamp to the last mark (the rows' sum).
    pub marked: f64,
}

/// Runs `f` under a clock installed for `dev` in phase `phase` and reads the split; the clock is
/// removed whether `f` returns, fails or panics.
pub fn timed<T, E: From<candle_core::Error>>(
    dev: &Device,
    phase: &'static str,
    f: impl FnOnce() -> std::result::Result<T, E>,
) -> std::result::Result<(T, Split), E> {
    start(dev, phase)?;
    let _unset = Unset;
    let r = f();
    let split = stop();
    Ok((r?, split?))
}

/// Removes this thread's clock and reads its split (waiting for the device once).
pub fn stop() -> Result<Split> {
    let Some(clock) = CLOCK.with(|c| c.borrow_mut().take()) else {
        candle_core::bail!("no clock is running on this thread")
    };
    clock.dev.synchronize()?;
    let wall = clock.start.elapsed().as_secs_f64();
    let mut order: Vec<&'static str> = Vec::new();
    let mut by: BTreeMap<Key, (u64, f64)> = BTreeMap::new();
    let mut prev = &clock.first;
    let mut marked = 0.0;
    for (key, s) in &clock.marks {
        let dt = between(prev, s)?;
        prev = s;
        marked += dt;
        if !order.contains(&key.0) {
            order.push(key.0);
        }
        let e = by.entry(*key).or_default();
        e.0 += 1;
        e.1 += dt;
    }
    let mut rows: Vec<Row> = by
        .into_iter()
        .map(|((phase, kind, op), (calls, seconds))| Row {
            phase,
            kind,
            op,
            calls,
            seconds,
        })
        .collect();
    rows.sort_by(|a, b| {
        let pa = order.iter().position(|p| *p == a.phase);
        let pb = order.iter().position(|p| *p == b.phase);
        pa.cmp(&pb).then(b.seconds.total_cmp(&a.seconds))
    });
    Ok(Split { rows, wall, marked })
}

impl Split {
    /// The seconds of each phase, in the order first seen.
    pub fn phases(&self) -> Vec<(&'static str, f64)> {
        let mut out: Vec<(&'static str, f64)> = Vec::new();
        for r in &self.rows {
            match out.iter_mut().find(|(p, _)| *p == r.phase) {
                Some(e) => e.1 += r.seconds,
                None => out.push((r.phase, r.seconds)),
            }
        }
        out
    }

    /// The table: each phase's share, then its rows (layer kind, op, calls, seconds, share of
    /// the marked time); rows under `min_share` of the whole are summed into one line per phase.
    pub fn table(&self, min_share: f64) -> String {
        let total = self.marked.max(1e-12);
        let mut s = format!(
            "{:<10} {:<18} {:<22} {:>7} {:>10} {:>7}\n",
            "phase", "layer kind", "op", "calls", "seconds", "share"
        );
        for (phase, secs) in self.phases() {
            s += &format!(
                "{phase:<10} {:<18} {:<22} {:>7} {secs:>10.4} {:>6.1}%\n",
                "(all)",
                "",
                "",
                100.0 * secs / total
            );
            let (mut rest, mut rest_calls, mut rest_n) = (0.0, 0u64, 0usize);
            for r in self.rows.iter().filter(|r| r.phase == phase) {
                if r.seconds / total < min_share {
                    rest += r.seconds;
                    rest_calls += r.calls;
                    rest_n += 1;
                    continue;
                }
                let kind = r.kind.map_or("outside".to_string(), |k| format!("{k:?}"));
                s += &format!(
                    "{:<10} {kind:<18} {:<22} {:>7} {:>10.4} {:>6.1}%\n",
                    "",
                    r.op,
                    r.calls,
                    r.seconds,
                    100.0 * r.seconds / total
                );
            }
            if rest_n > 0 {
                s += &format!(
                    "{:<10} {:<18} {:<22} {rest_calls:>7} {rest:>10.4} {:>6.1}%\n",
                    "",
                    format!("({rest_n} more)"),
                    "",
                    100.0 * rest / total
                );
            }
        }
        s += &format!(
            "marked {:.4}s of {:.4}s host wall time from start to stop\n",
            self.marked, self.wall
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each mark takes the time since the one before; phases keep their order; no clock, no
    /// marks.
    #[test]
    fn a_mark_closes_the_work_since_the_last() {
        mark(None, "before"); // no clock: nothing
        assert!(!running());
        start(&Device::Cpu, "forward").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(30));
        mark(Some(LayerKind::Attention), "attend");
        mark_here("linear");
        phase("backward");
        std::thread::sleep(std::time::Duration::from_millis(10));
        mark(None, "head");
        mark(Some(LayerKind::Attention), "attend");
        let s = stop().unwrap();
        assert!(!running());
        let phases = s.phases();
        assert_eq!(
            phases.iter().map(|p| p.0).collect::<Vec<_>>(),
            ["forward", "backward"]
        );
        let attend = s
            .rows
            .iter()
            .find(|r| r.phase == "forward" && r.op == "attend")
            .unwrap();
        assert_eq!(attend.kind, Some(LayerKind::Attention));
        assert!(attend.seconds >= 0.03, "{attend:?}");
        let linear = s.rows.iter().find(|r| r.op == "linear").unwrap();
        assert_eq!(
            linear.kind,
            Some(LayerKind::Attention),
            "the last mark's place"
        );
        assert!(linear.seconds < 0.01, "{linear:?}");
        let head = s.rows.iter().find(|r| r.op == "head").unwrap();
        assert!(head.seconds >= 0.01 && head.kind.is_none(), "{head:?}");
        assert_eq!(s.rows.len(), 4);
        let sum: f64 = s.rows.iter().map(|r| r.seconds).sum();
        assert!((sum - s.marked).abs() < 1e-9 && s.marked <= s.wall);
        assert!(s.table(0.0).contains("attend"));
        assert!(stop().is_err(), "stopped twice");
    }
}
