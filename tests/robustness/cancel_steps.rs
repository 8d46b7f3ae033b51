//! Cancellation at every await, not sampled (invariant 9, docs/DESIGN.md): for every kind, `lock()`
//! (or `acquire`), the wait, the wake-up and the release are driven one poll at a time by the
//! test, as tokio's own sync tests do, and dropped after 1, 2, 3, ... polls until the call
//! completes on its own. Between two polls the test waits (bounded) for the future's waker:
//! so a drop after poll `n` lands after the round trip that poll started has come back — a
//! drop after the first poll of `lock()` lands after its acquire script ran and before its
//! reply was read. After every drop nothing may stay held and no subscription may stay.
//!
//! On a current-thread runtime: nothing the future waits for (the connection's tasks, its
//! socket) moves while the test polls it, so each poll is one step, whatever the machine's
//! speed — on more threads a reply could land within a poll and skip a state.

use testkit as support;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use fred::prelude::*;
use redbaton::{Client, Result};
use support::{eventually, script_calls, RedisServer};

type Fut<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What an acquire gives: its release, as a future to await or drop.
type Release = Box<dyn FnOnce() -> Fut<Result<()>> + Send>;

/// A waker that records that it was woken.
#[derive(Default)]
struct Flag {
    woken: AtomicBool,
    notify: tokio::sync::Notify,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        self.notify.notify_one();
    }
}

impl Flag {
    /// Whether the waker was woken (since the last call) within `within`.
    async fn woken(&self, within: Duration) -> bool {
        tokio::time::timeout(within, async {
            while !self.woken.swap(false, Ordering::SeqCst) {
                self.notify.notified().await;
            }
        })
        .await
        .is_ok()
    }
}

/// A future under the test's hand: polled once per step with the test's waker.
struct Stepped<T> {
    future: Fut<T>,
    flag: Arc<Flag>,
    waker: Waker,
}

/// How long a future that was polled and has not woken its waker is taken as parked (it
/// waits for something outside it). Only ends a walk: nothing is asserted from it.
const PARKED: Duration = Duration::from_secs(2);

/// How long a round trip on loopback may take on a loaded machine.
const ROUND_TRIP: Duration = Duration::from_secs(10);

impl<T> Stepped<T> {
    fn new(future: Fut<T>) -> Self {
        let flag = Arc::new(Flag::default());
        let waker = Waker::from(flag.clone());
        Stepped {
            future,
            flag,
            waker,
        }
    }

    fn poll(&mut self) -> Poll<T> {
        self.future
            .as_mut()
            .poll(&mut Context::from_waker(&self.waker))
    }

    /// Polls `n` times, each after the waker was woken (the first at once). `Ready` with
    /// its output when it completes on the way; `Pending(true)` when all `n` polls were
    /// pending and the last one's wake-up came; `Pending(false)` when a wake-up did not
    /// come within `patience` (parked).
    async fn steps(&mut self, n: usize, patience: Duration) -> Poll<std::result::Result<T, bool>> {
        for i in 0..n {
            if i > 0 && !self.flag.woken(patience).await {
                return Poll::Pending;
            }
            if let Poll::Ready(out) = self.poll() {
                return Poll::Ready(Ok(out));
            }
        }
        // Wait for the last poll's round trip to come back: the drop lands after it.
        if self.flag.woken(patience).await {
            Poll::Ready(Err(true))
        } else {
            Poll::Ready(Err(false))
        }
    }
}

/// One kind under test, over two clients (the waiter's and a holder's).
struct Kind {
    name: &'static str,
    /// The waiter's acquire (waits for ever).
    acquire: Box<dyn Fn() -> Fut<Result<Release>> + Send + Sync>,
    /// The holder takes it (not waiting).
    hold: Box<dyn Fn() -> Fut<Release> + Send + Sync>,
    /// Whether nothing holds it (for a semaphore: every permit is free).
    free: Box<dyn Fn() -> Fut<bool> + Send + Sync>,
}

fn boxed<T: 'static, F: Future<Output = T> + Send + 'static>(f: F) -> Fut<T> {
    Box::pin(f)
}

/// Channels with subscribers on the server (`PUBSUB CHANNELS`).
async fn channels(raw: &fred::clients::Client) -> Vec<String> {
    let reply: Value = raw
        .custom(
            fred::types::CustomCommand::new_static("PUBSUB", None, false),
            vec!["CHANNELS"],
        )
        .await
        .unwrap();
    reply.convert().unwrap_or_default()
}

/// After a drop: the kind is free again and nobody is subscribed, within a bound (a release
/// in flight or in the background lands within it; a leaked hold stays for its lease).
async fn assert_left_nothing(kind: &Kind, raw: &fred::clients::Client, what: &str) {
    assert!(
        eventually(ROUND_TRIP, || (kind.free)()).await,
        "{}: {what}: still held",
        kind.name
    );
    assert!(
        eventually(ROUND_TRIP, || async { channels(raw).await.is_empty() }).await,
        "{}: {what}: subscriptions left: {:?}",
        kind.name,
        channels(raw).await
    );
}

