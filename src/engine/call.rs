//! Calls whose outcome must be learnt even when nobody waits for it any more: a counted call
//! awaited for at most as long as a hold it took would matter ([`bounded`]), and a round trip
//! finished in a task of its own when its caller leaves ([`Finish`]).
//!
//! The two share one timer: a [`Finish`] polling its round trip marks the thread as watched,
//! and a [`Bounded`] polled under that mark arms no timer of its own, since the `Finish` polls
//! it again at its deadline or hands it to a task whose polls are not watched.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use fred::error::{Error as FredError, ErrorKind};
use fred::types::Value;
use tokio::time::{Instant, Sleep};

use crate::conn::{Call, Conn, Failed};
use crate::{Error, Result};

/// How many command timeouts [`bounded`] awaits a counted call.
pub(crate) const CALL_BOUND: u32 = 4;

/// Awaits a counted call, for at most as long as a hold it took would matter: past that,
/// treat the outcome as unknown (a settle queued behind it on the same connection then
/// learns what it did).
///
/// The bound is measured from here, but its timer is armed only where nothing else will poll
/// the call again: a [`Finish`] awaited inline polls it again at its own deadline, or hands
/// it to a task that does, so an uncontended call pays for one timer, the caller's.
pub(crate) fn bounded(call: Call, conn: &Conn) -> Bounded {
    Bounded::new(call, conn.command_timeout() * CALL_BOUND)
}

/// The future of [`bounded`].
pub(crate) struct Bounded {
    call: Call,
    deadline: Instant,
    /// Armed on the first poll no inline [`Finish`] watches (boxed: rarely made).
    timer: Option<Pin<Box<Sleep>>>,
    /// Takes the call, still in flight, when its bound passes (see [`Bounded::or_late`]).
    late: Option<Box<dyn FnOnce(Call) + Send>>,
}

impl Bounded {
    fn new(call: Call, bound: Duration) -> Bounded {
        Bounded {
            call,
            deadline: Instant::now() + bound,
            timer: None,
            late: None,
        }
    }

    /// Past its bound the call is handed to `late`, still in flight, instead of dropped: a
    /// call given up on a healthy connection (a stalled server) still runs there, and what
    /// its late reply did may have to be undone (a semaphore's permits given back).
    pub(crate) fn or_late(mut self, late: impl FnOnce(Call) + Send + 'static) -> Bounded {
        self.late = Some(Box::new(late));
        self
    }
}

impl Future for Bounded {
    type Output = std::result::Result<Value, Failed>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Poll::Ready(outcome) = self.call.as_mut().poll(cx) {
            return Poll::Ready(outcome);
        }
        let deadline = self.deadline;
        let timer = match &mut self.timer {
            Some(timer) => timer,
            None if WATCHED.get() => return Poll::Pending,
            None => self
                .timer
                .insert(Box::pin(tokio::time::sleep_until(deadline))),
        };
        ready!(timer.as_mut().poll(cx));
        if let Some(late) = self.late.take() {
            late(std::mem::replace(
                &mut self.call,
                Box::pin(std::future::pending()),
            ));
        }
        Poll::Ready(Err(Failed::MaybeRan(FredError::new(
            ErrorKind::Timeout,
            "no reply within four command timeouts",
        ))))
    }
}

thread_local! {
    /// Set while a [`Finish`] polls its round trip inline (see [`bounded`]).
    static WATCHED: Cell<bool> = const { Cell::new(false) };
}

/// Marks the thread as polling under a [`Finish`]'s deadline until dropped; restores the
/// previous mark even if the poll panics, so no later call goes unbounded.
struct Watched(bool);

impl Watched {
    fn enter() -> Watched {
        Watched(WATCHED.replace(true))
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        WATCHED.set(self.0);
    }
}

