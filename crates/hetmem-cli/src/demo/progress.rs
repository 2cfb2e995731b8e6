//! Progress of a long replay on stderr: requests served, tokens/s, physical memory now and time
//! left. Updated in place (`indicatif`) when stderr is a terminal, as plain lines every
//! `interval` when it is not (logs, CI, pipes), and nothing with `--quiet`. The final report on
//! stdout does not change.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::server::StepView;
use super::thousands;
use crate::info::human;

enum Mode {
    Quiet,
    Bar(ProgressBar),
    Lines { interval: Duration, last: Instant },
}

/// The progress display of one replay.
pub struct Progress {
    mode: Mode,
    start: Instant,
    requests: usize,
    /// Prompt plus output tokens of every request (the time left is estimated from these).
    tokens: u64,
    page: usize,
    last_served: usize,
}

/// `d` as `1 h 02 min`, `3 min 05 s` or `12 s`.
pub fn duration(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{} h {:02} min", s / 3600, s / 60 % 60)
    } else if s >= 60 {
        format!("{} min {:02} s", s / 60, s % 60)
    } else {
        format!("{s} s")
    }
}

impl Progress {
    /// A display for `requests` requests holding `tokens` tokens in all, physical memory counted
    /// in objects of `page` bytes. `quiet`: nothing. Else a bar on a terminal, lines every
    /// `interval` (and at the end) elsewhere; an interval of zero gives a line whenever a
    /// request finishes.
    pub fn new(quiet: bool, interval: Duration, requests: usize, tokens: u64, page: usize) -> Self {
        let mode = if quiet {
            Mode::Quiet
        } else if std::io::stderr().is_terminal() {
            let bar = ProgressBar::with_draw_target(
                Some(requests as u64),
                ProgressDrawTarget::stderr_with_hz(4),
            );
            bar.set_style(
                ProgressStyle::with_template("{bar:28} {pos}/{len} requests served, {msg}")
                    .expect("valid template")
                    .progress_chars("=> "),
            );
            Mode::Bar(bar)
        } else {
            Mode::Lines {
                interval,
                last: Instant::now(),
            }
        };
        Progress {
            mode,
            start: Instant::now(),
            requests,
            tokens,
            page,
            last_served: 0,
        }
    }

    /// What follows the request count: rate, memory, time left.
    fn message(&self, v: &StepView, done: bool) -> String {
        let secs = self.start.elapsed().as_secs_f64();
        let rate = if secs > 0.0 {
            v.tokens_served as f64 / secs
        } else {
            0.0
        };
        let left = if done {
            "done".to_string()
        } else if v.tokens_served == 0 || rate <= 0.0 {
            "time left unknown yet".to_string()
        } else {
            let s = self.tokens.saturating_sub(v.tokens_served) as f64 / rate;
            format!("about {} left", duration(Duration::from_secs_f64(s)))
        };
        format!(
            "{} tokens/s, physical {} ({} mapped), {} elapsed, {left}",
            thousands(rate as u64),
            human(v.objects as u64 * self.page as u64),
            human(v.mapped as u64),
            duration(self.start.elapsed()),
        )
    }

    fn line(&self, v: &StepView, done: bool) {
        let text = format!(
            "progress: {}/{} requests served, {}",
            thousands(v.served as u64),
            thousands(self.requests as u64),
            self.message(v, done)
        );
        // A closed stderr must not stop the replay.
        let _ = writeln!(std::io::stderr().lock(), "{text}");
    }

    /// Called at the end of every step.
    pub fn step(&mut self, v: &StepView) {
        let finished = v.served != self.last_served;
        self.last_served = v.served;
        match &mut self.mode {
            Mode::Quiet => {}
            Mode::Bar(bar) => {
                // The bar redraws at most 4 times a second; building the message is the cost.
                if finished || v.step.is_multiple_of(64) {
                    bar.set_position(v.served as u64);
                    let msg = self.message(v, false);
                    if let Mode::Bar(bar) = &self.mode {
                        bar.set_message(msg);
                    }
                }
            }
            Mode::Lines { interval, last } => {
                if finished && last.elapsed() >= *interval {
                    *last = Instant::now();
                    self.line(v, false);
                }
            }
        }
    }

    /// Called once after the last step.
    pub fn finish(&mut self, v: &StepView) {
        match &self.mode {
            Mode::Quiet => {}
            Mode::Bar(bar) => {
                bar.set_position(v.served as u64);
                bar.finish_with_message(self.message(v, true));
            }
            Mode::Lines { .. } => self.line(v, true),
        }
    }

    /// Stops the bar (if any) without a final message, e.g. on error.
    pub fn abandon(&self) {
        if let Mode::Bar(bar) = &self.mode {
            bar.abandon();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_hours_minutes_or_seconds() {
        assert_eq!(duration(Duration::from_secs(0)), "0 s");
        assert_eq!(duration(Duration::from_secs(59)), "59 s");
        assert_eq!(duration(Duration::from_secs(185)), "3 min 05 s");
        assert_eq!(duration(Duration::from_secs(3720)), "1 h 02 min");
    }
}
