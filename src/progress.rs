//! Progress of one long piece of work (a sampling job, a training run, an eval set, hashing):
//! done / total in some unit, the rate since this process started, the ETA, and a free-form
//! detail (loss, tokens/s). Shown as an `indicatif` bar on a terminal, or as a plain log line
//! every few seconds otherwise ([`crate::logging::Mode`]); written to `progress.json` in the
//! stage dir about once a second when given a file, for `pipeline status`.
//!
//! Knows nothing of what the work is: its owner calls [`Tracker::set`] / [`Tracker::inc`].

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::logging::{self, Mode};
use crate::store::{self, Progress};

/// How often a plain progress line is logged: `SELFDISTILL_PROGRESS_EVERY` seconds, default 10.
pub fn line_every() -> Duration {
    let secs = std::env::var("SELFDISTILL_PROGRESS_EVERY")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .unwrap_or(10.0)
        .min(86400.0);
    Duration::from_secs_f64(secs)
}

/// Where a job reports: the label of its bar and lines, and the `progress.json` it keeps.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Target {
    pub label: String,
    pub file: Option<PathBuf>,
}

impl Target {
    pub fn new(label: impl Into<String>, file: Option<PathBuf>) -> Target {
        Target {
            label: label.into(),
            file,
        }
    }

    /// A tracker for this target.
    pub fn tracker(&self, unit: impl Into<String>, total: Option<u64>) -> Tracker {
        Tracker::new(self.label.clone(), unit, total).with_file(self.file.clone())
    }
}

/// How often `progress.json` is rewritten at most.
const FILE_EVERY: Duration = Duration::from_secs(1);

pub struct Tracker {
    label: String,
    unit: String,
    total: Option<u64>,
    done: u64,
    resumed: u64,
    detail: String,
    started: Instant,
    started_unix: u64,
    file: Option<PathBuf>,
    last_file: Option<Instant>,
    bar: Option<indicatif::ProgressBar>,
    line_every: Duration,
    last_line: Instant,
    host: String,
}

