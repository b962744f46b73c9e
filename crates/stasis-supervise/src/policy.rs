//! The supervisor's decisions, free of processes and clocks: when the next
//! checkpoint is due, how long a touch window lasts, whether a failed job
//! is restarted.

use std::time::Duration;

use nix::sys::wait::WaitStatus;

use crate::parse::ParseError;

/// Young's first-order optimum checkpoint interval: sqrt(2 C M), for a
/// checkpoint cost C and a mean time between failures M.
pub fn young_interval(cost: Duration, mtbf: Duration) -> Duration {
    let secs = (2.0 * cost.as_secs_f64() * mtbf.as_secs_f64()).sqrt();
    Duration::from_secs_f64(secs.clamp(0.05, mtbf.as_secs_f64().max(0.05)))
}

/// How the interval between checkpoints is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Every {
    /// A fixed interval (`--every SECS`).
    Fixed(Duration),
    /// Young's formula over the measured checkpoint cost (`--every auto
    /// --mtbf M`); the first checkpoint comes after one second.
    Auto { mtbf: Duration },
}

/// Where Young's formula took the interval from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Young {
    /// The smoothed checkpoint cost, in seconds.
    pub cost_secs: f64,
    pub mtbf: Duration,
}

/// The interval between checkpoints, updated with each checkpoint's cost.
#[derive(Debug, Clone)]
pub struct Schedule {
    every: Every,
    interval: Duration,
    cost_ewma: Option<f64>,
}

impl Schedule {
    pub fn new(every: Every) -> Schedule {
        let interval = match every {
            Every::Fixed(d) => d,
            Every::Auto { .. } => Duration::from_secs(1),
        };
        Schedule {
            every,
            interval,
            cost_ewma: None,
        }
    }

    /// The current interval.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Accounts a checkpoint that took `total_us`: the cost estimate is an
    /// exponential average (0.7 old, 0.3 new); with [`Every::Auto`] the
    /// interval becomes Young's, which is returned.
    pub fn checkpointed(&mut self, total_us: u64) -> Option<Young> {
        #[allow(clippy::cast_precision_loss)]
        let cost = total_us as f64 / 1e6;
        let c = self.cost_ewma.map_or(cost, |e| 0.7 * e + 0.3 * cost);
        self.cost_ewma = Some(c);
        match self.every {
            Every::Fixed(_) => None,
            Every::Auto { mtbf } => {
                self.interval = young_interval(Duration::from_secs_f64(c), mtbf);
                Some(Young { cost_secs: c, mtbf })
            }
        }
    }
}

/// Below this image size a touch window is not worth it (a full restore
/// takes about as long as the window would).
pub const MIN_TOUCH_IMAGE: u64 = 64 << 20;
/// Link speed assumed by `auto` for a restore from another host (1 Gbit/s).
const NET_BYTES_PER_SEC: f64 = 125e6;
const LATENCY_SECS: f64 = 0.001;

/// The window for `--touch-window SPEC`: seconds, or `auto` for FREM's rule
/// (the time to retrieve the image: from disk at the rate this dump wrote
/// it, over a 1 Gbit/s link, plus a latency), off for small images and when
/// longer than the checkpoint interval.
pub fn touch_window(
    spec: &str,
    image_bytes: u64,
    dump_us: u64,
    interval: Option<f64>,
) -> Result<Option<Duration>, ParseError> {
    let secs = if spec == "auto" {
        if image_bytes < MIN_TOUCH_IMAGE {
            return Ok(None);
        }
        #[allow(clippy::cast_precision_loss)]
        let (w, t) = (image_bytes as f64, dump_us.max(1) as f64 / 1e6);
        let disk = w / t;
        w / disk + w / NET_BYTES_PER_SEC + LATENCY_SECS
    } else {
        spec.parse()
            .ok()
            .filter(|s: &f64| s.is_finite() && *s >= 0.0)
            .ok_or_else(|| ParseError::TouchWindow(spec.to_string()))?
    };
    if interval.is_some_and(|i| secs > i) || secs == 0.0 {
        return Ok(None);
    }
    Ok(Some(Duration::from_secs_f64(secs)))
}

/// The exit code `stasis run` leaves with for a job's wait status (128 +
/// signal when killed), and whether that is a failure.
pub fn exit_code(s: &WaitStatus) -> (u8, bool) {
    match s {
        WaitStatus::Exited(_, c) => (u8::try_from(*c).unwrap_or(1), *c != 0),
        WaitStatus::Signaled(_, sig, _) => (u8::try_from(128 + *sig as i32).unwrap_or(255), true),
        _ => (1, true),
    }
}

/// "exited with status N" / "was killed by SIGNAL".
pub fn describe(s: &WaitStatus) -> String {
    match s {
        WaitStatus::Exited(_, c) => format!("exited with status {c}"),
        WaitStatus::Signaled(_, sig, _) => format!("was killed by {sig}"),
        other => format!("{other:?}"),
    }
}

/// Why the supervisor leaves instead of restarting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leave {
    /// The job succeeded, or restarts are off.
    Done,
    /// It failed before any checkpoint.
    NoCheckpoint,
    /// It failed after `--max-restarts` restarts already.
    MaxRestarts(u32),
}

/// What to do when the job ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnExit {
    Leave(Leave),
    /// Restore this checkpoint (the latest).
    Restart(u32),
}

