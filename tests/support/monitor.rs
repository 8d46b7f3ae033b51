//! `MONITOR` of a test server, for tests of what reached the server and in which order (the
//! wire order of a wake-up, a hand-off).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use fred::prelude::*;

use super::RedisServer;

/// A `redis-cli monitor` of one server, its lines taken in as they arrive; killed on drop.
pub struct Monitor {
    child: Child,
    rx: Receiver<String>,
    /// Every line read so far, in the server's order.
    pub lines: Vec<String>,
}

impl Monitor {
    /// Starts MONITOR on `server` and returns once it is live: once a marker command sent
    /// through `raw` shows in its output (commands before that may be missing).
    pub async fn start(server: &RedisServer, raw: &fred::clients::Client) -> Monitor {
        let mut child = Command::new("redis-cli")
            .args(["-p", &server.port.to_string(), "monitor"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("redis-cli");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        // A blocking reader of its own: the lines keep coming while the test awaits.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut monitor = Monitor {
            child,
            rx,
            lines: Vec::new(),
        };
        let started = Instant::now();
        while !monitor.lines.iter().any(|l| l.contains("monitor-marker")) {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "MONITOR did not start"
            );
            let _: Option<String> = raw.get("monitor-marker").await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
            monitor.read();
        }
        monitor
    }

    /// Takes in the lines that arrived so far.
    pub fn read(&mut self) {
        self.lines.extend(self.rx.try_iter());
    }

    /// Takes in lines until `done` holds for them all, or `timeout` passed (the caller's
    /// assertions then say what is missing).
    pub async fn read_until(&mut self, timeout: Duration, done: impl Fn(&[String]) -> bool) {
        let started = Instant::now();
        self.read();
        while !done(&self.lines) && started.elapsed() < timeout {
            tokio::time::sleep(Duration::from_millis(20)).await;
            self.read();
        }
    }

    /// Stops MONITOR and takes in what it printed before it stopped.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.read();
    }

    /// Every line read so far that is a command: (client address, or `lua` inside a script;
    /// the command's words), in the server's order.
    pub fn commands(&self) -> Vec<(String, Vec<String>)> {
        self.lines.iter().filter_map(|l| command(l)).collect()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A line of MONITOR output as (client address, or `lua`; command words), the command's name
/// in lower case: fred sends commands in upper case, scripts call them in lower case.
pub fn command(line: &str) -> Option<(String, Vec<String>)> {
    let rest = line.split_once(" [")?.1;
    let (who, args) = rest.split_once("] ")?;
    let addr = who.split_whitespace().nth(1)?.to_owned();
    let mut words: Vec<String> = args
        .split("\" \"")
        .map(|w| w.trim_matches('"').to_owned())
        .collect();
    words[0] = words[0].to_ascii_lowercase();
    Some((addr, words))
}
