//! Fault injection for crash tests: `SELFDISTILL_KILL_AT=<point>:<n>` makes the process SIGKILL
//! itself the n-th time it reaches `point` (a name such as `filter.chunk`).
//!
//! A no-op unless the variable is set. Tests use it to kill a stage at an exact place (for
//! example halfway through writing a file) and then check that the next run resumes to the
//! same result as an uninterrupted one. Knows nothing of stages.

use std::sync::atomic::{AtomicU64, Ordering};

/// Hits of the armed point so far (only one point is armed per process).
static HITS: AtomicU64 = AtomicU64::new(0);

pub const ENV: &str = "SELFDISTILL_KILL_AT";

/// Kills the process with SIGKILL when `point` is armed and reached for the n-th time.
pub fn point(name: &str) {
    let Ok(spec) = std::env::var(ENV) else {
        return;
    };
    let (armed, nth) = match spec.rsplit_once(':') {
        Some((p, n)) => (p, n.parse::<u64>().unwrap_or(1)),
        None => (spec.as_str(), 1),
    };
    if armed != name {
        return;
    }
    if HITS.fetch_add(1, Ordering::SeqCst) + 1 >= nth {
        eprintln!("fault injection: SIGKILL at {name} (hit {nth})");
        // SAFETY: kill(2) on our own pid with a valid signal number has no memory effects.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}
