//! Hold scopes: which holds the code running right now is inside of, for re-entry.
//!
//! A tokio task is not a sequential context: futures polled together in one task (`join!`,
//! `select!`, `FuturesUnordered`, `for_each_concurrent`) interleave, so the task cannot be a
//! lock's owner. The sequential context is the *dynamic extent of a hold*: the future that
//! holds it and what that future awaits. So every acquisition outside a scope is a new owner
//! (a number from its client's counter, never reused), and [`Guard::run`](crate::Guard::run)
//! (with the locks' `run` on top of it) polls its future inside a scope naming the hold: an
//! acquire of the same lock made while that future is polled re-enters the hold. The scope is
//! a task-local set around each poll of that one future, so a sibling future polled by the
//! same task outside it does not see it, and a task spawned from it starts outside.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

tokio::task_local! {
    /// The innermost hold whose scope is being polled, linked to the ones around it.
    static SCOPE: Arc<Frame>;
}

/// One hold's scope.
struct Frame {
    /// The holding client's id (compared by address: every handle of a client shares it).
    client: Arc<str>,
    /// The lock's key in that client.
    key: Arc<str>,
    /// The hold's owner number.
    number: u64,
    /// The scope this one was entered from.
    outer: Option<Arc<Frame>>,
}

/// The owner numbers of one client: every acquisition outside a scope takes the next one.
#[derive(Debug)]
pub(crate) struct OwnerNumbers(AtomicU64);

impl OwnerNumbers {
    pub(crate) fn new() -> OwnerNumbers {
        OwnerNumbers(AtomicU64::new(1))
    }

    /// A number this client never handed out before.
    pub(crate) fn fresh(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

/// The owner number of the hold of `key` (in the client `client`) whose scope the caller
/// runs in, if any.
pub(crate) fn enclosing(client: &Arc<str>, key: &str) -> Option<u64> {
    SCOPE
        .try_with(|frame| {
            let mut frame = Some(frame);
            while let Some(f) = frame {
                if Arc::ptr_eq(&f.client, client) && *f.key == *key {
                    return Some(f.number);
                }
                frame = f.outer.as_ref();
            }
            None
        })
        .ok()
        .flatten()
}

/// One hold, as a scope names it: its client's id, its lock key, its owner number.
pub(crate) type Scoped = (Arc<str>, Arc<str>, u64);

/// Polls `future` inside the scopes of `holds`, and of every scope it is polled in.
///
/// The scopes around it are read at each poll, not once: a future polled first inside a
/// hold's scope and later outside it (carried out of a `run`, moved between scopes by
/// `FuturesUnordered` or a `select!` loop) is inside that hold's scope only while polled there
/// — afterwards the hold may be another owner's (handed on in memory, see [`crate::engine::baton`]).
pub(crate) fn within<F: Future>(holds: impl IntoIterator<Item = Scoped>, future: F) -> Within<F> {
    // The holds' frames, innermost first, on no outer scope yet: linked to the scopes around
    // at the first poll.
    let mut own: Option<Arc<Frame>> = None;
    let mut count = 0;
    for (client, key, number) in holds {
        own = Some(Arc::new(Frame {
            client,
            key,
            number,
            outer: own,
        }));
        count += 1;
    }
    Within {
        own: own.map(|frame| (frame, count)),
        around: None,
        future,
    }
}

pin_project_lite::pin_project! {
    /// The future [`within`] returns.
    pub(crate) struct Within<F> {
        // The holds' frames linked to the scopes `around` names, and how many are the holds'.
        own: Option<(Arc<Frame>, usize)>,
        // The scopes around at the last poll, to which `own` is linked.
        around: Option<Arc<Frame>>,
        #[pin]
        future: F,
    }
}

impl<F: Future> Future for Within<F> {
    type Output = F::Output;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let this = self.project();
        let Some((own, count)) = this.own.as_mut() else {
            return this.future.poll(cx);
        };
        let around = SCOPE.try_with(Arc::clone).ok();
        let same = match (&around, &*this.around) {
            (Some(now), Some(before)) => Arc::ptr_eq(now, before),
            (None, None) => true,
            _ => false,
        };
        if !same {
            *own = relinked(own, *count, around.clone());
            *this.around = around;
        }
        let innermost = own.clone();
        let future = this.future;
        SCOPE.sync_scope(innermost, || future.poll(cx))
    }
}

/// The first `count` frames of `chain` (a hold's own ones), linked to `outer` instead.
fn relinked(chain: &Arc<Frame>, count: usize, outer: Option<Arc<Frame>>) -> Arc<Frame> {
    let mut own = Vec::with_capacity(count);
    let mut frame = Some(chain);
    for _ in 0..count {
        let f = frame.expect("a chain holds its own frames");
        own.push(f);
        frame = f.outer.as_ref();
    }
    let mut linked = outer;
    for f in own.into_iter().rev() {
        linked = Some(Arc::new(Frame {
            client: f.client.clone(),
            key: f.key.clone(),
            number: f.number,
            outer: linked,
        }));
    }
    linked.expect("a chain has a frame of its own")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_scope_is_seen_by_its_future_only() {
        let client: Arc<str> = Arc::from("c");
        let other: Arc<str> = Arc::from("c");
        assert_eq!(enclosing(&client, "k"), None);
        let inside = within([(client.clone(), "k".into(), 7)], async {
            let nested = within([(client.clone(), "j".into(), 8)], async {
                (enclosing(&client, "k"), enclosing(&client, "j"))
            })
            .await;
            (enclosing(&client, "k"), enclosing(&other, "k"), nested)
        });
        // A sibling polled by the same task, outside the scope.
        let sibling = async { enclosing(&client, "k") };
        let (inside, sibling) = tokio::join!(inside, sibling);
        assert_eq!(inside, (Some(7), None, (Some(7), Some(8))));
        assert_eq!(sibling, None);
        let spawned = within([(client.clone(), "k".into(), 9)], async {
            let c = client.clone();
            tokio::spawn(async move { enclosing(&c, "k") })
                .await
                .unwrap()
        })
        .await;
        assert_eq!(spawned, None, "a spawned task starts outside every scope");
    }

    #[tokio::test]
    async fn a_scope_is_read_at_every_poll() {
        let client: Arc<str> = Arc::from("c");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let mut inner = Box::pin(within([(client.clone(), "j".into(), 2)], async {
            rx.await.unwrap();
            (enclosing(&client, "k"), enclosing(&client, "j"))
        }));
        // First polled inside `k`'s scope ...
        within([(client.clone(), "k".into(), 1)], async {
            let first = std::future::poll_fn(|cx| std::task::Poll::Ready(inner.as_mut().poll(cx)));
            assert!(first.await.is_pending());
        })
        .await;
        // ... and to the end outside it: it is in its own scope only.
        tx.send(()).unwrap();
        assert_eq!(inner.await, (None, Some(2)));
    }

    #[test]
    fn numbers_are_never_reused() {
        let numbers = OwnerNumbers::new();
        let a = numbers.fresh();
        let b = numbers.fresh();
        assert_ne!(a, b);
    }
}