/// Walks `kind` through every state of an uncontended acquire, a wait, a wake-up and a
/// release, dropping the call in each.
async fn walk(kind: Kind, raw: &fred::clients::Client) {
    let name = kind.name;

    // An acquire nobody contends: dropped after each poll's round trip came back.
    let mut cut_after_script = 0;
    let mut n = 1;
    loop {
        let before = script_calls(raw).await;
        let mut call = Stepped::new((kind.acquire)());
        match call.steps(n, ROUND_TRIP).await {
            Poll::Ready(Ok(release)) => {
                release.unwrap()().await.unwrap();
                break;
            }
            Poll::Ready(Err(true)) => {}
            Poll::Ready(Err(false)) | Poll::Pending => {
                panic!("{name}: an uncontended acquire stalled at poll {n}")
            }
        }
        drop(call);
        assert_left_nothing(&kind, raw, &format!("acquire dropped after poll {n}")).await;
        if script_calls(raw).await > before {
            cut_after_script += 1;
        }
        n += 1;
        assert!(n < 50, "{name}: an uncontended acquire took 50 polls");
    }
    // The walk proved something: a drop landed after a script had run (and its effect was
    // undone, or the check above would have failed).
    assert!(
        cut_after_script > 0,
        "{name}: no drop landed after an acquire script ran ({n} polls)"
    );
    eprintln!("{name}: acquire: {n} polls, {cut_after_script} drops after a script ran");

    // A wait, dropped at each step until it parks.
    let mut n = 1;
    loop {
        let held = (kind.hold)().await;
        let mut call = Stepped::new((kind.acquire)());
        let parked = match call.steps(n, PARKED).await {
            Poll::Ready(Ok(_)) => panic!("{name}: acquired while held"),
            Poll::Ready(Err(woken)) => !woken,
            Poll::Pending => true,
        };
        drop(call);
        held().await.unwrap();
        assert_left_nothing(&kind, raw, &format!("wait dropped after poll {n}")).await;
        if parked {
            break;
        }
        n += 1;
        assert!(n < 50, "{name}: a wait took 50 polls to park");
    }
    let to_park = n;
    eprintln!("{name}: wait: parked after {to_park} polls");

    // Woken by the release, then dropped at each step until it has the lock.
    let mut k = 1;
    loop {
        let held = (kind.hold)().await;
        let mut call = Stepped::new((kind.acquire)());
        assert!(
            !matches!(call.steps(to_park, PARKED).await, Poll::Ready(Ok(_))),
            "{name}: acquired while held"
        );
        held().await.unwrap();
        match call.steps(k, ROUND_TRIP).await {
            Poll::Ready(Ok(release)) => {
                release.unwrap()().await.unwrap();
                break;
            }
            Poll::Ready(Err(true)) => {}
            Poll::Ready(Err(false)) | Poll::Pending => {
                panic!("{name}: a woken waiter stalled at poll {k} after the release")
            }
        }
        drop(call);
        assert_left_nothing(&kind, raw, &format!("woken wait dropped after poll {k}")).await;
        k += 1;
        assert!(k < 50, "{name}: a woken wait took 50 polls");
    }
    eprintln!("{name}: woken: {k} polls");

    // A release, dropped at each step: it is finished in the background.
    let mut n = 1;
    loop {
        let release = (kind.acquire)().await.unwrap();
        let mut call = Stepped::new(release());
        match call.steps(n, ROUND_TRIP).await {
            Poll::Ready(Ok(done)) => {
                done.unwrap();
                break;
            }
            Poll::Ready(Err(true)) => {}
            Poll::Ready(Err(false)) | Poll::Pending => {
                panic!("{name}: a release stalled at poll {n}")
            }
        }
        drop(call);
        assert_left_nothing(&kind, raw, &format!("release dropped after poll {n}")).await;
        n += 1;
        assert!(n < 50, "{name}: a release took 50 polls");
    }
    eprintln!("{name}: release: {n} polls");
}

/// Two clients on one server: the waiter's and the holder's.
async fn setup() -> (RedisServer, fred::clients::Client, Client, Client) {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let waiter = Client::connect(&server.url()).await.unwrap();
    let holder = Client::connect(&server.url()).await.unwrap();
    (server, raw, waiter, holder)
}

