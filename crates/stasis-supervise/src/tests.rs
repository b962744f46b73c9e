//! The loop against a scripted host: no process, no root.

use std::collections::VecDeque;

use nix::sys::signal::Signal;
use nix::unistd::Pid;

use super::*;

#[derive(Debug, Clone, Copy, PartialEq)]
struct Dump {
    n: u32,
    total_us: u64,
}

impl Dumped for Dump {
    fn checkpoint(&self) -> u32 {
        self.n
    }
    fn total_us(&self) -> u64 {
        self.total_us
    }
}

/// What the fake's next checkpoint does.
enum Cp {
    Ok(u64),
    JobExited(WaitStatus),
    Fail,
}

#[derive(Default)]
struct Fake {
    /// What each wait returns, in order (the test fails when it runs out).
    waits: VecDeque<Wake<u32>>,
    checkpoints: VecDeque<Cp>,
    restore_fails: bool,
    /// (deadline - the time of the call) of each wait.
    waited: Vec<Duration>,
    log: Vec<String>,
    events: Vec<Event<Dump, u32, ()>>,
    latest: Option<u32>,
    pid: i32,
}

impl Fake {
    fn new(waits: Vec<Wake<u32>>, checkpoints: Vec<Cp>) -> Fake {
        Fake {
            waits: waits.into(),
            checkpoints: checkpoints.into(),
            pid: 100,
            ..Default::default()
        }
    }
}

impl Host for Fake {
    type Dump = Dump;
    type Touch = u32;
    type Restored = ();
    type Request = u32;

    fn start(&mut self) -> Result<i32, HostError> {
        self.log.push(format!("start {}", self.pid));
        Ok(self.pid)
    }
    fn answer(&mut self, to: &u32, a: &Answer) {
        self.log.push(format!("answer {to} {a:?}"));
    }
    fn wait(&mut self, pid: i32, deadline: Instant) -> Result<Wake<u32>, HostError> {
        assert_eq!(pid, self.pid, "waits for the current job");
        let now = Instant::now();
        self.waited.push(deadline.saturating_duration_since(now));
        let w = self.waits.pop_front().ok_or("script ended")?;
        // A short deadline passes for real (touch windows).
        if w == Wake::Due && deadline - now < Duration::from_millis(200) {
            std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
        }
        Ok(w)
    }
    fn checkpoint(&mut self, pid: i32) -> Checkpointed<Dump> {
        self.log.push(format!("checkpoint {pid}"));
        match self.checkpoints.pop_front() {
            Some(Cp::Ok(total_us)) => {
                let n = self.latest.map_or(1, |n| n + 1);
                self.latest = Some(n);
                Checkpointed::Done(Dump { n, total_us })
            }
            Some(Cp::JobExited(s)) => Checkpointed::JobExited(s),
            Some(Cp::Fail) | None => Checkpointed::Failed("dump failed".into()),
        }
    }
    fn restored_bytes(&mut self, _: u32) -> Result<u64, HostError> {
        Ok(1 << 30)
    }
    fn record_touch(&mut self, n: u32, w: Duration) -> Result<u32, HostError> {
        self.log.push(format!("touch {n} {}ms", w.as_millis()));
        Ok(n)
    }
    fn reap_orphans(&mut self) {
        self.log.push("reap".into());
    }
    fn latest(&mut self) -> Option<u32> {
        self.latest
    }
    fn restore(&mut self, n: u32) -> Result<(i32, ()), HostError> {
        self.log.push(format!("restore {n}"));
        if self.restore_fails {
            return Err("no memory".into());
        }
        self.pid += 1;
        Ok((self.pid, ()))
    }
    fn reset_tracking(&mut self) {
        self.log.push("reset".into());
    }
    fn report(&mut self, e: Event<Dump, u32, ()>) {
        self.events.push(e);
    }
}

fn exited(code: i32) -> Wake<u32> {
    Wake::Exited(WaitStatus::Exited(Pid::from_raw(1), code))
}

fn killed() -> WaitStatus {
    WaitStatus::Signaled(Pid::from_raw(1), Signal::SIGKILL, false)
}

fn config(every: Every, restarts: Option<u32>) -> Config {
    Config {
        every,
        restart: RestartPolicy {
            on_failure: restarts.is_some(),
            max_restarts: restarts.unwrap_or(3),
        },
        touch_window: None,
    }
}

