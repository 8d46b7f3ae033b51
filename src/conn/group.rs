//! Group commit for the scripts that change a lock.
//!
//! Sent one by one, every such script costs its own write and, with replica sync, its own
//! `WAIT` — which blocks the connection on the server until the replicas answer, so one slow
//! replica queues every lock of the process behind everyone's acknowledgement timeouts.
//! Here, scripts issued while an earlier group is in flight to the same slot (the one node of
//! a client that is not clustered) wait for it and then leave together: one pipeline, then
//! one `WAIT`, which covers every earlier write of its connection and so all of the group's.
//! There are no timers: a lone script leaves at once.
//!
//! A group's `WAIT` lasts no longer than the earliest acknowledgement deadline among its
//! members (each member's deadline runs from when it was issued), so a member kept waiting
//! behind an earlier group is answered by its own deadline, not by its own timeout after the
//! previous group's. A script issued while nothing is in flight leaves from its caller's task
//! (no hop to another: the uncontended path costs what it did); every later group runs in a
//! task of its own, so a caller that stops waiting cancels no one else's script.
//!
//! Each member's script is sent exactly once here; what a caller does with a refusal
//! (NOSCRIPT, a redirection) is [`crate::conn`]'s, per caller, as for a script sent alone.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use fred::error::{Error as FredError, ErrorKind};
use fred::interfaces::ClientLike;
use fred::types::config::Options;
use fred::types::{ClusterHash, CustomCommand, Value};
use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{acked, send, wait_command, Wait};

/// The shortest `WAIT` a group sends: `WAIT` with a timeout of 0 blocks for ever.
const MIN_WAIT: Duration = Duration::from_millis(1);

/// What one member's send produced: its script's reply, and the number of replicas the
/// group's `WAIT` reported if the member asked for one.
pub(crate) type Outcome = (Result<Value, FredError>, Option<Result<u32, FredError>>);

/// One script waiting for, or travelling in, a group.
struct Member {
    /// The `EVALSHA` arguments.
    command: Vec<Value>,
    /// The acknowledgement it needs, if any, and by when.
    wait: Option<(Wait, Instant)>,
    reply: oneshot::Sender<Outcome>,
}

/// The group-commit write path of one client.
pub(crate) struct Groups {
    redis: fred::clients::Client,
    /// Where the groups' tasks run (a caller may stop waiting outside any runtime context).
    runtime: tokio::runtime::Handle,
    /// A slot has an entry exactly while a group of it is in flight: the scripts issued
    /// meanwhile, its next group.
    queues: Mutex<HashMap<Option<u16>, Vec<Member>>>,
}

impl Groups {
    /// The write path over `redis`, its tasks on `runtime` (the client's).
    pub(crate) fn new(
        redis: fred::clients::Client,
        runtime: tokio::runtime::Handle,
    ) -> Arc<Groups> {
        Arc::new(Groups {
            redis,
            runtime,
            queues: Mutex::new(HashMap::new()),
        })
    }

    /// Sends `command` (an `EVALSHA`'s arguments) for `slot` (`None`: not clustered) in the
    /// next group, followed by that group's `WAIT` when `wait` is set.
    pub(crate) async fn send(
        self: &Arc<Self>,
        slot: Option<u16>,
        command: Vec<Value>,
        wait: Option<Wait>,
    ) -> Outcome {
        let queued = {
            let mut queues = self.queues.lock();
            match queues.get_mut(&slot) {
                Some(next) => {
                    let (reply, outcome) = oneshot::channel();
                    next.push(Member {
                        command,
                        wait: wait.map(|wait| (wait, Instant::now() + wait.timeout)),
                        reply,
                    });
                    Ok(outcome)
                }
                None => {
                    queues.insert(slot, Vec::new());
                    Err(command)
                }
            }
        };
        let outcome = match queued {
            Ok(outcome) => outcome,
            Err(command) => {
                // Nothing in flight: a group of one, sent from the caller's own task as a
                // plain send (no hop to another task, no pipeline to build). Scripts issued
                // meanwhile form the next group, which a task sends (see `Handover`), so a
                // caller that stops waiting here strands nobody.
                let handover = Handover {
                    groups: self.clone(),
                    slot,
                };
                let options = Options {
                    timeout: Some(Duration::ZERO),
                    ..Options::default()
                };
                let sent = send(&self.redis, &options, "EVALSHA", slot, command, wait, None).await;
                drop(handover);
                return sent;
            }
        };
        outcome.await.unwrap_or_else(|_| {
            // The task was dropped with the group (the runtime shutting down): it may have
            // been sent.
            (
                Err(FredError::new(ErrorKind::Canceled, "the group was dropped")),
                None,
            )
        })
    }

