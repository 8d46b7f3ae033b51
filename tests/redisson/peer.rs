//! One `Driver serve` process of the real Java Redisson (interop/java): a Redisson client (one
//! uuid) whose threads the tests pick by number. Commands and replies: the header of
//! interop/java/src/main/java/redbaton/interop/Commands.java.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{oneshot, Mutex};

use crate::support::java_peer::{driver_command, QUICK_JVM};

/// An exception a Java call threw: its class's simple name and message.
#[derive(Debug, Clone)]
pub struct JavaError {
    pub class: String,
    pub message: String,
}

/// A successful call's reply: its value and when it ran (wall clock, ms).
#[derive(Debug, Clone)]
pub struct Done {
    pub value: Value,
    /// Before the call.
    pub t0: f64,
    /// After it returned.
    pub t1: f64,
}

pub type Reply = Result<Done, JavaError>;

pub fn hex(name: &str) -> String {
    name.bytes().map(|b| format!("{b:02x}")).collect()
}

/// A duration in ms as the driver reads it; `None` is `-`.
fn ms(d: Option<Duration>) -> String {
    d.map_or("-".to_owned(), |d| d.as_millis().to_string())
}

pub struct Java {
    child: Mutex<Child>,
    stdin: Mutex<ChildStdin>,
    pending: Arc<std::sync::Mutex<HashMap<u64, oneshot::Sender<Reply>>>>,
    next: AtomicU64,
    /// The Redisson client's uuid: owner fields are `<id>:<thread id>`.
    pub id: String,
    /// The Redisson version it runs.
    pub version: String,
}

impl Java {
    /// Starts a driver with the connection options `connection` (`--nodes …`, see Driver.java)
    /// and Redisson's `lockWatchdogTimeout` `watchdog`.
    pub async fn start(connection: &[String], watchdog: Duration) -> Arc<Java> {
        let mut cmd = Command::from(driver_command(QUICK_JVM, "serve"));
        cmd.args(connection)
            .args(["--watchdog", &watchdog.as_millis().to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn java");
        let stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("the Java driver did not start within 60 s")
            .unwrap()
            .expect("the Java driver exited before it was ready");
        let ready: Value = serde_json::from_str(&ready)
            .unwrap_or_else(|e| panic!("unexpected first line from the Java driver: {ready}: {e}"));
        let pending: Arc<std::sync::Mutex<HashMap<u64, oneshot::Sender<Reply>>>> =
            Default::default();
        let routes = pending.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(reply) = serde_json::from_str::<Value>(&line) else {
                    eprintln!("java driver: {line}");
                    continue;
                };
                let Some(id) = reply["id"].as_str().and_then(|id| id.parse::<u64>().ok()) else {
                    continue;
                };
                let result = if reply["ok"] == true {
                    Ok(Done {
                        value: reply["value"].clone(),
                        t0: reply["t0"].as_f64().unwrap_or(0.0),
                        t1: reply["t1"].as_f64().unwrap_or(0.0),
                    })
                } else {
                    Err(JavaError {
                        class: reply["error"].as_str().unwrap_or("").to_owned(),
                        message: reply["message"].as_str().unwrap_or("").to_owned(),
                    })
                };
                if let Some(tx) = routes.lock().unwrap().remove(&id) {
                    let _ = tx.send(result);
                }
            }
            // The process ended: every pending call fails (its sender is dropped).
            routes.lock().unwrap().clear();
        });
        Arc::new(Java {
            child: Mutex::new(child),
            stdin: Mutex::new(stdin),
            pending,
            next: AtomicU64::new(1),
            id: ready["id"].as_str().expect("the client's id").to_owned(),
            version: ready["version"].as_str().unwrap_or("").to_owned(),
        })
    }

    /// Sends `command` (without its id) and waits for its reply.
    pub async fn call(&self, command: &str) -> Reply {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap().insert(id, tx);
        let mut stdin = self.stdin.lock().await;
        stdin
            .write_all(format!("{id} {command}\n").as_bytes())
            .await
            .expect("write to the Java driver");
        stdin.flush().await.expect("flush to the Java driver");
        drop(stdin);
        rx.await.unwrap_or_else(|_| {
            panic!("the Java driver exited while running `{command}`");
        })
    }

    /// [`call`](Self::call), which must succeed.
    pub async fn ok(&self, command: &str) -> Done {
        self.call(command)
            .await
            .unwrap_or_else(|e| panic!("java `{command}`: {e:?}"))
    }

    /// [`call`](Self::call) in a task of its own (a waiting acquire).
    pub fn spawn(self: &Arc<Self>, command: String) -> tokio::task::JoinHandle<Reply> {
        let java = self.clone();
        tokio::spawn(async move { java.call(&command).await })
    }

    /// The handle on lock `name` of kind `kind` (`lock`, `fair`, `read`, `write`, `fenced`;
    /// `multi` over [`multi_name`]) as seen by thread `thread`.
    pub fn lock(self: &Arc<Self>, thread: u32, kind: &str, name: &str) -> JavaLock {
        let name = if kind == "multi" {
            name.to_owned()
        } else {
            hex(name)
        };
        JavaLock {
            java: self.clone(),
            thread,
            kind: kind.to_owned(),
            name,
        }
    }

    /// The owner field of thread `thread`: `<client uuid>:<Java thread id>`.
    pub async fn owner(&self, thread: u32) -> String {
        let tid = self.ok(&format!("tid {thread}")).await.value;
        format!("{}:{tid}", self.id)
    }

    /// SIGKILL, and wait for the process to end.
    pub async fn kill(&self) {
        let mut child = self.child.lock().await;
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
}