impl Tracker {
    /// `label` names the work in lines and bars ("sample", "train"); `unit` the counted things.
    pub fn new(label: impl Into<String>, unit: impl Into<String>, total: Option<u64>) -> Tracker {
        let label = label.into();
        let unit = unit.into();
        let bar = (logging::mode() == Mode::Bars).then(|| {
            let bar = match total {
                Some(t) => indicatif::ProgressBar::new(t),
                None => indicatif::ProgressBar::new_spinner(),
            };
            let template = match total {
                Some(_) => format!(
                    "{{prefix:.bold}} [{{bar:30.cyan/blue}}] {{pos}}/{{len}} {unit}  {{msg}}"
                ),
                None => format!("{{prefix:.bold}} {{spinner}} {{pos}} {unit}  {{msg}}"),
            };
            if let Ok(style) = indicatif::ProgressStyle::with_template(&template) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_prefix(label.clone());
            let bar = logging::bars().add(bar);
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Tracker {
            label,
            unit,
            total,
            done: 0,
            resumed: 0,
            detail: String::new(),
            started: Instant::now(),
            started_unix: store::now_unix(),
            file: None,
            last_file: None,
            bar,
            line_every: line_every(),
            last_line: Instant::now(),
            host: crate::machine::hostname(),
        }
    }

    /// Also keep `path` (a stage's `progress.json`) up to date.
    pub fn with_file(mut self, path: Option<PathBuf>) -> Tracker {
        self.file = path;
        self.write_file();
        self
    }

    /// `done` units were finished by an earlier run (counted as done, not in the rate).
    pub fn resumed(mut self, done: u64) -> Tracker {
        self.done = done;
        self.resumed = done;
        if let Some(b) = &self.bar {
            b.set_position(done);
        }
        self.update(true);
        self
    }

    pub fn set(&mut self, done: u64) {
        self.done = done;
        self.update(false);
    }

    pub fn inc(&mut self, n: u64) {
        self.done += n;
        self.update(false);
    }

    /// Writes the file now (after a checkpoint: what a resume starts from).
    pub fn flush(&mut self) {
        self.update(false);
        self.write_file();
    }

    /// Sets what is shown after the counts (shown at the next update).
    pub fn detail(&mut self, detail: impl Into<String>) {
        self.detail = detail.into();
    }

    /// Units per second in this process.
    pub fn rate(&self) -> Option<f64> {
        let secs = self.started.elapsed().as_secs_f64();
        (secs > 0.0 && self.done > self.resumed).then(|| (self.done - self.resumed) as f64 / secs)
    }

    pub fn eta_seconds(&self) -> Option<f64> {
        let left = self.total?.saturating_sub(self.done);
        self.rate().map(|r| left as f64 / r)
    }

    fn counts(&self) -> String {
        let rate = match self.rate() {
            Some(r) if r >= 10.0 => format!("{r:.0} {}/s", self.unit),
            Some(r) if r >= 0.1 => format!("{r:.2} {}/s", self.unit),
            Some(r) => format!("{} per {}", self.unit, fmt_secs(1.0 / r)),
            None => String::new(),
        };
        let eta = self
            .eta_seconds()
            .map(|e| format!("ETA {}", fmt_secs(e)))
            .unwrap_or_default();
        [rate.as_str(), eta.as_str(), self.detail.as_str()]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join("  ")
    }

    fn line(&self) -> String {
        let total = self.total.map(|t| format!("/{t}")).unwrap_or_default();
        format!(
            "{}: {}{total} {}  {}",
            self.label,
            self.done,
            self.unit,
            self.counts()
        )
        .trim_end()
        .to_string()
    }

    fn update(&mut self, force: bool) {
        if let Some(b) = &self.bar {
            b.set_position(self.done);
            b.set_message(self.counts());
        }
        if force || self.last_line.elapsed() >= self.line_every {
            self.last_line = Instant::now();
            let line = self.line();
            match &self.bar {
                // the bar shows it: the stage's log file still gets the line
                Some(_) => tracing::info!(target: "selfdistill::file_only", "{line}"),
                None => tracing::info!("{line}"),
            }
        }
        if force || self.last_file.is_none_or(|t| t.elapsed() >= FILE_EVERY) {
            self.write_file();
        }
    }

    fn write_file(&mut self) {
        let Some(path) = &self.file else {
            return;
        };
        self.last_file = Some(Instant::now());
        let p = Progress {
            done: self.done,
            total: self.total,
            unit: self.unit.clone(),
            rate: self.rate(),
            eta_seconds: self.eta_seconds(),
            label: self.label.clone(),
            detail: self.detail.clone(),
            started_unix: self.started_unix,
            updated_unix: store::now_unix(),
            pid: Some(std::process::id()),
            host: self.host.clone(),
        };
        // progress is advisory: a failed write must not stop the work
        if let Err(e) = store::write_json_atomic(path, &p) {
            tracing::warn!("cannot write {}: {e:#}", path.display());
        }
    }

    /// The last line, the file, and the bar cleared.
    pub fn finish(mut self) {
        self.update(true);
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
            logging::bars().remove(&b);
        }
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        if let Some(b) = self.bar.take() {
            b.abandon();
        }
    }
}

/// `1h02m`, `3m05s`, `12.3s`.
pub fn fmt_secs(s: f64) -> String {
    if !s.is_finite() {
        return "-".into();
    }
    let t = s.round() as u64;
    if t >= 3600 {
        format!("{}h{:02}m", t / 3600, (t % 3600) / 60)
    } else if t >= 60 {
        format!("{}m{:02}s", t / 60, t % 60)
    } else {
        format!("{s:.1}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_says_how_far_how_fast_and_who() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("progress.json");
        let mut t = Tracker::new("work", "items", Some(10))
            .with_file(Some(path.clone()))
            .resumed(4);
        std::thread::sleep(Duration::from_millis(20));
        t.inc(2);
        t.detail("loss 1.0");
        t.finish();
        let p = store::read_progress(dir.path()).unwrap();
        assert_eq!((p.done, p.total, p.unit.as_str()), (6, Some(10), "items"));
        assert!(p.rate.unwrap() > 0.0, "{p:?}");
        assert!(p.eta_seconds.unwrap() > 0.0, "{p:?}");
        assert_eq!(p.detail, "loss 1.0");
        assert_eq!(p.pid, Some(std::process::id()));
        assert!(p.updated_unix >= p.started_unix && p.started_unix > 0);
    }

    #[test]
    fn durations_read_at_a_glance() {
        assert_eq!(fmt_secs(12.34), "12.3s");
        assert_eq!(fmt_secs(185.0), "3m05s");
        assert_eq!(fmt_secs(3725.0), "1h02m");
        assert_eq!(fmt_secs(f64::NAN), "-");
    }
}