const HOUR: Duration = Duration::from_secs(3600);

/// `d` is `want` up to the time the loop itself took (generous).
fn about(d: Duration, want: Duration) -> bool {
    d <= want && want - d < Duration::from_secs(5)
}

#[test]
fn fixed_interval_until_success() {
    let mut h = Fake::new(
        vec![Wake::Due, Wake::Due, exited(0)],
        vec![Cp::Ok(1000), Cp::Ok(1000)],
    );
    let code = supervise(&mut h, config(Every::Fixed(HOUR), Some(3))).unwrap();
    assert_eq!(code, 0);
    assert_eq!(
        h.log,
        ["start 100", "checkpoint 100", "checkpoint 100", "reap"]
    );
    assert!(h.waited.iter().all(|d| about(*d, HOUR)), "{:?}", h.waited);
    assert!(matches!(h.events[0], Event::Started { pid: 100 }));
    assert!(matches!(
        h.events[1],
        Event::Checkpoint {
            dump: Dump { n: 1, .. },
            interval: HOUR,
            young: None
        }
    ));
    assert!(matches!(
        h.events[3],
        Event::Exited {
            pid: 100,
            code: 0,
            why: Leave::Done,
            ..
        }
    ));
}

#[test]
fn auto_interval_is_youngs() {
    let mtbf = Duration::from_secs(7200);
    let mut h = Fake::new(
        vec![Wake::Due, Wake::Due, exited(0)],
        vec![Cp::Ok(2_000_000), Cp::Fail],
    );
    // The second checkpoint fails: the interval stays.
    supervise(&mut h, config(Every::Auto { mtbf }, None)).unwrap();
    let young = young_interval(Duration::from_secs(2), mtbf);
    assert!(about(h.waited[0], Duration::from_secs(1)), "{:?}", h.waited);
    assert!(about(h.waited[1], young), "{:?} vs {young:?}", h.waited);
    assert!(about(h.waited[2], young), "{:?} vs {young:?}", h.waited);
    let Event::Checkpoint {
        interval, young: y, ..
    } = &h.events[1]
    else {
        panic!("{:?}", h.events[1]);
    };
    assert_eq!(*interval, young);
    assert_eq!(
        *y,
        Some(Young {
            cost_secs: 2.0,
            mtbf
        })
    );
    assert!(matches!(h.events[2], Event::CheckpointFailed(_)));
}

#[test]
fn failure_restores_the_latest_checkpoint() {
    let mut h = Fake::new(
        vec![Wake::Due, Wake::Exited(killed()), Wake::Due, exited(0)],
        vec![Cp::Ok(10), Cp::Ok(10)],
    );
    let code = supervise(&mut h, config(Every::Fixed(HOUR), Some(3))).unwrap();
    assert_eq!(code, 0);
    assert_eq!(
        h.log,
        [
            "start 100",
            "checkpoint 100",
            "reap",
            "restore 1",
            "reset",
            "checkpoint 101",
            "reap"
        ]
    );
    assert!(matches!(
        h.events[2],
        Event::Restored {
            failed_pid: 100,
            code: 137,
            checkpoint: 1,
            pid: 101,
            restart: 1,
            ..
        }
    ));
}

#[test]
fn restarts_stop_at_the_maximum() {
    let mut h = Fake::new(vec![Wake::Due, exited(2), exited(2)], vec![Cp::Ok(10)]);
    let code = supervise(&mut h, config(Every::Fixed(HOUR), Some(1))).unwrap();
    assert_eq!(code, 2);
    assert_eq!(h.log.iter().filter(|l| l.starts_with("restore")).count(), 1);
    assert!(matches!(
        h.events.last(),
        Some(Event::Exited {
            pid: 101,
            code: 2,
            why: Leave::MaxRestarts(1),
            ..
        })
    ));
}

#[test]
fn no_checkpoint_no_restart() {
    let mut h = Fake::new(vec![Wake::Exited(killed())], vec![]);
    let code = supervise(&mut h, config(Every::Fixed(HOUR), Some(3))).unwrap();
    assert_eq!(code, 137);
    assert!(matches!(
        h.events.last(),
        Some(Event::Exited {
            why: Leave::NoCheckpoint,
            ..
        })
    ));
}