/// `--restart-on-failure` and `--max-restarts`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartPolicy {
    pub on_failure: bool,
    pub max_restarts: u32,
}

impl RestartPolicy {
    /// The decision for a job that ended (`failed`), with `latest` the
    /// newest checkpoint and `restarts` the restarts done so far.
    pub fn decide(&self, failed: bool, latest: Option<u32>, restarts: u32) -> OnExit {
        if !(failed && self.on_failure) {
            return OnExit::Leave(Leave::Done);
        }
        let Some(cp) = latest else {
            return OnExit::Leave(Leave::NoCheckpoint);
        };
        if restarts >= self.max_restarts {
            return OnExit::Leave(Leave::MaxRestarts(restarts));
        }
        OnExit::Restart(cp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::Signal;
    use nix::unistd::Pid;

    #[test]
    fn young() {
        // C = 2 s, M = 1 h: sqrt(2 * 2 * 3600) = 120 s.
        let i = young_interval(Duration::from_secs(2), Duration::from_secs(3600));
        assert!((i.as_secs_f64() - 120.0).abs() < 1e-6, "{i:?}");
        // Never longer than the MTBF itself.
        let i = young_interval(Duration::from_secs(100), Duration::from_secs(10));
        assert_eq!(i, Duration::from_secs(10));
        // Never shorter than 50 ms.
        let i = young_interval(Duration::from_micros(1), Duration::from_secs(10));
        assert_eq!(i, Duration::from_millis(50));
    }

    #[test]
    fn fixed_schedule_ignores_cost() {
        let mut s = Schedule::new(Every::Fixed(Duration::from_secs(7)));
        assert_eq!(s.interval(), Duration::from_secs(7));
        assert_eq!(s.checkpointed(5_000_000), None);
        assert_eq!(s.interval(), Duration::from_secs(7));
    }

    #[test]
    fn auto_schedule_follows_smoothed_cost() {
        let mtbf = Duration::from_secs(3600);
        let mut s = Schedule::new(Every::Auto { mtbf });
        assert_eq!(s.interval(), Duration::from_secs(1));
        // First cost taken as is: 2 s -> 120 s.
        let y = s.checkpointed(2_000_000).unwrap();
        assert!((y.cost_secs - 2.0).abs() < 1e-9);
        assert!((s.interval().as_secs_f64() - 120.0).abs() < 1e-6);
        // Then 0.7 old + 0.3 new: 0.7*2 + 0.3*12 = 5 s -> sqrt(36000).
        let y = s.checkpointed(12_000_000).unwrap();
        assert!((y.cost_secs - 5.0).abs() < 1e-9, "{y:?}");
        let want = (2.0f64 * 5.0 * 3600.0).sqrt();
        assert!((s.interval().as_secs_f64() - want).abs() < 1e-6);
    }

    #[test]
    fn touch_windows() {
        let d = |s| Some(Duration::from_secs_f64(s));
        assert_eq!(touch_window("0.5", 0, 1, None).unwrap(), d(0.5));
        // Off when 0 or longer than the interval.
        assert_eq!(touch_window("0", 1 << 30, 1, None).unwrap(), None);
        assert_eq!(touch_window("3", 1 << 30, 1, Some(2.0)).unwrap(), None);
        // auto: off below 64 MiB.
        assert_eq!(touch_window("auto", 1 << 20, 1, None).unwrap(), None);
        // auto: 1 GiB written in 1 s: 1 s from disk + 8.59 s of link + 1 ms.
        let w = touch_window("auto", 1 << 30, 1_000_000, None)
            .unwrap()
            .unwrap();
        let want = 1.0 + (1u64 << 30) as f64 / 125e6 + 0.001;
        assert!((w.as_secs_f64() - want).abs() < 1e-6, "{w:?}");
        assert_eq!(
            touch_window("soon", 0, 1, None),
            Err(ParseError::TouchWindow("soon".into()))
        );
        assert!(touch_window("-1", 0, 1, None).is_err());
    }

    #[test]
    fn exit_codes() {
        let p = Pid::from_raw(7);
        assert_eq!(exit_code(&WaitStatus::Exited(p, 0)), (0, false));
        assert_eq!(exit_code(&WaitStatus::Exited(p, 3)), (3, true));
        let killed = WaitStatus::Signaled(p, Signal::SIGKILL, false);
        assert_eq!(exit_code(&killed), (137, true));
        assert_eq!(describe(&killed), "was killed by SIGKILL");
        assert_eq!(describe(&WaitStatus::Exited(p, 3)), "exited with status 3");
    }

    #[test]
    fn restart_policy() {
        let p = RestartPolicy {
            on_failure: true,
            max_restarts: 2,
        };
        assert_eq!(p.decide(false, Some(4), 0), OnExit::Leave(Leave::Done));
        assert_eq!(p.decide(true, None, 0), OnExit::Leave(Leave::NoCheckpoint));
        assert_eq!(p.decide(true, Some(4), 0), OnExit::Restart(4));
        assert_eq!(p.decide(true, Some(5), 1), OnExit::Restart(5));
        assert_eq!(
            p.decide(true, Some(5), 2),
            OnExit::Leave(Leave::MaxRestarts(2))
        );
        let off = RestartPolicy {
            on_failure: false,
            max_restarts: 2,
        };
        assert_eq!(off.decide(true, Some(4), 0), OnExit::Leave(Leave::Done));
    }
}
