//! Group commit for the scripts that change a lock.
//!
//! Sent one by one, every such script costs its own write and, with replica sync, its own
//! `WAIT` — which blocks the connection on the server until the replicas answer, so one slow
//! replica queues every lock of the process behind everyone's acknowledgement timeouts.
//! Here, scripts issued while an earlier group is in flight to the same node wait for it and
//! then leave together, written back to back, followed by one `WAIT`, which covers every
//! earlier write of its connection and so all of the group's. There are no timers: a lone
//! script leaves at once.
//!
//! Groups are per node, not per slot: on a cluster every slot of a primary shares its one
//! connection, where a `WAIT` blocks everything behind it, so per-slot groups would queue each
//! slot's `WAIT` behind the others'. The node is the slot's owner in fred's cached slot map,
//! and a group's scripts and `WAIT` are pinned to that node's connection. A script whose slot
//! has moved since is refused there (MOVED) and did not run; its caller sends it again as it
//! would a script sent alone. A slot with no known owner yet is sent alone, by its slot.
//!
//! A group's `WAIT` lasts no longer than the earliest acknowledgement deadline among its
//! members (each member's deadline runs from when it was issued), so a member kept waiting
//! behind an earlier group is answered by its own deadline, not by its own timeout after the
//! previous group's. A script issued while nothing is in flight leaves from its caller's task
//! (no hop to another: the uncontended path costs what it did); every later group runs in a
//! task of its own, so a caller that stops waiting cancels no one else's script.
//!
//! On a server that is not a cluster, a group's members whose scripts the [`Composite`] holds
//! go as one call of it (see [`Groups::calls`]), up to [`MAX_MEMBERS`] a call: one
//! command for fred and one script call for the server instead of one each. Each member is
//! answered its own script's reply or error, as if it had gone alone. A refusal of the whole
//! call (a redirection) or its loss (a broken connection) is every member's, as it would have
//! been for each alone; NOSCRIPT for the composite (nothing ran) loads it and sends it once
//! more, with its own `WAIT`.
//!
//! Otherwise each member's script is sent exactly once here; what a caller does with a refusal
//! (NOSCRIPT, a redirection) is [`crate::conn`]'s, per caller, as for a script sent alone.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use fred::error::{Error as FredError, ErrorKind};
use fred::interfaces::ClientLike;
use fred::interfaces::ClusterInterface;
use fred::types::config::{Options, Server};
use fred::types::{ClusterHash, CustomCommand, Value};
use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::composite::{split_reply, Composite, MAX_MEMBERS};
use super::replication::Wait;
use super::send::{acked, send, wait_command, Outcome};
use crate::error::{is_noscript, is_unrouted};

/// The shortest `WAIT` a group sends: `WAIT` with a timeout of 0 blocks for ever.
const MIN_WAIT: Duration = Duration::from_millis(1);

/// One script waiting for, or travelling in, a group.
struct Member {
    /// Its keys' slot (`None`: not clustered).
    slot: Option<u16>,
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
    /// A node (`None`: the one node of a client that is not clustered) has an entry exactly
    /// while a group of it is in flight: the scripts issued meanwhile, its next group.
    queues: Mutex<Queues>,
    /// The script that runs several members in one call.
    composite: &'static Composite,
}

impl Groups {
    /// The write path over `redis`, its tasks on `runtime` (the client's), members of one
    /// slot sharing calls of `composite`.
    pub(crate) fn new(
        redis: fred::clients::Client,
        runtime: tokio::runtime::Handle,
        composite: &'static Composite,
    ) -> Arc<Groups> {
        Arc::new(Groups {
            redis,
            runtime,
            queues: Mutex::new(Queues::default()),
            composite,
        })
    }

