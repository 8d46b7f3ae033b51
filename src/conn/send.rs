//! The wire: one command, followed by `WAIT` back to back on the same connection when replica
//! sync asks for it (`WAIT` counts the writes of the connection that sends it), and with
//! `ASKING` first, in one pipeline, when a migrating slot's keys have left.

use std::future::Future;
use std::pin::Pin;

use fred::error::{Error as FredError, ErrorKind};
use fred::interfaces::ClientLike;
use fred::types::config::{Options, Server};
use fred::types::{ClusterHash, CustomCommand, Value};

use super::replication::Wait;

/// A command's reply, and the number of replicas its `WAIT` reported, if one was sent.
pub(crate) type Outcome = (Result<Value, FredError>, Option<Result<u32, FredError>>);

/// Sends `name` (an EVALSHA, or a read) with `command` as its arguments and `options`, followed by `WAIT` when `wait` is set, back to
/// back on the same connection: the script's reply, and the number of replicas `WAIT`
/// reported. With `asking`, all go to that node after `ASKING`, in one pipeline so that no
/// other command can come between `ASKING` and the script.
///
/// Boxed: a fred command future is several KiB, and inline it would make every future that
/// may send alone (`Conn::call`'s, boxed per call) that large even when its script travels in
/// a group's task instead; under many concurrent calls that heap churn, freed and trimmed by
/// malloc and faulted in again, cost more CPU than the rest of the library.
pub(crate) fn send<'a>(
    redis: &'a fred::clients::Client,
    options: &'a Options,
    name: &'static str,
    slot: Option<u16>,
    command: Vec<Value>,
    wait: Option<Wait>,
    asking: Option<&'a Server>,
) -> Pin<Box<dyn Future<Output = Outcome> + Send + 'a>> {
    Box::pin(send_now(redis, options, name, slot, command, wait, asking))
}

/// [`send`]'s work.
async fn send_now(
    redis: &fred::clients::Client,
    options: &Options,
    name: &'static str,
    slot: Option<u16>,
    command: Vec<Value>,
    wait: Option<Wait>,
    asking: Option<&Server>,
) -> Outcome {
    // Any node when not clustered.
    let hash = slot.map_or(ClusterHash::Random, ClusterHash::Custom);
    let first = CustomCommand::new_static(name, hash.clone(), false);
    if let Some(node) = asking {
        let options = Options {
            cluster_node: Some(node.clone()),
            ..options.clone()
        };
        let pipeline = redis.pipeline();
        let queued = pipeline.with_options(&options);
        let asking_command = CustomCommand::new_static("ASKING", hash.clone(), false);
        let mut queue = vec![
            queued.custom::<(), Value>(asking_command, vec![]).await,
            queued.custom::<(), Value>(first, command).await,
        ];
        if let Some(wait) = wait {
            let (wait_command, wait_args) = wait_command(hash.clone(), wait);
            queue.push(queued.custom::<(), Value>(wait_command, wait_args).await);
        }
        if let Some(Err(e)) = queue.into_iter().find(Result::is_err) {
            return (Err(e), None);
        }
        let mut replies = pipeline.try_all::<Value>().await.into_iter();
        let reply = match (replies.next(), replies.next()) {
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(_)), Some(reply)) => reply,
            _ => Err(FredError::new(
                ErrorKind::Protocol,
                "no reply to the script",
            )),
        };
        return (
            reply,
            wait.map(|_| {
                acked(replies.next().unwrap_or_else(|| {
                    Err(FredError::new(ErrorKind::Protocol, "no reply to WAIT"))
                }))
            }),
        );
    }
    let Some(wait) = wait else {
        let reply = redis
            .with_options(options)
            .custom::<Value, Value>(first, command)
            .await;
        return (reply, None);
    };
    let (wait_command, wait_args) = wait_command(hash, wait);
    // Both go to the router in this order (each future enqueues its command on its first
    // poll, and `join!` polls in order), so they share the node's connection back to back;
    // fred never re-sends either (one attempt), so `WAIT` cannot overtake the script.
    // Boxed: two fred command futures inline would double every send's box, WAIT or not.
    let client = redis.with_options(options);
    let (reply, waited) = Box::pin(async {
        tokio::join!(
            client.custom::<Value, Value>(first, command),
            client.custom::<Value, Value>(wait_command, wait_args),
        )
    })
    .await;
    (reply, Some(acked(waited)))
}

/// `WAIT` for `wait`, routed by `hash`.
pub(crate) fn wait_command(hash: ClusterHash, wait: Wait) -> (CustomCommand, Vec<Value>) {
    (
        CustomCommand::new_static("WAIT", hash, false),
        vec![
            Value::from(i64::from(wait.replicas)),
            Value::from(wait.timeout.as_millis() as i64),
        ],
    )
}

/// The number of replicas a `WAIT` reply reports.
pub(crate) fn acked(waited: Result<Value, FredError>) -> Result<u32, FredError> {
    waited.and_then(|v| {
        v.as_i64()
            .map(|n| n.max(0) as u32)
            .ok_or_else(|| FredError::new(ErrorKind::Parse, "WAIT replied no number"))
    })
}
