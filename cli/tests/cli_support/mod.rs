//! Helpers for tests that run the `redbaton` binary as a real process.
#![allow(dead_code)]

use std::borrow::BorrowMut;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// The binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_redbaton")
}

/// `redbaton --url URL ARGS…` with REDIS_URL removed, output captured.
pub fn redbaton(url: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(bin());
    cmd.arg("--url")
        .arg(url)
        .args(args)
        .env_remove("REDIS_URL")
        .env_remove("REDBATON_LOCK")
        .env_remove("REDBATON_OWNER")
        .stdin(Stdio::null());
    cmd
}

/// Runs to completion within `limit`, killing it otherwise (then the test fails).
pub fn run_within(mut cmd: impl BorrowMut<Command>, limit: Duration) -> Output {
    let child = cmd
        .borrow_mut()
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn redbaton");
    let pid = child.id();
    let watchdog = std::thread::spawn(move || {
        let start = Instant::now();
        while start.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(50));
            if !Path::new(&format!("/proc/{pid}")).exists() || is_zombie(pid) {
                return false;
            }
        }
        unsafe_kill(pid);
        true
    });
    let output = child.wait_with_output().expect("wait for redbaton");
    let killed = watchdog.join().unwrap();
    assert!(!killed, "redbaton did not finish within {limit:?}");
    output
}

/// Runs with a 30 s bound and returns (exit code, stdout, stderr).
pub fn run(cmd: impl BorrowMut<Command>) -> (i32, String, String) {
    let out = run_within(cmd, Duration::from_secs(30));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Waits for `child` up to `limit`; `None` if it is still running.
pub fn wait_within(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn unsafe_kill(pid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
}

/// Sends `signal` (e.g. "TERM") to `pid`.
pub fn send_signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal} {pid}");
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let after = stat.rsplit_once(')')?.1;
            after.split_whitespace().next().map(|s| s == "Z")
        })
        .unwrap_or(false)
}

/// Whether `pid` is gone (or a zombie: terminated, not yet reaped).
pub fn process_gone(pid: u32) -> bool {
    !Path::new(&format!("/proc/{pid}")).exists() || is_zombie(pid)
}

/// Waits until `path` exists with non-empty content, up to `limit`.
pub fn wait_for_file(path: &Path, limit: Duration) -> String {
    let start = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if text.ends_with('\n') {
                return text;
            }
        }
        assert!(
            start.elapsed() < limit,
            "{} did not appear within {limit:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A fresh temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "redbaton-cli-{tag}-{}-{}",
            std::process::id(),
            crate::support::free_port()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process killed (SIGKILL) and reaped on drop, so a failing test leaves nothing
/// behind (redbaton's CMD follows through its parent-death signal).
pub struct KillOnDrop(pub Child);

impl std::ops::Deref for KillOnDrop {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}