#[test]
fn job_ending_during_a_dump_is_restored_and_checkpointed_at_once() {
    let mut h = Fake::new(
        vec![Wake::Due, Wake::Due, Wake::Due, exited(0)],
        vec![Cp::Ok(10), Cp::JobExited(killed()), Cp::Ok(10)],
    );
    supervise(&mut h, config(Every::Fixed(HOUR), Some(3))).unwrap();
    assert!(about(h.waited[1], HOUR), "{:?}", h.waited);
    // Right after the restore: due now.
    assert!(h.waited[2] < Duration::from_secs(5), "{:?}", h.waited);
    assert_eq!(h.log[3..6], ["reap", "restore 1", "reset"]);
}

#[test]
fn failed_restore_ends_the_run() {
    let mut h = Fake::new(vec![Wake::Due, exited(1)], vec![Cp::Ok(10)]);
    h.restore_fails = true;
    let e = supervise(&mut h, config(Every::Fixed(HOUR), Some(3))).unwrap_err();
    assert!(
        matches!(e, SuperviseError::Restore { checkpoint: 1, .. }),
        "{e}"
    );
    assert_eq!(e.to_string(), "restoring checkpoint 1 after the job failed");
}

#[test]
fn touch_window_after_each_checkpoint() {
    let mut c = config(Every::Fixed(HOUR), None);
    c.touch_window = Some("0.02".into());
    let mut h = Fake::new(vec![Wake::Due, Wake::Due, exited(0)], vec![Cp::Ok(10)]);
    supervise(&mut h, c).unwrap();
    // The second wait ends with the window (20 ms), not the interval.
    assert!(h.waited[1] <= Duration::from_millis(20), "{:?}", h.waited);
    assert_eq!(
        h.log,
        ["start 100", "checkpoint 100", "touch 1 20ms", "reap"]
    );
    assert!(matches!(
        h.events[2],
        Event::TouchSet {
            checkpoint: 1,
            result: Ok(1)
        }
    ));
}

#[test]
fn bad_touch_window_is_an_error() {
    let mut c = config(Every::Fixed(HOUR), None);
    c.touch_window = Some("soon".into());
    let mut h = Fake::new(vec![Wake::Due], vec![Cp::Ok(10)]);
    let e = supervise(&mut h, c).unwrap_err();
    assert!(matches!(e, SuperviseError::TouchWindow(_)), "{e}");
}

#[test]
fn a_requested_checkpoint_is_answered_once_committed_and_again_when_restored() {
    let mut h = Fake::new(
        vec![
            Wake::Requested(vec![7, 8]),
            Wake::Due,
            Wake::Exited(killed()),
            Wake::Requested(vec![9]),
            Wake::Exited(killed()),
            exited(0),
        ],
        vec![Cp::Ok(10), Cp::Ok(10), Cp::Ok(10)],
    );
    let cfg = Config {
        every: Every::Fixed(Duration::from_secs(3600)),
        restart: RestartPolicy {
            on_failure: true,
            max_restarts: 3,
        },
        touch_window: None,
    };
    assert_eq!(supervise(&mut h, cfg).unwrap(), 0);
    let log: Vec<&str> = h.log.iter().map(String::as_str).collect();
    assert_eq!(
        log,
        [
            "start 100",
            "checkpoint 100",
            "answer 7 Committed(1)",
            "answer 8 Committed(1)",
            // A periodic checkpoint answers nobody; restoring it neither.
            "checkpoint 100",
            "reap",
            "restore 2",
            "reset",
            "checkpoint 101",
            "answer 9 Committed(3)",
            "reap",
            "restore 3",
            "reset",
            "answer 9 Restored(3)",
            "reap",
        ]
    );
}

#[test]
fn a_failed_requested_checkpoint_is_answered_failed() {
    let mut h = Fake::new(vec![Wake::Requested(vec![5]), exited(0)], vec![Cp::Fail]);
    let cfg = Config {
        every: Every::Fixed(Duration::from_secs(3600)),
        restart: RestartPolicy {
            on_failure: false,
            max_restarts: 0,
        },
        touch_window: None,
    };
    assert_eq!(supervise(&mut h, cfg).unwrap(), 0);
    assert!(
        h.log
            .contains(&"answer 5 Failed(\"dump failed\")".to_string()),
        "{:?}",
        h.log
    );
    assert!(matches!(h.events[1], Event::CheckpointFailed(_)));
}
