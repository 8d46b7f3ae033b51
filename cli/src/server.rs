//! The demo's private `redis-server`: a free loopback port, no persistence, stopped on drop.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::exit::{self, Failure};

/// Said when `redis-server` is missing.
const INSTALL_HINT: &str = "redis-server is not installed; install it (Debian/Ubuntu: \
`sudo apt-get install redis-server`, or `bash scripts/install-redis.sh` in a checkout; \
macOS: `brew install redis`) or point the demo at a server with --url";

pub struct PrivateRedis {
    child: Child,
    dir: PathBuf,
    pub url: String,
}

fn free_port() -> Result<u16, Failure> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| Failure::new(exit::SOFTWARE, format!("no free loopback port: {e}")))
}

impl PrivateRedis {
    /// Starts `redis-server` on a free port of 127.0.0.1 and waits until it is ready: until
    /// the process started answers there itself (`crate::ready`), not until the port accepts.
    pub fn start() -> Result<PrivateRedis, Failure> {
        let dir = std::env::temp_dir().join(format!("redbaton-demo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| {
            Failure::new(
                exit::SOFTWARE,
                format!("cannot create {}: {e}", dir.display()),
            )
        })?;
        for _ in 0..5 {
            let port = free_port()?;
            let mut command = Command::new("redis-server");
            command
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(&dir)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            // SAFETY: only the async-signal-safe prctl runs between fork and exec.
            unsafe {
                command.pre_exec(|| Ok(nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?));
            }
            let child = match command.spawn() {
                Ok(child) => child,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    let _ = std::fs::remove_dir_all(&dir);
                    return Err(Failure::new(exit::UNAVAILABLE, INSTALL_HINT));
                }
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&dir);
                    return Err(Failure::new(
                        exit::UNAVAILABLE,
                        format!("cannot start redis-server: {e}"),
                    ));
                }
            };
            let mut server = PrivateRedis {
                child,
                dir: dir.clone(),
                url: format!("redis://127.0.0.1:{port}"),
            };
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(10) {
                if let Ok(Some(_)) = server.child.try_wait() {
                    break; // the port was taken meanwhile: try another
                }
                if crate::ready::served_by(port, server.child.id()) {
                    return Ok(server);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            server.stop();
        }
        let _ = std::fs::remove_dir_all(&dir);
        Err(Failure::new(
            exit::UNAVAILABLE,
            "redis-server did not start on a free loopback port",
        ))
    }

    fn stop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            Signal::SIGTERM,
        );
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