    /// After a group sent from a caller's task: hands the groups issued meanwhile to a task,
    /// or frees the slot when there are none.
    fn hand_over(self: &Arc<Self>, slot: Option<u16>) {
        let mut queues = self.queues.lock();
        if queues.get(&slot).is_some_and(Vec::is_empty) {
            queues.remove(&slot);
        } else {
            drop(queues);
            self.runtime.spawn(self.clone().drive(slot));
        }
    }

    /// Sends `slot`'s groups one after the other until none is waiting.
    async fn drive(self: Arc<Self>, slot: Option<u16>) {
        loop {
            let group = {
                let mut queues = self.queues.lock();
                let Some(next) = queues.get_mut(&slot) else {
                    return;
                };
                if next.is_empty() {
                    queues.remove(&slot);
                    return;
                }
                std::mem::take(next)
            };
            self.run(slot, group).await;
        }
    }

    /// Sends one group: its scripts in one pipeline, then one `WAIT` if any member needs it,
    /// back to back on the slot's connection. Members that need no acknowledgement are
    /// answered as soon as the scripts' replies are in.
    async fn run(&self, slot: Option<u16>, group: Vec<Member>) {
        let hash = slot.map_or(ClusterHash::Random, ClusterHash::Custom);
        // No timeout of fred's: the outcome of every script sent must be learnt (see
        // `Conn::call`); callers bound their own waits.
        let options = Options {
            timeout: Some(Duration::ZERO),
            ..Options::default()
        };
        let now = Instant::now();
        let wait = group
            .iter()
            .filter_map(|member| member.wait)
            .reduce(|(a, a_by), (b, b_by)| {
                let replicas = a.replicas.max(b.replicas);
                (Wait { replicas, ..a }, a_by.min(b_by))
            })
            .map(|(wait, by)| Wait {
                timeout: by.saturating_duration_since(now).max(MIN_WAIT),
                ..wait
            });
        let pipeline = self.redis.pipeline();
        let queued = pipeline.with_options(&options);
        let mut sent = Vec::with_capacity(group.len());
        for member in group {
            let command = CustomCommand::new_static("EVALSHA", hash.clone(), false);
            match queued.custom::<(), Value>(command, member.command).await {
                Ok(()) => sent.push((member.reply, member.wait.is_some())),
                // Never sent: the caller learns it did not run.
                Err(e) => {
                    let _ = member.reply.send((Err(e), None));
                }
            }
        }
        if sent.is_empty() {
            return;
        }
        let client = self.redis.with_options(&options);
        // The pipeline goes to the router on its first poll, and `join!` polls it before the
        // `WAIT`: both share the connection in that order, and fred never re-sends either
        // (one attempt), so `WAIT` cannot overtake the scripts.
        let scripts = async {
            let replies = pipeline.try_all::<Value>().await;
            // One error for a group of several is the pipeline's own (fred could not route
            // it, or its connection dropped): every member's.
            let whole = match replies.as_slice() {
                [Err(e)] if sent.len() > 1 => Some(e.clone()),
                _ => None,
            };
            let mut replies = replies.into_iter();
            let mut acking = Vec::new();
            for (reply, wants_ack) in sent {
                let outcome = match &whole {
                    Some(e) => Err(e.clone()),
                    None => replies.next().unwrap_or_else(|| {
                        Err(FredError::new(
                            ErrorKind::Protocol,
                            "no reply to the script",
                        ))
                    }),
                };
                if wants_ack {
                    acking.push((reply, outcome));
                } else {
                    let _ = reply.send((outcome, None));
                }
            }
            acking
        };
        let waited = async {
            match wait {
                Some(wait) => {
                    let (command, args) = wait_command(hash.clone(), wait);
                    Some(acked(client.custom::<Value, Value>(command, args).await))
                }
                None => None,
            }
        };
        let (acking, waited) = tokio::join!(scripts, waited);
        for (reply, outcome) in acking {
            let _ = reply.send((outcome, waited.clone()));
        }
    }
}

/// Hands a slot's later groups on when the group sent from a caller's task is done, or when
/// that caller stopped waiting for it.
struct Handover {
    groups: Arc<Groups>,
    slot: Option<u16>,
}

impl Drop for Handover {
    fn drop(&mut self) {
        self.groups.hand_over(self.slot);
    }
}
