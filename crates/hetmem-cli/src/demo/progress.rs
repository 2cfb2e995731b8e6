//! Progress of a long replay on stderr: requests served, tokens/s, physical memory now and time
//! left. Updated in place (`indicatif`) when stderr is a terminal, as plain lines when it is not
//! (logs, CI, pipes): the first one second into the replay (from a timer thread, however long
//! the step under way takes), then every `interval`; nothing with `--quiet`. The time left is
//! the time so far scaled by the share of requests still to serve. The final report on stdout
//! does not change.

use std::io::{IsTerminal, Write};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::server::StepView;
use super::thousands;
use crate::info::human;

/// When the first plain line comes (unless a shorter interval brings it sooner).
const FIRST_LINE: Duration = Duration::from_secs(1);

/// What a line says, apart from the step it shows.
#[derive(Clone, Copy)]
struct Format {
    start: Instant,
    requests: usize,
    page: usize,
}

impl Format {
    /// What follows the request count: rate, memory, time left. `v`: the last step seen
    /// (`None` while the first is under way).
    fn message(&self, v: Option<&StepView>, done: bool) -> String {
        let elapsed = self.start.elapsed();
        let Some(v) = v else {
            return format!(
                "{} elapsed, the first step under way, time left unknown until a request is \
                 served",
                duration(elapsed)
            );
        };
        let secs = elapsed.as_secs_f64();
        let rate = if secs > 0.0 {
            v.tokens_served as f64 / secs
        } else {
            0.0
        };
        let left = if done {
            "done".to_string()
        } else {
            match time_left(elapsed, v.served, self.requests) {
                Some(t) => format!("about {} left", duration(t)),
                None => "time left unknown until a request is served".to_string(),
            }
        };
        format!(
            "{} tokens/s, physical {} ({} mapped), {} elapsed, {left}",
            thousands(rate as u64),
            human(v.objects as u64 * self.page as u64),
            human(v.mapped as u64),
            duration(elapsed),
        )
    }

    /// Writes one plain line.
    fn line(&self, v: Option<&StepView>, done: bool) {
        let text = format!(
            "progress: {}/{} requests served, {}",
            thousands(v.map_or(0, |v| v.served) as u64),
            thousands(self.requests as u64),
            self.message(v, done)
        );
        // A closed stderr must not stop the replay.
        let _ = writeln!(std::io::stderr().lock(), "{text}");
    }
}

/// The plain lines' state, shared with the timer thread of the first line.
struct Lines {
    interval: Duration,
    /// The last step seen.
    latest: Option<StepView>,
    /// When the last line was written (`None` before the first).
    last: Option<Instant>,
}

enum Mode {
    Quiet,
    Bar(ProgressBar),
    Lines {
        state: Arc<Mutex<Lines>>,
        /// Dropping it stops the timer thread.
        stop: Option<mpsc::Sender<()>>,
        timer: Option<JoinHandle<()>>,
    },
}

/// The progress display of one replay.
pub struct Progress {
    mode: Mode,
    fmt: Format,
    last_served: usize,
}

/// `d` as `1 h 02 min`, `3 min 05 s`, `12 s` or, below a minute and not whole, `2.4 s`.
pub fn duration(d: Duration) -> String {
    let tenths = (d.as_secs_f64() * 10.0).round() as u64;
    if tenths < 600 {
        return if tenths.is_multiple_of(10) {
            format!("{} s", tenths / 10)
        } else {
            format!("{}.{} s", tenths / 10, tenths % 10)
        };
    }
    let s = d.as_secs();
    if s >= 3600 {
        format!("{} h {:02} min", s / 3600, s / 60 % 60)
    } else if s >= 60 {
        format!("{} min {:02} s", s / 60, s % 60)
    } else {
        format!("{s} s")
    }
}

