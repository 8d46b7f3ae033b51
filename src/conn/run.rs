//! Sending one command until Redis runs it: reloaded after NOSCRIPT, and sent again where
//! a cluster refused it before it ran — after MOVED to the slot's new owner, after ASK to the
//! importing node behind `ASKING`, after TRYAGAIN after a pause — for up to the command
//! timeout (see the module's page). Counted scripts go in a group ([`super::group`]) unless
//! they must follow `ASKING`.

use std::sync::Arc;
use std::time::Duration;

use fred::error::{Error as FredError, ErrorKind};
use fred::interfaces::{ClientLike, ClusterInterface};
use fred::types::config::{Options, Server};
use fred::types::{ClusterHash, CustomCommand, Value};
use tokio::time::Instant;

use super::group::Groups;
use super::replication::{Replication, Wait};
use super::send::send;
use super::LuaScript;
use crate::error::{is_noscript, is_redirect, is_rewrite, is_tryagain};

/// The longest pause between sends of a command a cluster refused before running it.
const REFUSED_PAUSE_MAX: Duration = Duration::from_millis(200);

/// One command to run (a script's `EVALSHA`, or a read): everything its sends need.
pub(super) struct Run<'a> {
    pub(super) redis: &'a fred::clients::Client,
    pub(super) replication: &'a Replication,
    /// Where a script that changes a lock goes (see `synced`).
    pub(super) groups: &'a Arc<Groups>,
    /// `EVALSHA`, or the command read.
    pub(super) name: &'static str,
    /// The script `EVALSHA` runs, reloaded on NOSCRIPT.
    pub(super) script: Option<&'static LuaScript>,
    /// The command's arguments.
    pub(super) command: Vec<Value>,
    pub(super) slot: Option<u16>,
    pub(super) options: Options,
    /// Whether a `WAIT` follows where replica sync asks for one: such a command changes a
    /// lock, and goes in a group (see [`super::group`]) unless it must follow `ASKING`.
    pub(super) synced: bool,
    /// Whether a write fred refused (which may follow a run) may be sent again.
    pub(super) idempotent: bool,
    /// How long refusals are answered by sending again.
    pub(super) retry_for: Duration,
}

/// A command's reply, and its `WAIT`'s, if one was sent.
pub(super) struct Sent {
    pub(super) reply: Value,
    pub(super) wait: Option<Wait>,
    pub(super) waited: Option<Result<u32, FredError>>,
}

impl Run<'_> {
    /// Sends the command until Redis runs it, refuses it for good, or `retry_for` has passed.
    pub(super) async fn send(&self) -> Result<Sent, FredError> {
        let give_up_at = Instant::now() + self.retry_for;
        let mut reloaded = false;
        let mut refusals = 0;
        // The node importing the slot, while Redis answers ASK.
        let mut asking: Option<Server> = None;
        loop {
            let wait = self
                .synced
                .then(|| {
                    self.replication
                        .wait_for(self.redis, self.slot, asking.as_ref())
                })
                .flatten();
            // An idempotent command's sends share its one command timeout (a counted call has
            // none of fred's: its caller bounds it).
            let options = if self.idempotent {
                Options {
                    timeout: Some(
                        give_up_at
                            .saturating_duration_since(Instant::now())
                            .max(Duration::from_millis(1)),
                    ),
                    ..self.options.clone()
                }
            } else {
                self.options.clone()
            };
            let (reply, waited) =
                if self.synced && asking.is_none() {
                    let grouped = self.groups.send(self.slot, self.command.clone(), wait);
                    match options.timeout.filter(|t| !t.is_zero()) {
                        // The group goes on without this caller: only its wait is bounded.
                        Some(timeout) => tokio::time::timeout(timeout, grouped)
                            .await
                            .unwrap_or_else(|_| {
                                let e = FredError::new(ErrorKind::Timeout, "Request timed out.");
                                (Err(e), None)
                            }),
                        None => grouped.await,
                    }
                } else {
                    send(
                        self.redis,
                        &options,
                        self.name,
                        self.slot,
                        self.command.clone(),
                        wait,
                        asking.as_ref(),
                    )
                    .await
                };
            let err = match reply {
                Ok(reply) => {
                    return Ok(Sent {
                        reply,
                        wait,
                        waited,
                    })
                }
                Err(err) => err,
            };
            if let Some(script) = self.script.filter(|_| is_noscript(&err) && !reloaded) {
                reloaded = true;
                tracing::debug!("script cache lost; loading the script again");
                crate::metrics::script_reloaded();
                // Boxed, as the redirection's look-up below: rare paths whose fred futures
                // would otherwise size every call's future (see `send`).
                Box::pin(script.load(self.redis)).await?;
                continue;
            }
            let redirected = is_redirect(&err);
            let refused = redirected || is_tryagain(&err) || (self.idempotent && is_rewrite(&err));
            if !refused || Instant::now() >= give_up_at {
                return Err(err);
            }
            refusals += 1;
            if redirected {
                // MOVED or ASK (fred tells neither apart, and re-read the slot map after
                // MOVED): the slot's owner says whether the slot is migrating, and where.
                let was_asking = asking.is_some();
                asking = match self.slot {
                    Some(slot) => Box::pin(importing_node(self.redis, slot)).await,
                    None => None,
                };
                tracing::debug!(
                    refusals,
                    ?asking,
                    "script redirected by the cluster; sending again"
                );
                if asking.is_some() && !was_asking {
                    // Where the keys went is known: no reason to wait.
                    continue;
                }
            } else {
                tracing::debug!(refusals, error = %err, "script refused before it ran; sending again");
            }
            // While a slot migrates or a failover settles, the nodes may disagree for a while:
            // sends spaced by a growing pause ride it out without flooding them.
            let pause = (Duration::from_millis(10) * 2u32.saturating_pow(refusals.min(8)))
                .min(REFUSED_PAUSE_MAX)
                .min(give_up_at.saturating_duration_since(Instant::now()));
            tokio::time::sleep(pause).await;
        }
    }
}

/// The node importing `slot`, when its owner (as fred routes it) says the slot is migrating
/// there; `None` when it is not migrating, or the node is not one fred routes to (a primary
/// serving no slot yet: the script is then sent again after a pause until the migration ends).
async fn importing_node(redis: &fred::clients::Client, slot: u16) -> Option<Server> {
    let nodes: String = redis
        .custom(
            CustomCommand::new_static("CLUSTER", ClusterHash::Custom(slot), false),
            vec!["NODES"],
        )
        .await
        .map_err(|e| tracing::debug!(error = %e, "CLUSTER NODES failed"))
        .ok()?;
    let target = migrating_to(&nodes, slot)?;
    let state = redis.cached_cluster_state()?;
    let server = state
        .slots()
        .iter()
        .find(|range| &*range.id == target)
        .map(|range| range.primary.clone());
    server
}

/// In `CLUSTER NODES` as its owner answers it, the id of the node `slot` migrates to: the
/// owner's own line carries `[<slot>->-<id>]`.
fn migrating_to(nodes: &str, slot: u16) -> Option<&str> {
    let myself = nodes.lines().find(|line| {
        line.split(' ')
            .nth(2)
            .is_some_and(|flags| flags.split(',').any(|f| f == "myself"))
    })?;
    let marker = format!("[{slot}->-");
    myself
        .split(' ')
        .find_map(|field| field.strip_prefix(marker.as_str())?.strip_suffix(']'))
}