/// A round trip that runs inline while its caller waits, and is finished in a spawned task
/// when the caller is dropped or the command timeout passes — so its effects (a hold taken, a
/// hold released) are never left half-known. An abandoned round trip's output is dropped:
/// a guard in it releases its hold (see [`Guard`](super::guard::Guard)).
pub(crate) struct Finish<T: Send + 'static> {
    round_trip: Option<Pin<Box<dyn Future<Output = Result<T>> + Send>>>,
    deadline: Pin<Box<Sleep>>,
    timeout: Duration,
    runtime: tokio::runtime::Handle,
}

impl<T: Send + 'static> Finish<T> {
    pub(crate) fn new(
        round_trip: impl Future<Output = Result<T>> + Send + 'static,
        conn: &Conn,
    ) -> Self {
        Finish {
            round_trip: Some(Box::pin(round_trip)),
            deadline: Box::pin(tokio::time::sleep(conn.command_timeout())),
            timeout: conn.command_timeout(),
            runtime: conn.runtime().clone(),
        }
    }

    fn abandon(&mut self) {
        if let Some(round_trip) = self.round_trip.take() {
            self.runtime.spawn(async move {
                if let Err(e) = round_trip.await {
                    tracing::debug!(error = %e, "an abandoned round trip failed");
                }
            });
        }
    }
}

impl<T: Send + 'static> Future for Finish<T> {
    type Output = Result<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(round_trip) = self.round_trip.as_mut() else {
            return Poll::Ready(Err(Error::ShutDown));
        };
        // Its deadline polls the round trip again or abandons it to a task whose polls are
        // not watched: a call awaited in it needs no timer until then.
        let watched = Watched::enter();
        let polled = round_trip.as_mut().poll(cx);
        drop(watched);
        if let Poll::Ready(outcome) = polled {
            self.round_trip = None;
            return Poll::Ready(outcome);
        }
        ready!(self.deadline.as_mut().poll(cx));
        self.abandon();
        Poll::Ready(Err(Error::Timeout(self.timeout)))
    }
}

impl<T: Send + 'static> Drop for Finish<T> {
    fn drop(&mut self) {
        self.abandon();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn never() -> Call {
        Box::pin(std::future::pending())
    }

    fn is_unknown(outcome: &std::result::Result<Value, Failed>) -> bool {
        matches!(outcome, Err(Failed::MaybeRan(e)) if *e.kind() == ErrorKind::Timeout)
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_nobody_watches_is_bounded() {
        let start = Instant::now();
        let outcome = Bounded::new(never(), Duration::from_secs(4)).await;
        assert!(is_unknown(&outcome), "{outcome:?}");
        assert_eq!(start.elapsed(), Duration::from_secs(4));
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_past_its_bound_is_handed_over_still_in_flight() {
        let (reply, replied) = tokio::sync::oneshot::channel::<Value>();
        let call: Call = Box::pin(async move { Ok(replied.await.unwrap()) });
        let (late, handed) = tokio::sync::oneshot::channel::<Call>();
        let outcome = Bounded::new(call, Duration::from_secs(4))
            .or_late(move |call| drop(late.send(call)))
            .await;
        assert!(is_unknown(&outcome), "{outcome:?}");
        let call = handed.await.expect("the call was handed over");
        reply.send(Value::from(1)).unwrap();
        assert_eq!(
            call.await.unwrap(),
            Value::from(1),
            "its late reply arrives"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_watched_call_arms_its_bound_only_once_left_alone() {
        let start = Instant::now();
        let mut call = Bounded::new(never(), Duration::from_secs(4));
        {
            let _watched = Watched::enter();
            assert!(futures::poll!(&mut call).is_pending());
        }
        assert!(call.timer.is_none(), "a watched poll armed a timer");
        // Given up on later (as a `Finish` does at its deadline): the bound still runs from
        // the call's start, not from the hand-over.
        tokio::time::advance(Duration::from_secs(1)).await;
        let outcome = call.await;
        assert!(is_unknown(&outcome), "{outcome:?}");
        assert_eq!(start.elapsed(), Duration::from_secs(4));
    }
}