fn lock(m: &Mutex<Lines>) -> MutexGuard<'_, Lines> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Progress {
    /// A display for `requests` requests, physical memory counted in objects of `page` bytes.
    /// `quiet`: nothing. Else a bar on a terminal; elsewhere lines: the first one second in
    /// (or sooner, when a request finishes after `interval`), then every `interval` when a
    /// request finishes, and one at the end; an interval of zero gives a line whenever a
    /// request finishes.
    pub fn new(quiet: bool, interval: Duration, requests: usize, page: usize) -> Self {
        let fmt = Format {
            start: Instant::now(),
            requests,
            page,
        };
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
            bar.set_message(fmt.message(None, false));
            bar.tick();
            Mode::Bar(bar)
        } else {
            let state = Arc::new(Mutex::new(Lines {
                interval,
                latest: None,
                last: None,
            }));
            let (stop, stopped) = mpsc::channel::<()>();
            let shared = state.clone();
            // The first line one second in, even while a long first step is under way.
            let timer = std::thread::Builder::new()
                .name("hetmem-progress".into())
                .spawn(move || {
                    if interval <= FIRST_LINE {
                        return;
                    }
                    if let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(FIRST_LINE) {
                        let mut st = lock(&shared);
                        if st.last.is_none() {
                            fmt.line(st.latest.as_ref(), false);
                            st.last = Some(Instant::now());
                        }
                    }
                })
                .ok();
            Mode::Lines {
                state,
                stop: Some(stop),
                timer,
            }
        };
        Progress {
            mode,
            fmt,
            last_served: 0,
        }
    }

    /// Called at the end of every step.
    pub fn step(&mut self, v: &StepView) {
        let finished = v.served != self.last_served;
        self.last_served = v.served;
        match &self.mode {
            Mode::Quiet => {}
            Mode::Bar(bar) => {
                // The bar redraws at most 4 times a second; building the message is the cost.
                if finished || v.step.is_multiple_of(64) {
                    bar.set_position(v.served as u64);
                    bar.set_message(self.fmt.message(Some(v), false));
                }
            }
            Mode::Lines { state, .. } => {
                let mut st = lock(state);
                st.latest = Some(*v);
                let due = match st.last {
                    // With an interval below a second, lines come as requests finish.
                    None => {
                        let e = self.fmt.start.elapsed();
                        (st.interval > FIRST_LINE && e >= FIRST_LINE)
                            || (finished && e >= st.interval)
                    }
                    Some(t) => finished && t.elapsed() >= st.interval,
                };
                if due {
                    st.last = Some(Instant::now());
                    self.fmt.line(Some(v), false);
                }
            }
        }
    }

    /// Stops the timer thread of the first line (if any).
    fn stop_timer(&mut self) {
        if let Mode::Lines { stop, timer, .. } = &mut self.mode {
            drop(stop.take());
            if let Some(t) = timer.take() {
                let _ = t.join();
            }
        }
    }

    /// Called once after the last step.
    pub fn finish(&mut self, v: &StepView) {
        self.stop_timer();
        match &self.mode {
            Mode::Quiet => {}
            Mode::Bar(bar) => {
                bar.set_position(v.served as u64);
                bar.finish_with_message(self.fmt.message(Some(v), true));
            }
            Mode::Lines { .. } => self.fmt.line(Some(v), true),
        }
    }

    /// Stops the bar (if any) without a final message, e.g. on error.
    pub fn abandon(&mut self) {
        self.stop_timer();
        if let Mode::Bar(bar) = &self.mode {
            bar.abandon();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop_timer();
    }
}

/// The time left when `served` of `requests` requests took `elapsed`: the time so far scaled
/// by the share still to serve; `None` before the first request is served.
pub fn time_left(elapsed: Duration, served: usize, requests: usize) -> Option<Duration> {
    if served == 0 {
        return None;
    }
    let share_left = requests.saturating_sub(served) as f64 / served as f64;
    Some(elapsed.mul_f64(share_left))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_left_scales_the_time_so_far_by_the_share_of_requests_left() {
        let s = Duration::from_secs;
        assert_eq!(time_left(s(2), 0, 100), None);
        assert_eq!(time_left(s(2), 25, 100), Some(s(6)));
        assert_eq!(time_left(s(3), 100, 100), Some(s(0)));
    }

    #[test]
    fn durations_below_a_minute_show_tenths_unless_whole() {
        assert_eq!(duration(Duration::from_millis(2_440)), "2.4 s");
        assert_eq!(duration(Duration::from_millis(59_940)), "59.9 s");
        assert_eq!(duration(Duration::from_millis(59_960)), "59 s");
    }

    #[test]
    fn durations_read_as_hours_minutes_or_seconds() {
        assert_eq!(duration(Duration::from_secs(0)), "0 s");
        assert_eq!(duration(Duration::from_secs(59)), "59 s");
        assert_eq!(duration(Duration::from_secs(185)), "3 min 05 s");
        assert_eq!(duration(Duration::from_secs(3720)), "1 h 02 min");
    }
}
