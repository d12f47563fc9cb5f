//! Logs and where progress is drawn: `tracing` events go to stderr (the level from `-v`/`-q`, or
//! `RUST_LOG` when set) and, while a stage runs, also to that stage's log file; progress is
//! drawn as `indicatif` bars when stderr is a terminal and as plain periodic lines otherwise (a
//! log file, Slurm's output), never both.
//!
//! All bars live in one `MultiProgress`; a log line suspends them while it is written, so bars
//! and lines never interleave. Knows nothing of stages: the runner names the stage's file
//! ([`stage_log`]), and [`crate::progress`] draws the bars.
//!
//! Command output (plans, tables, reports) goes to stdout through [`outln!`](crate::outln): a
//! closed stdout (`pipeline run all | head -1`) ends the output quietly, as Unix tools do, and
//! never the program or a stage.

use std::fs::File;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::{Mutex, OnceLock};

use anyhow::{Context, Result};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, EnvFilter, Layer};

/// `println!` for command output, except that a closed stdout (its reader went away, as
/// `| head` does) is the end of the output rather than a panic: nothing more is printed and
/// the program goes on, so a stage's state never depends on whether its output was read.
#[macro_export]
macro_rules! outln {
    () => {
        $crate::logging::print_out(format_args!(""), true)
    };
    ($($arg:tt)*) => {
        $crate::logging::print_out(format_args!($($arg)*), true)
    };
}

/// [`outln!`](crate::outln) without the newline.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::logging::print_out(format_args!($($arg)*), false)
    };
}

/// Set once stdout is found closed.
static STDOUT_CLOSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Writes command output to stdout, a line with `newline` (see [`outln!`](crate::outln)).
pub fn print_out(args: std::fmt::Arguments, newline: bool) {
    use std::sync::atomic::Ordering;
    if STDOUT_CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let mut out = std::io::stdout().lock();
    let written = match newline {
        true => writeln!(out, "{args}"),
        false => write!(out, "{args}"),
    };
    if let Err(e) = written.and_then(|()| out.flush()) {
        // a closed pipe ends the output; any other failure to print is said once on stderr
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("warning: cannot write to stdout: {e}; output stops here");
        }
        STDOUT_CLOSED.store(true, Ordering::Relaxed);
    }
}

/// Events with this target go to the stage's log file only (a bar already shows them).
pub const FILE_ONLY: &str = "selfdistill::file_only";

/// How progress is shown on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `indicatif` bars (stderr is a terminal).
    Bars,
    /// A plain line every few seconds, as a log event (stderr is a file or a pipe, or `-q`).
    Lines,
}

static MODE: OnceLock<Mode> = OnceLock::new();
static BARS: OnceLock<indicatif::MultiProgress> = OnceLock::new();
static STAGE_LOG: Mutex<Option<File>> = Mutex::new(None);

/// The progress mode: bars on a terminal (unless quiet or `TERM=dumb`), lines otherwise.
pub fn mode_for(terminal: bool, verbosity: i8, term: Option<&str>) -> Mode {
    if terminal && verbosity >= 0 && term != Some("dumb") {
        Mode::Bars
    } else {
        Mode::Lines
    }
}

/// The mode chosen by [`init`] (lines when it was never called: tests and library use).
pub fn mode() -> Mode {
    MODE.get().copied().unwrap_or(Mode::Lines)
}

/// The bars' owner (drawn on stderr).
pub fn bars() -> &'static indicatif::MultiProgress {
    BARS.get_or_init(|| {
        indicatif::MultiProgress::with_draw_target(indicatif::ProgressDrawTarget::stderr())
    })
}

/// The stderr filter: `RUST_LOG` when set, else our crate at the level of `verbosity` (-2 errors
/// only, -1 warnings, 0 info, 1 debug, 2 trace) and other crates' warnings.
fn stderr_filter(verbosity: i8) -> EnvFilter {
    let ours = match verbosity {
        i8::MIN..=-2 => "error",
        -1 => "warn",
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = match std::env::var("RUST_LOG") {
        Ok(s) if !s.trim().is_empty() => EnvFilter::new(s),
        // tokenizers warns about our own word-level vocabularies' special tokens: not news
        _ => EnvFilter::new(format!(
            "warn,tokenizers=error,selfdistill={ours},pipeline={ours}"
        )),
    };
    match format!("{FILE_ONLY}=off").parse() {
        Ok(d) => filter.add_directive(d),
        Err(_) => filter,
    }
}

/// Sets up logging for the process: call once, first thing in `main`.
/// An error and its causes as one line, `a: b: c`, each said once: a cause whose text the line
/// already ends with is not repeated (candle's `I/O error: No space left on device (os error
/// 28)` has that same io error as its source, which `{:#}` prints a second time).
pub fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let m = cause.to_string();
        if out.ends_with(&m) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&m);
    }
    out
}