/// The name of a `multi` lock over `parts` (`(kind, name)` each) for [`Java::lock`].
pub fn multi_name(parts: &[(&str, &str)]) -> String {
    parts
        .iter()
        .map(|(kind, name)| format!("{kind}/{}", hex(name)))
        .collect::<Vec<_>>()
        .join(",")
}

/// A Java lock handle of one thread.
#[derive(Clone)]
pub struct JavaLock {
    java: Arc<Java>,
    thread: u32,
    kind: String,
    name: String,
}

impl JavaLock {
    fn command(&self, op: &str, rest: &str) -> String {
        format!("{op} {} {} {} {rest}", self.thread, self.kind, self.name)
    }

    /// `lock()` / `lock(lease)`: returns when it acquired (ms).
    pub async fn lock(&self, lease: Option<Duration>) -> f64 {
        self.java.ok(&self.command("lock", &ms(lease))).await.t1
    }

    /// `lock()` / `lock(lease)` in the background.
    pub fn spawn_lock(&self, lease: Option<Duration>) -> tokio::task::JoinHandle<Reply> {
        self.java.spawn(self.command("lock", &ms(lease)))
    }

    /// `tryLock()` (no wait, no lease), `tryLock(wait)` or `tryLock(wait, lease)`.
    pub async fn try_lock(&self, wait: Option<Duration>, lease: Option<Duration>) -> bool {
        let done = self
            .java
            .ok(&self.command("try", &format!("{} {}", ms(wait), ms(lease))))
            .await;
        done.value.as_bool().expect("tryLock's boolean")
    }

    /// `tryLock(wait, lease)` in the background.
    pub fn spawn_try(
        &self,
        wait: Option<Duration>,
        lease: Option<Duration>,
    ) -> tokio::task::JoinHandle<Reply> {
        self.java
            .spawn(self.command("try", &format!("{} {}", ms(wait), ms(lease))))
    }

    /// `unlock()`; its reply's `t0` is when it was called.
    pub async fn unlock(&self) -> Reply {
        self.java.call(&self.command("unlock", "")).await
    }

    pub async fn force_unlock(&self) -> bool {
        self.value("force").await.as_bool().unwrap()
    }

    pub async fn hold_count(&self) -> i64 {
        self.value("count").await.as_i64().unwrap()
    }

    pub async fn is_locked(&self) -> bool {
        self.value("locked").await.as_bool().unwrap()
    }

    pub async fn is_held(&self) -> bool {
        self.value("held").await.as_bool().unwrap()
    }

    /// `remainTimeToLive()`: ms, -2 when absent.
    pub async fn ttl(&self) -> i64 {
        self.value("ttl").await.as_i64().unwrap()
    }

    async fn value(&self, op: &str) -> Value {
        self.java.ok(&self.command(op, "")).await.value
    }
}