/// A lock kind's `Kind`: `$make(client)` gives the lock; its guard's `unlock` is the release.
/// The second form takes the waiter's lock, the holder's (another half of a read/write lock,
/// say) and the lock that says whether the name is free, apart.
macro_rules! lock_kind {
    ($name:expr, mine: $mine:expr, theirs: $theirs:expr, probe: $probe:expr) => {{
        let mine = $mine;
        let theirs = $theirs;
        let probe = $probe;
        Kind {
            name: $name,
            acquire: Box::new(move || {
                let lock = mine.clone();
                boxed(async move {
                    let guard = lock.lock().await?;
                    Ok(Box::new(move || boxed(guard.unlock())) as Release)
                })
            }),
            hold: Box::new(move || {
                let lock = theirs.clone();
                boxed(async move {
                    let guard = lock.try_lock().await.unwrap().expect("free for the holder");
                    Box::new(move || boxed(guard.unlock())) as Release
                })
            }),
            free: Box::new(move || {
                let lock = probe.clone();
                boxed(async move { !lock.is_locked().await.unwrap() })
            }),
        }
    }};
    ($name:expr, $waiter:expr, $holder:expr, $make:expr) => {
        lock_kind!(
            $name,
            mine: $make(&$waiter),
            theirs: $make(&$holder),
            probe: $make(&$holder)
        )
    };
}

#[tokio::test]
async fn lock_cut_at_every_step() {
    let (_server, raw, waiter, holder) = setup().await;
    let kind = lock_kind!("Lock", waiter, holder, |c: &Client| c.lock("steps"));
    walk(kind, &raw).await;
}

#[tokio::test]
async fn fenced_lock_cut_at_every_step() {
    let (_server, raw, waiter, holder) = setup().await;
    let kind = lock_kind!("FencedLock", waiter, holder, |c: &Client| c
        .fenced_lock("steps"));
    walk(kind, &raw).await;
}

#[tokio::test]
async fn fair_lock_cut_at_every_step() {
    let (_server, raw, waiter, holder) = setup().await;
    let probe = holder.fair_lock("steps");
    let kind = lock_kind!("FairLock", waiter, holder, |c: &Client| c
        .fair_lock("steps"));
    walk(kind, &raw).await;
    // Every waiter dropped left the queue.
    assert!(
        eventually(ROUND_TRIP, || async {
            probe.queued().await.unwrap().is_empty()
        })
        .await,
        "FairLock: waiters left in the queue: {:?}",
        probe.queued().await
    );
}

#[tokio::test]
async fn read_lock_cut_at_every_step() {
    let (_server, raw, waiter, holder) = setup().await;
    // A reader waits for a writer.
    let kind = lock_kind!(
        "ReadLock",
        mine: waiter.read_write_lock("steps").read(),
        theirs: holder.read_write_lock("steps").write(),
        probe: holder.read_write_lock("steps").write()
    );
    walk(kind, &raw).await;
}

#[tokio::test]
async fn write_lock_cut_at_every_step() {
    let (_server, raw, waiter, holder) = setup().await;
    // A writer waits for a reader.
    let kind = lock_kind!(
        "WriteLock",
        mine: waiter.read_write_lock("steps").write(),
        theirs: holder.read_write_lock("steps").read(),
        probe: holder.read_write_lock("steps").write()
    );
    walk(kind, &raw).await;
}

#[tokio::test]
async fn semaphore_cut_at_every_step() {
    let (_server, raw, waiter, holder) = setup().await;
    let mine = waiter.semaphore("steps");
    mine.try_set_permits(1).await.unwrap();
    let theirs = holder.semaphore("steps");
    let probe = holder.semaphore("steps");
    let kind = Kind {
        name: "Semaphore",
        acquire: Box::new(move || {
            let sem = mine.clone();
            boxed(async move {
                let permit = sem.acquire().await?;
                Ok(Box::new(move || boxed(permit.release())) as Release)
            })
        }),
        hold: Box::new(move || {
            let sem = theirs.clone();
            boxed(async move {
                let permit = sem
                    .try_acquire()
                    .await
                    .unwrap()
                    .expect("free for the holder");
                Box::new(move || boxed(permit.release())) as Release
            })
        }),
        free: Box::new(move || {
            let sem = probe.clone();
            boxed(async move { sem.available_permits().await.unwrap() == 1 })
        }),
    };
    walk(kind, &raw).await;
}

#[tokio::test]
async fn leased_semaphore_cut_at_every_step() {
    let (_server, raw, waiter, holder) = setup().await;
    let mine = waiter.leased_semaphore("steps");
    mine.try_set_permits(1).await.unwrap();
    let theirs = holder.leased_semaphore("steps");
    let probe = holder.leased_semaphore("steps");
    let kind = Kind {
        name: "LeasedSemaphore",
        acquire: Box::new(move || {
            let sem = mine.clone();
            boxed(async move {
                let permit = sem.acquire().await?;
                Ok(Box::new(move || boxed(permit.release())) as Release)
            })
        }),
        hold: Box::new(move || {
            let sem = theirs.clone();
            boxed(async move {
                let permit = sem
                    .try_acquire()
                    .await
                    .unwrap()
                    .expect("free for the holder");
                Box::new(move || boxed(permit.release())) as Release
            })
        }),
        free: Box::new(move || {
            let sem = probe.clone();
            boxed(async move {
                sem.available_permits().await.unwrap() == 1
                    && sem.acquired_permits().await.unwrap() == 0
            })
        }),
    };
    walk(kind, &raw).await;
}