    /// The composite script its groups use.
    pub(crate) fn composite(&self) -> &'static Composite {
        self.composite
    }

    /// Sends `command` (an `EVALSHA`'s arguments) for `slot` (`None`: not clustered) in the
    /// next group of the node that serves it, followed by that group's `WAIT` when `wait` is
    /// set.
    pub(crate) async fn send(
        self: &Arc<Self>,
        slot: Option<u16>,
        command: Vec<Value>,
        wait: Option<Wait>,
    ) -> Outcome {
        let node = match slot {
            None => None,
            Some(slot) => {
                let owner = self
                    .redis
                    .cached_cluster_state()
                    .and_then(|state| state.get_server(slot).cloned());
                if owner.is_none() {
                    // No slot map yet: alone, routed by its slot; a redirection is its
                    // caller's.
                    return send(
                        &self.redis,
                        &unbounded(),
                        "EVALSHA",
                        Some(slot),
                        command,
                        wait,
                        None,
                    )
                    .await;
                }
                owner
            }
        };
        let queued = {
            let mut queues = self.queues.lock();
            match queues.get_mut(&node) {
                Some(next) => {
                    let (reply, outcome) = oneshot::channel();
                    next.push(Member {
                        slot,
                        command,
                        wait: wait.map(|wait| (wait, Instant::now() + wait.timeout)),
                        reply,
                    });
                    Ok(outcome)
                }
                None => {
                    queues.insert(node.clone(), Vec::new());
                    Err(command)
                }
            }
        };
        let outcome = match queued {
            Ok(outcome) => outcome,
            Err(command) => {
                // Nothing in flight: a group of one, sent from the caller's own task as a
                // plain send (no hop to another task). Scripts issued
                // meanwhile form the next group, which a task sends (see `Handover`), so a
                // caller that stops waiting here strands nobody. Routed by its slot, to the
                // node it was keyed by (the same slot map), unless that map changed meanwhile.
                let handover = Handover {
                    groups: self.clone(),
                    node,
                };
                let sent = send(
                    &self.redis,
                    &unbounded(),
                    "EVALSHA",
                    slot,
                    command,
                    wait,
                    None,
                )
                .await;
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
    /// or frees the node when there are none.
    fn hand_over(self: &Arc<Self>, node: Option<Server>) {
        let mut queues = self.queues.lock();
        if queues.get_mut(&node).is_some_and(|next| next.is_empty()) {
            queues.remove(&node);
        } else {
            drop(queues);
            self.runtime.spawn(self.clone().drive(node));
        }
    }

    /// Sends `node`'s groups one after the other until none is waiting.
    async fn drive(self: Arc<Self>, node: Option<Server>) {
        loop {
            let group = {
                let mut queues = self.queues.lock();
                let Some(next) = queues.get_mut(&node) else {
                    return;
                };
                if next.is_empty() {
                    queues.remove(&node);
                    return;
                }
                std::mem::take(next)
            };
            match &node {
                // A node fred has no connection to (killed, not yet out of its slot map):
                // pinning a command there would make fred restart every connection of the
                // client. Each member goes alone, by its slot, its `WAIT` behind it.
                Some(server) if !self.redis.active_connections().contains(server) => {
                    self.run_alone(group).await
                }
                _ => self.run(node.as_ref(), group, false).await,
            }
        }
    }

    /// Sends each member of `group` as a plain send (script, then its own `WAIT`), together,
    /// each routed by its own slot: fred then sends a slot whose owner it has no connection to
    /// to another node, whose MOVED its caller answers as for any script sent alone.
    async fn run_alone(&self, group: Vec<Member>) {
        let sends = group.into_iter().map(|member| async move {
            let wait = member.wait.map(|(wait, by)| Wait {
                timeout: by.saturating_duration_since(Instant::now()).max(MIN_WAIT),
                ..wait
            });
            let sent = send(
                &self.redis,
                &unbounded(),
                "EVALSHA",
                member.slot,
                member.command,
                wait,
                None,
            )
            .await;
            let _ = member.reply.send(sent);
        });
        futures::future::join_all(sends).await;
    }

    /// Sends one group: its calls back to back, then one `WAIT` if any member needs it, all
    /// on `node`'s connection (`None`: the one node of a client that is not clustered).
    /// Members that need no acknowledgement are answered as soon as the calls' replies are
    /// in. `reloaded`: the composite was just loaded for these members (a second NOSCRIPT is
    /// theirs, not sent again).
    ///
    /// Each call is a command of its own, not one of a fred pipeline: fred answers a
    /// pipeline whose command met a redirection (MOVED, ASK) with that one error and drops the
    /// others' replies, so members whose scripts ran would be told they had been refused, and
    /// send them again. Commands queued together are still written together (fred flushes
    /// once its queue is empty).
    async fn run(&self, node: Option<&Server>, group: Vec<Member>, reloaded: bool) {
        // Pinned: one connection carries the group and its `WAIT`, whatever the slot map
        // says by the time they are routed.
        let options = Options {
            cluster_node: node.cloned(),
            ..unbounded()
        };
        let hash = |slot: Option<u16>| slot.map_or(ClusterHash::Random, ClusterHash::Custom);
        let wait_hash = hash(group.first().and_then(|member| member.slot));
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
        let client = self.redis.with_options(&options);
        let mut calls = self.calls(group);
        let mut scripts = Vec::with_capacity(calls.len());
        for call in calls.iter_mut() {
            let command = CustomCommand::new_static("EVALSHA", hash(call[0].slot), false);
            let args = match call.as_mut_slice() {
                // A pinned member keeps its arguments: if fred had no connection to the node,
                // the script was never written, and goes again alone (see below).
                [member] if node.is_some() => member.command.clone(),
                [member] => std::mem::take(&mut member.command),
                // The members keep theirs: to go again alone, or in the composite once more.
                members => self
                    .composite
                    .command(members.iter().map(|member| member.command.as_slice())),
            };
            // Boxed one by one as they are made: a fred command future is several KiB, and a
            // `Vec` of them inline (then moved into boxes by `in_order`) put a group's worth of
            // fresh heap (hundreds of KiB under load) through malloc's trimming on every group.
            scripts.push(Box::pin(client.custom::<Value, Value>(command, args)));
        }
        // Each command goes to the router on its future's first poll; `in_order` polls the
        // calls in order and `join!` polls them before the `WAIT`: they share the connection
        // in that order, and fred never re-sends any (one attempt), so `WAIT` cannot overtake
        // a call.
        let scripts = async {
            let mut replies = in_order(scripts).await.into_iter();
            let mut settled = Settled {
                pinned: node.is_some(),
                acking: Vec::new(),
                unrouted: Vec::new(),
            };
            let mut reload = Vec::new();
            for call in calls {
                let outcome = replies.next().unwrap_or_else(|| {
                    Err(FredError::new(
                        ErrorKind::Protocol,
                        "no reply to the script",
                    ))
                });
                let n = call.len();
                let call = call.into_iter();
                match (n, outcome) {
                    (1, outcome) => call.for_each(|member| settled.add(member, outcome.clone())),
                    // The composite is not loaded (a restart, `SCRIPT FLUSH`): nothing ran.
                    (_, Err(e)) if is_noscript(&e) && !reloaded => reload.extend(call),
                    (n, Ok(reply)) => {
                        for (member, outcome) in call.zip(split_reply(reply, n)) {
                            settled.add(member, outcome);
                        }
                    }
                    // Refused or lost as a whole: as each member's own call would have been.
                    (_, Err(e)) => call.for_each(|member| settled.add(member, Err(e.clone()))),
                }
            }
            (settled, reload)
        };
        let waited = async {
            match wait {
                Some(wait) => {
                    let (command, args) = wait_command(wait_hash, wait);
                    Some(acked(client.custom::<Value, Value>(command, args).await))
                }
                None => None,
            }
        };
        let ((settled, reload), waited) = tokio::join!(scripts, waited);
        for (reply, outcome) in settled.acking {
            let _ = reply.send((outcome, waited.clone()));
        }
        if !settled.unrouted.is_empty() {
            self.run_alone(settled.unrouted).await;
        }
        if !reload.is_empty() {
            tracing::debug!("composite script not loaded; loading it and sending it again");
            crate::metrics::script_reloaded();
            match self.composite.script.load(&self.redis).await {
                // Once more, followed by its own `WAIT`: the group's went before it.
                Ok(()) => Box::pin(self.run(node, reload, true)).await,
                Err(e) => {
                    for member in reload {
                        let _ = member.reply.send((Err(e.clone()), None));
                    }
                }
            }
        }
    }

    /// `group` as the calls that send it: each either one member alone, or several whose
    /// scripts the composite holds (at most [`MAX_MEMBERS`], no two naming the same key: see
    /// [`Composite::share_a_key`]), in one call of it, in their order.
    ///
    /// Only on a server that is not a cluster. On a cluster a slot can be migrating, and Redis
    /// answers a call on several keys of a migrating slot with TRYAGAIN as soon as one of them
    /// has left: one absent key would hold back every member whose key is still there, which
    /// sent alone would run at once.
    fn calls(&self, group: Vec<Member>) -> Vec<Vec<Member>> {
        calls(self.composite, group)
    }
}

/// [`Groups::calls`]'s work.
fn calls(composite: &Composite, group: Vec<Member>) -> Vec<Vec<Member>> {
    let mut calls = Vec::with_capacity(group.len());
    let mut composed: Vec<Vec<Member>> = Vec::new();
    for member in group {
        if member.slot.is_some() || !composite.holds(&member.command) {
            calls.push(vec![member]);
            continue;
        }
        let fits = |call: &Vec<Member>| {
            call.len() < MAX_MEMBERS
                && !call
                    .iter()
                    .any(|m| Composite::share_a_key(&m.command, &member.command))
        };
        match composed.last_mut() {
            Some(call) if fits(call) => call.push(member),
            _ => composed.push(vec![member]),
        }
    }
    calls.extend(composed);
    calls
}

/// The members of a group whose outcome is known, sorted by what is left to do for them.
struct Settled {
    /// Whether the group was pinned to a node.
    pinned: bool,
    /// Members whose acknowledgement the group's `WAIT` gives, with their outcome.
    acking: Vec<(oneshot::Sender<Outcome>, Result<Value, FredError>)>,
    /// Members not sent: pinned to a node whose connection is gone.
    unrouted: Vec<Member>,
}

impl Settled {
    /// Answers `member` with `outcome` now, or sorts it for later.
    fn add(&mut self, member: Member, outcome: Result<Value, FredError>) {
        match outcome {
            // Pinned to a node whose connection is gone (its slot map not yet re-read): not
            // written, so not a re-send.
            Err(e) if self.pinned && is_unrouted(&e) => self.unrouted.push(member),
            outcome if member.wait.is_some() => self.acking.push((member.reply, outcome)),
            outcome => {
                let _ = member.reply.send((outcome, None));
            }
        }
    }
}

/// Awaits `futures` together, each polled in the order given (as `join!` polls its own), and
/// their outputs in that order.
async fn in_order<F: Future>(mut futures: Vec<Pin<Box<F>>>) -> Vec<F::Output> {
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut done = true;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => done = false,
                }
            }
        }
        if done {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

/// No timeout of fred's: the outcome of every script sent must be learnt (see `Conn::call`);
/// callers bound their own waits.
fn unbounded() -> Options {
    Options {
        timeout: Some(Duration::ZERO),
        ..Options::default()
    }
}

/// The next group of each node with a group in flight. Every script call looks its node up
/// here two or three times: the one node of a client that is not clustered is a field of its
/// own, with no hashing and no table entry made and removed per call; a cluster's nodes are
/// hashed with foldhash (std's SipHash cost about 600 instructions per uncontended
/// lock+unlock, callgrind).
#[derive(Default)]
struct Queues {
    single: Option<Vec<Member>>,
    nodes: HashMap<Server, Vec<Member>, foldhash::fast::RandomState>,
}

impl Queues {
    fn get_mut(&mut self, node: &Option<Server>) -> Option<&mut Vec<Member>> {
        match node {
            None => self.single.as_mut(),
            Some(server) => self.nodes.get_mut(server),
        }
    }

    fn insert(&mut self, node: Option<Server>, next: Vec<Member>) {
        match node {
            None => self.single = Some(next),
            Some(server) => {
                self.nodes.insert(server, next);
            }
        }
    }

    fn remove(&mut self, node: &Option<Server>) {
        match node {
            None => self.single = None,
            Some(server) => {
                self.nodes.remove(server);
            }
        }
    }
}

/// Hands a node's later groups on when the group sent from a caller's task is done, or when
/// that caller stopped waiting for it.
struct Handover {
    groups: Arc<Groups>,
    node: Option<Server>,
}

impl Drop for Handover {
    fn drop(&mut self) {
        self.groups.hand_over(self.node.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conn::LuaScript;

    crate::conn::lua_script!(ACQUIRE, "lock/acquire.lua");
    crate::conn::lua_script!(RELEASE, "lock/release.lua");

    fn member(script: &LuaScript, slot: Option<u16>, key: &str) -> Member {
        Member {
            slot,
            command: vec![
                Value::from(script.sha1().clone()),
                Value::from(1),
                Value::from(key),
                Value::from("field"),
            ],
            wait: None,
            reply: oneshot::channel().0,
        }
    }

    fn keys(calls: &[Vec<Member>]) -> Vec<Vec<String>> {
        calls
            .iter()
            .map(|call| {
                call.iter()
                    .map(|m| m.command[2].as_string().unwrap_or_default())
                    .collect()
            })
            .collect()
    }

    /// A release of `a` and the next acquire of `a` go in two calls, in that order: in one,
    /// Redis would have checked the keys before the release deleted `a` (on a cluster's
    /// migrating slot the acquire then met "Script attempted to access a non local key", as a
    /// stress run of `migration_churn_under_contention_loses_no_release` did when clusters
    /// composed). Other keys share the calls.
    #[test]
    fn members_naming_one_key_go_in_separate_calls_in_order() {
        let composite = Composite::new(&[&ACQUIRE, &RELEASE]);
        let group = vec![
            member(&RELEASE, None, "a"),
            member(&ACQUIRE, None, "b"),
            member(&ACQUIRE, None, "a"),
            member(&ACQUIRE, None, "d"),
            member(&RELEASE, None, "a"),
        ];
        assert_eq!(
            keys(&calls(&composite, group)),
            vec![vec!["a", "b"], vec!["a", "d"], vec!["a"]]
        );
    }

    /// On a cluster every member goes alone (a migrating slot would hold a whole call back).
    #[test]
    fn a_clusters_members_go_alone() {
        let composite = Composite::new(&[&ACQUIRE]);
        let group = vec![
            member(&ACQUIRE, Some(1), "a"),
            member(&ACQUIRE, Some(1), "b"),
        ];
        assert_eq!(keys(&calls(&composite, group)), vec![vec!["a"], vec!["b"]]);
    }

    #[test]
    fn a_call_carries_at_most_max_members() {
        let composite = Composite::new(&[&ACQUIRE]);
        let group = (0..MAX_MEMBERS + 1)
            .map(|i| member(&ACQUIRE, None, &format!("k{i}")))
            .collect();
        let sizes: Vec<usize> = calls(&composite, group).iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![MAX_MEMBERS, 1]);
    }
}
