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
        let mut child = Command::new(&super::servers::server().cli_bin)
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

/// Scripts a server ran, counted so that grouping cannot fold them: one per script a client
/// asked to run, whether it went alone or with others.
///
/// `INFO commandstats` counts calls: a group's scripts of one slot travel as ONE `EVALSHA` of
/// the composite script, so under load (when attempts happen to be in flight together) it
/// counts fewer than ran. Counting an inner command each script runs once would tie every
/// test to its scripts' text. MONITOR shows each call with its arguments, and a composite
/// call's arguments list its members (see `lua/conn/composite.lua`): a call of one script
/// counts one, a composite call counts its members — exactly what the calls counted before
/// scripts were grouped.
pub struct ScriptRuns {
    monitor: tokio::sync::Mutex<Monitor>,
    raw: fred::clients::Client,
    markers: std::sync::atomic::AtomicU64,
}

impl ScriptRuns {
    /// Starts counting on `server` (`raw`: a plain connection to it, for the markers).
    pub async fn start(server: &RedisServer, raw: &fred::clients::Client) -> ScriptRuns {
        ScriptRuns {
            monitor: tokio::sync::Mutex::new(Monitor::start(server, raw).await),
            raw: raw.clone(),
            markers: Default::default(),
        }
    }

    /// Scripts run since [`start`](ScriptRuns::start), up to now: everything the server ran
    /// before this call is counted (a marker command sent now must show in MONITOR first; its
    /// output comes in the server's order). Panics if MONITOR lags by more than 20 s.
    pub async fn count(&self) -> u64 {
        let n = self
            .markers
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let marker = format!("\"script-runs-marker-{n}\"");
        let _: Option<String> = self.raw.get(&marker[1..marker.len() - 1]).await.unwrap();
        let mut monitor = self.monitor.lock().await;
        monitor
            .read_until(Duration::from_secs(20), |lines| {
                lines.iter().rev().any(|l| l.ends_with(&marker))
            })
            .await;
        let upto = monitor.lines.iter().rposition(|l| l.ends_with(&marker));
        let upto = upto.expect("MONITOR shows the marker within 20 s");
        monitor.lines[..upto]
            .iter()
            .filter_map(|l| command(l))
            .map(|(addr, words)| runs(&addr, &words))
            .sum()
    }

    /// [`count`](ScriptRuns::count) once no script has run for `quiet` (waiters made their
    /// attempts and parked). Panics when scripts still run after `bound`.
    pub async fn settled(&self, quiet: Duration, bound: Duration) -> u64 {
        let start = Instant::now();
        let mut last = self.count().await;
        let mut unchanged_since = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let now = self.count().await;
            if now != last {
                last = now;
                unchanged_since = Instant::now();
            } else if unchanged_since.elapsed() >= quiet {
                return last;
            }
            assert!(
                start.elapsed() < bound,
                "scripts still running after {bound:?}: waiters never parked (polling?)"
            );
        }
    }
}

/// Scripts the command `words` sent by `addr` ran: a script call from a client runs one, a
/// composite call (the layout of `lua/conn/composite.lua`: its keys, then per member its
/// SHA1, number of keys, number of arguments and arguments) one per member; commands inside
/// scripts (`lua`) and other commands none.
fn runs(addr: &str, words: &[String]) -> u64 {
    if addr == "lua"
        || !matches!(
            words[0].as_str(),
            "evalsha" | "eval" | "evalsha_ro" | "eval_ro"
        )
    {
        return 0;
    }
    if words.get(1).map(String::as_str) != Some(redbaton::Client::composite_sha1()) {
        return 1;
    }
    let number = |at: usize| -> usize {
        words
            .get(at)
            .and_then(|w| w.parse().ok())
            .unwrap_or_else(|| panic!("a composite call without its layout: {words:?}"))
    };
    let mut at = 3 + number(2);
    let mut members = 0;
    while at < words.len() {
        at += 3 + number(at + 2);
        members += 1;
    }
    members
}
