//! `stasis agent` and `stasis cluster` for the tests: an agent per host,
//! the coordinator's commands, and the end of a workload an agent restored.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use super::*;

pub const TOKEN: &str = "a-cluster-token-for-the-tests-0042";

/// A `stasis agent`, stopped with SIGTERM when dropped (it must exit 0).
pub struct Agent {
    child: Option<Child>,
    pub addr: String,
    pub dir: PathBuf,
}

impl Agent {
    /// Starts an agent storing under `dir`, listening on `listen`, in
    /// network namespace `netns` if given.
    pub fn start(dir: &Path, token_file: &Path, listen: &str, netns: Option<&str>) -> Agent {
        Agent::start_with(dir, token_file, listen, netns, &[])
    }

    /// [`Agent::start`] with environment variables (`STASIS_FAULT`...).
    pub fn start_with(
        dir: &Path,
        token_file: &Path,
        listen: &str,
        netns: Option<&str>,
        env: &[(&str, &str)],
    ) -> Agent {
        Agent::start_args(dir, token_file, listen, netns, env, &[])
    }

    /// [`Agent::start_with`] with further arguments (`--name`...).
    pub fn start_args(
        dir: &Path,
        token_file: &Path,
        listen: &str,
        netns: Option<&str>,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> Agent {
        let mut c = stasis_in(netns);
        c.envs(env.iter().copied())
            .args(["agent", "--json", "--listen", listen])
            .args(args)
            .arg("--token-file")
            .arg(token_file)
            .arg("-D")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        close_inherited_fds(&mut c);
        let mut child = c.spawn().expect("starting stasis agent");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("agent said {line:?}: {e}"));
        Agent {
            child: Some(child),
            addr: v["listening"].as_str().unwrap().to_string(),
            dir: dir.to_path_buf(),
        }
    }

    /// SIGKILLs the agent (a host crash, for the agent's part).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM; the agent must exit 0.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let st = c.wait().unwrap();
            assert_eq!(st.code(), Some(0), "stasis agent after SIGTERM: {st}");
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A 0600 token file in `dir`.
pub fn token_file(dir: &Path, token: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let f = dir.join("token");
    std::fs::write(&f, token).unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    f
}

/// `stasis cluster ARGS... --token-file F --json`.
pub fn cluster(token_file: &Path, args: &[&str]) -> std::process::Output {
    cluster_in(None, token_file, args)
}

/// [`cluster`] run in network namespace `netns` (a host of the job).
pub fn cluster_in(netns: Option<&str>, token_file: &Path, args: &[&str]) -> std::process::Output {
    let mut c = stasis_in(netns);
    c.arg("cluster")
        .args(args)
        .arg("--token-file")
        .arg(token_file)
        .arg("--json")
        .output()
        .expect("stasis cluster")
}

/// SIGTERM to a workload that the agent restored (its child, not ours):
/// waits until it is gone and requires `PASS` as its last line.
pub fn finish_pass_restored(w: &Workload) {
    // SAFETY: signalling our workload.
    unsafe { libc::kill(w.pid, libc::SIGTERM) };
    wait_until(
        Duration::from_secs(60),
        "the restored workload to end",
        || !alive(w.pid),
    );
    let out = w.out();
    assert_eq!(
        out.lines().last(),
        Some("PASS"),
        "{}: output:\n{out}",
        w.name
    );
}

/// `--target ADDR=PID` for each agent and the PID of its tree.
pub fn target_args(agents: &[Agent], pids: &[i32]) -> Vec<String> {
    agents
        .iter()
        .zip(pids)
        .flat_map(|(a, p)| ["--target".to_string(), format!("{}={p}", a.addr)])
        .collect()
}

/// `--target ADDR` for each agent.
pub fn agent_target_args(agents: &[Agent]) -> Vec<String> {
    agents
        .iter()
        .flat_map(|a| ["--target".to_string(), a.addr.clone()])
        .collect()
}
