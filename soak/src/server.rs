//! The soak's own `redis-server`: a free loopback port, AOF with `appendfsync always` in the
//! run directory, so a SIGKILL and restart on the same port keeps every acknowledged write.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Server {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl Server {
    /// Starts a server whose data lives in `dir`.
    pub fn start(dir: &Path) -> Result<Server, String> {
        for _ in 0..5 {
            let mut server = Server {
                port: free_port(),
                dir: dir.to_owned(),
                child: None,
            };
            if server.spawn()? {
                return Ok(server);
            }
        }
        Err("could not start redis-server on a free port".into())
    }

    /// Spawns on `self.port`; `Ok(false)` when it exited (port taken) or never served.
    fn spawn(&mut self) -> Result<bool, String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("redis.log"))
            .map_err(|e| format!("redis.log: {e}"))?;
        let child = Command::new(&crate::servers::server().server_bin)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::from(
                log.try_clone().map_err(|e| format!("redis.log: {e}"))?,
            ))
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| {
                let bin = crate::servers::server().server_bin.display();
                format!("cannot run {bin} (is it installed?): {e}")
            })?;
        self.child = Some(child);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(30) {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                return Ok(false);
            }
            // The process started answers there itself and serves commands (not `-LOADING`
            // while it replays its AOF): the test kit's one readiness rule.
            let pid = self.child.as_ref().map_or(0, |c| c.id());
            if testkit::served_by(self.port, pid) {
                return Ok(true);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        Ok(false)
    }

    /// `redis://127.0.0.1:<port>`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// SIGKILL, then wait for the process.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server and starts it again on the same port from its AOF; returns once it
    /// serves commands again.
    pub fn restart(&mut self) -> Result<(), String> {
        self.kill();
        let started = Instant::now();
        while !self.spawn()? {
            if started.elapsed() > Duration::from_secs(30) {
                return Err(format!("could not restart redis-server on {}", self.port));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}