pub fn init(verbosity: i8) {
    let terminal = std::io::stderr().is_terminal();
    let term = std::env::var("TERM").ok();
    let _ = MODE.set(mode_for(terminal, verbosity, term.as_deref()));
    // on a terminal: no timestamps, colours; in a file: timestamps, no colour codes
    let on_term = terminal.then(|| {
        fmt::layer()
            .with_writer(|| Line(Sink::Stderr, Vec::new()))
            .with_target(false)
            .without_time()
            .with_filter(stderr_filter(verbosity))
    });
    let in_file = (!terminal).then(|| {
        fmt::layer()
            .with_writer(|| Line(Sink::Stderr, Vec::new()))
            .with_target(false)
            .with_ansi(false)
            .with_filter(stderr_filter(verbosity))
    });
    let file_level = if verbosity > 0 { "debug" } else { "info" };
    let stage = fmt::layer()
        .with_writer(|| Line(Sink::Stage, Vec::new()))
        .with_target(false)
        .with_ansi(false)
        .with_filter(EnvFilter::new(format!(
            "warn,tokenizers=error,selfdistill={file_level},pipeline={file_level}"
        )));
    let _ = tracing_subscriber::registry()
        .with(on_term)
        .with(in_file)
        .with(stage)
        .try_init();
}

/// Where a formatted event goes.
#[derive(Clone, Copy)]
enum Sink {
    /// stderr, with the bars hidden meanwhile.
    Stderr,
    /// The current stage's log file (dropped when no stage runs).
    Stage,
}

/// One formatted event, written whole to its sink when dropped (events never interleave).
struct Line(Sink, Vec<u8>);

impl Write for Line {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.1.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        if self.1.is_empty() {
            return;
        }
        let bytes = std::mem::take(&mut self.1);
        match self.0 {
            Sink::Stderr => {
                let write = || {
                    let _ = std::io::stderr().lock().write_all(&bytes);
                };
                match BARS.get() {
                    Some(b) => b.suspend(write),
                    None => write(),
                }
            }
            Sink::Stage => {
                if let Ok(mut g) = STAGE_LOG.lock() {
                    if let Some(f) = g.as_mut() {
                        let _ = f.write_all(&bytes);
                    }
                }
            }
        }
    }
}

/// While the returned guard lives, log events also go to `path` (appended: a resumed stage's
/// log keeps the killed run's lines).
pub fn stage_log(path: &Path) -> Result<StageLog> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open the stage log {}", path.display()))?;
    if let Ok(mut g) = STAGE_LOG.lock() {
        *g = Some(f);
    }
    Ok(StageLog(()))
}

/// See [`stage_log`].
pub struct StageLog(());

impl Drop for StageLog {
    fn drop(&mut self) {
        if let Ok(mut g) = STAGE_LOG.lock() {
            if let Some(f) = g.as_mut() {
                let _ = f.sync_all();
            }
            *g = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_only_on_a_terminal_that_is_not_quiet_or_dumb() {
        assert_eq!(mode_for(true, 0, Some("xterm")), Mode::Bars);
        assert_eq!(mode_for(true, 2, None), Mode::Bars);
        assert_eq!(mode_for(false, 0, Some("xterm")), Mode::Lines);
        assert_eq!(mode_for(true, -1, Some("xterm")), Mode::Lines);
        assert_eq!(mode_for(true, 0, Some("dumb")), Mode::Lines);
    }

    /// A full disk under candle's error, under our context: said once, not twice.
    #[test]
    fn an_error_chain_says_each_cause_once() {
        let io = std::io::Error::from_raw_os_error(28);
        let e =
            anyhow::Error::new(candle_core::Error::Io(io)).context("cannot write x.safetensors");
        let line = super::error_chain(&e);
        assert_eq!(line.matches("os error 28").count(), 1, "{line}");
        assert!(line.starts_with("cannot write x.safetensors: "), "{line}");
        // distinct causes all stay
        let e = anyhow::anyhow!("inner").context("middle").context("outer");
        assert_eq!(super::error_chain(&e), "outer: middle: inner");
    }
}
