//! [`Semaphore`]: Redisson's `RSemaphore` — a counter of free permits that any number of
//! processes take from and give back to.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use fred::types::Value;

use crate::conn::{lua_script, Failed, LuaScript};
use crate::engine::acquire::traced;
use crate::engine::call::{bounded, Finish};
use crate::engine::client_inner::ClientInner;
use crate::engine::hub::Wake;
use crate::engine::wait::{wait_for, Attempts, Try};
use crate::kinds::{prefix_name, suffix_name, Named};
use crate::{Error, Result};

mod permit;
pub use permit::SemaphorePermit;
mod take;

use permit::give_back;
use take::SemaphoreAttempts;

lua_script!(ACQUIRE, "semaphore/acquire.lua");
lua_script!(RELEASE, "semaphore/release.lua");
lua_script!(SET_PERMITS, "semaphore/set_permits.lua");
lua_script!(ADD_PERMITS, "semaphore/add_permits.lua");
lua_script!(DRAIN, "semaphore/drain.lua");
lua_script!(SET_TOTAL, "semaphore/set_total.lua");

/// Scripts of the semaphores, loaded at connect.
pub(crate) static SCRIPTS: &[&LuaScript] = &[
    &ACQUIRE,
    &RELEASE,
    &SET_PERMITS,
    &ADD_PERMITS,
    &DRAIN,
    &SET_TOTAL,
];

/// Prefix of a semaphore's channel (Redisson's `redisson_sc`), shared by both semaphores.
pub(crate) const CHANNEL_PREFIX: &str = "redisson_sc";

/// The most permits one call takes, gives back or sets: Redisson counts permits in a Java
/// `int`, so a larger number could not be shared with it. For the same reason a release or
/// [`add_permits`](Semaphore::add_permits) that would take the count of free permits above
/// this (or `add_permits` below `i32::MIN`) is refused with [`Error::InvalidArgument`], and
/// nothing changes.
pub const MAX_PERMITS: u32 = i32::MAX as u32;

/// How long a semaphore waiter trusts the channel before it looks again by itself, unless
/// set with [`Semaphore::with_recheck_interval`].
pub const DEFAULT_RECHECK_INTERVAL: Duration = Duration::from_secs(5);

/// The longest recheck interval accepted.
pub const MAX_RECHECK_INTERVAL: Duration = Duration::from_secs(3600);

/// A distributed counting semaphore: at most as many holders at once as it has permits.
/// Made by [`Client::semaphore`](crate::Client::semaphore). Cheap to clone; `Send + Sync`.
///
/// # Permits are not owned
///
/// Taking permits returns a [`SemaphorePermit`]: dropping it — at the end of its scope, on an
/// error path, when its task is cancelled — gives them back (in a background task), as a
/// `tokio::sync::SemaphorePermit` does; [`SemaphorePermit::release`] gives them back and
/// reports errors; [`SemaphorePermit::forget`] keeps them taken, for code that gives them
/// back later with [`release`](Self::release) (Redisson's way).
/// [`Client::shutdown`](crate::Client::shutdown) gives back those still held.
///
/// That guard lives in this process only. **In Redis a permit belongs to nobody.** Taking
/// one decrements a counter; giving one back increments it — from any task, any process,
/// whether or not it took one. Nothing records who holds what, so nothing can give back the
/// permits of a process that crashed or hung, or that forgot permits it was told to keep:
/// **they are lost for good** (until someone calls [`add_permits`](Self::add_permits) or
/// [`release`](Self::release) for them). And a [`release`](Self::release) by a caller that
/// took nothing creates permits out of thin air. This is Redisson's `RSemaphore`, faithfully.
/// When holders can die, use a [`LeasedSemaphore`](crate::LeasedSemaphore): its permits have
/// ids and leases, and come back when their holder stops renewing them.
///
/// # Waiting
///
/// A waiter that finds too few permits subscribes to the semaphore's channel through the
/// client's shared subscriber, looks once more, and parks. Every release publishes the new
/// number of free permits; a message `n` wakes up to `n` of the waiters of each process
/// (not one, not all), which each try again. A woken waiter that asks for more permits than
/// are free passes its wake-up on to the waiters of its process that have not looked since
/// the message, so the permits reach a smaller request parked behind a larger one; each
/// waiter looks at most once per message. There is no queue and no fairness, so a large
/// request can starve behind small ones. Unlike Redisson's `acquire()`, which waits on
/// pub/sub alone and hangs when a message is lost, a parked waiter also looks again by
/// itself every [`DEFAULT_RECHECK_INTERVAL`] (5 s; see
/// [`with_recheck_interval`](Self::with_recheck_interval)) and whenever the subscriber
/// reconnected, so a lost message costs at most that long.
///
/// # Cancellation safety
///
/// Every acquiring method is cancellation safe: dropping its future leaves no permit taken
/// and no subscription behind. An acquire round trip dropped in flight, or whose reply comes
/// later than the command timeout, is finished in a spawned task, and the permits it took are
/// given back at once. Only a connection that breaks with an acquire in flight leaves it
/// unknown whether it took its permits; since a permit has no owner, they cannot be looked up
/// and are not given back (giving back permits that were never taken would let too many
/// holders in) — the call returns [`Error::Connection`].
///
/// # Wire format
///
/// Redisson's `RSemaphore`: the key (the name after the client's key prefix) is a string
/// holding the number of free permits, absent until set; the channel is
/// `redisson_sc:{name}`, and its messages are decimal permit counts: a release and
/// [`add_permits`](Self::add_permits) publish the new count, and
/// [`try_set_permits`](Self::try_set_permits) the count set. A count that is not positive is
/// not published (Redisson would; it wakes nobody, and a negative one breaks its listeners).
/// Java services using Redisson's `getSemaphore(name)` and Rust services share permits.
///
/// # Example
///
/// ```no_run
/// # async fn run() -> redbaton::Result<()> {
/// use std::time::Duration;
/// let client = redbaton::Client::connect("redis://127.0.0.1:6379").await?;
/// let crawlers = client.semaphore("crawler-slots");
/// crawlers.try_set_permits(4).await?;     // once; false if already set
///
/// let permit = crawlers.acquire().await?; // waits for a free permit
/// // ... crawl; an error here drops `permit`, which gives it back; if this process dies
/// // here, the permit is lost for good ...
/// permit.release().await?;                 // or drop it: given back in the background
///
/// if let Some(permits) = crawlers.try_acquire_many_for(2, Duration::from_secs(1)).await? {
///     permits.release().await?;
/// }
///
/// // Redisson's way: taken here, given back later by whoever finishes the job.
/// crawlers.acquire().await?.forget();
/// crawlers.release(1).await?;
/// # client.shutdown().await }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    inner: Arc<Inner>,
    recheck: Duration,
}

struct Inner {
    named: Named,
    channel: Arc<str>,
    /// The record of the total number of permits (`{name}:permits`), which
    /// [`set_permits`](Semaphore::set_permits) moves the free count from.
    total: Arc<str>,
}

impl Semaphore {
    pub(crate) fn new(client: Arc<ClientInner>, name: &str) -> Semaphore {
        let named = Named::new(client, name);
        let channel = prefix_name(CHANNEL_PREFIX, &named.key);
        let (total, _) = suffix_name(&named.key, "permits");
        Semaphore {
            inner: Arc::new(Inner {
                named,
                channel,
                total,
            }),
            recheck: DEFAULT_RECHECK_INTERVAL,
        }
    }

    /// The semaphore's name as given.
    pub fn name(&self) -> &str {
        self.inner.named.name()
    }

    /// The Redis key of the counter (the name after the client's key prefix).
    pub fn key(&self) -> &str {
        &self.inner.named.key
    }

    /// The channel its releases are announced on.
    pub fn channel(&self) -> &str {
        &self.inner.channel
    }

    /// This handle with parked waiters looking again by themselves every `every` (instead of
    /// [`DEFAULT_RECHECK_INTERVAL`]), in case a message was lost or permits appeared without
    /// one (a raw `SET`). Shorter costs Redis one script call per waiter per interval.
    ///
    /// Refused with [`Error::InvalidArgument`] below 1 ms or above [`MAX_RECHECK_INTERVAL`].
    pub fn with_recheck_interval(&self, every: Duration) -> Result<Semaphore> {
        Ok(Semaphore {
            inner: self.inner.clone(),
            recheck: check_recheck(every)?,
        })
    }

    /// Sets the number of free permits to `permits` if the semaphore has none set yet (its
    /// key is absent): `true` when set, `false` when it already existed. Waiters are told.
    /// It also records `permits` as the semaphore's total, which
    /// [`set_permits`](Self::set_permits) changes later.
    pub async fn try_set_permits(&self, permits: u32) -> Result<bool> {
        let named = &self.inner.named;
        named.check()?;
        check_count(permits, "permits")?;
        let record = Some(&*self.inner.total);
        set_permits(named, &named.key, &self.inner.channel, permits, record).await
    }

    /// Makes the semaphore's total `permits`, on a live semaphore too: the free count moves
    /// by the difference from the total set last, so permits held now stay counted (4 held
    /// of a total of 10, set to 6: 2 free; set to 3: -1 free, and acquires wait until one
    /// more is given back). Waiters are told when permits become free. Returns the new free
    /// count.
    ///
    /// A plain permit belongs to nobody, so the total is a record redbaton keeps beside the
    /// count (`{name}:permits`), written by [`try_set_permits`](Self::try_set_permits), this
    /// method and [`add_permits`](Self::add_permits). A semaphore with no count yet is
    /// created with `permits` free. One whose count was set without that record — by a
    /// Redisson peer, or by [`release`](Self::release) or `add_permits` on an absent count
    /// — is refused with [`Error::InvalidArgument`], nothing changed: its total is unknown
    /// (change it with `add_permits(delta)`, or delete its key and set it again). Redisson's
    /// own `addPermits` does not move the record.
    ///
    /// Refused with [`Error::InvalidArgument`], nothing changed, for more than
    /// [`MAX_PERMITS`], or when the free count would leave the range of a Java `int`.
    pub async fn set_permits(&self, permits: u32) -> Result<i64> {
        let named = &self.inner.named;
        named.check()?;
        check_count(permits, "permits")?;
        let conn = &named.client.conn;
        let args = vec![
            Value::from(i64::from(permits)),
            Value::from_static_str(conn.publish_command()),
            Value::from(&*self.inner.channel),
        ];
        let keys = [&*named.key, &*self.inner.total];
        let reply: Value = conn.eval(&SET_TOTAL, &keys, args).await.map_err(|e| {
            if e.details().starts_with("NOTOTAL") {
                Error::InvalidArgument(format!(
                    "semaphore {:?} has a count but no record of its total (set by a Redisson \
                     peer, or by release/add_permits on an absent count): change it with \
                     add_permits(delta), or delete its key and set it again",
                    named.name()
                ))
            } else {
                named.error(&e)
            }
        })?;
        match reply {
            Value::Null => Err(out_of_range(named, &format!("a total of {permits}"))),
            reply => reply.as_i64().ok_or_else(|| {
                Error::Redis(format!(
                    "unexpected set_permits reply for {:?}",
                    named.name()
                ))
            }),
        }
    }

    /// Adds `delta` free permits (a negative `delta` removes some; the count may go below
    /// zero, and then acquires wait until releases bring it back up). Creates the semaphore if
    /// it has no count yet. Clears any expiry set on the key, as Redisson does. The total
    /// recorded for [`set_permits`](Self::set_permits), if any, moves by `delta` too.
    ///
    /// Refused with [`Error::InvalidArgument`], nothing changed, when the count would leave
    /// the range of a Java `int` (a Redisson peer could not read it).
    pub async fn add_permits(&self, delta: i64) -> Result<()> {
        let named = &self.inner.named;
        named.check()?;
        let record = Some(&*self.inner.total);
        add_permits(named, &named.key, &self.inner.channel, delta, record, false).await
    }

    /// The key of the total recorded for [`set_permits`](Self::set_permits)
    /// (`{name}:permits`).
    pub fn total_key(&self) -> &str {
        &self.inner.total
    }

    /// The total recorded for [`set_permits`](Self::set_permits): `None` when none was (the
    /// count was set by a Redisson peer, or by `release`/`add_permits` on an absent count).
    pub async fn total_permits(&self) -> Result<Option<i64>> {
        let named = &self.inner.named;
        named.check()?;
        let value: Option<String> = named
            .client
            .conn
            .read("GET", &self.inner.total, vec![])
            .await
            .map_err(|e| named.error(&e))?;
        match value {
            None => Ok(None),
            value => parse_count(named, value).map(Some),
        }
    }

    /// The number of free permits now (0 when the semaphore has no count yet; negative after
    /// [`add_permits`](Self::add_permits) took more than there were).
    pub async fn available_permits(&self) -> Result<i64> {
        let named = &self.inner.named;
        named.check()?;
        let value: Option<String> = named
            .client
            .conn
            .read("GET", &named.key, vec![])
            .await
            .map_err(|e| named.error(&e))?;
        parse_count(named, value)
    }

    /// Takes one permit, waiting as long as it takes (tokio's `Semaphore::acquire`); it is
    /// held until the [`SemaphorePermit`] is released, dropped or
    /// [forgotten](SemaphorePermit::forget).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future takes no permit (see the type's documentation).
    #[must_use = "dropping the permit gives its permits back at once; bind it (`let _permit = ...`) for as long as they must be held"]
    pub async fn acquire(&self) -> Result<SemaphorePermit> {
        self.acquire_many(1).await
    }

    /// Takes `permits` permits together, waiting as long as it takes (tokio's
    /// `acquire_many`); they are held until the [`SemaphorePermit`] is released, dropped or
    /// [forgotten](SemaphorePermit::forget). `0` returns at once.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    #[must_use = "dropping the permit gives its permits back at once; bind it (`let _permit = ...`) for as long as they must be held"]
    pub async fn acquire_many(&self, permits: u32) -> Result<SemaphorePermit> {
        let taken = self.take(permits, None).await?;
        Ok(taken.expect("waiting without a deadline ends only in permits or an error"))
    }

    /// One attempt at one permit, no waiting: `None` when none is free.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    #[must_use = "dropping the permit gives its permits back at once; bind it (`let _permit = ...`) for as long as they must be held"]
    pub async fn try_acquire(&self) -> Result<Option<SemaphorePermit>> {
        self.take(1, Some(Duration::ZERO)).await
    }

    /// One attempt at `permits` permits, no waiting: `None` when fewer were free. `0` is
    /// taken with no call to Redis, as in Redisson.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    #[must_use = "dropping the permit gives its permits back at once; bind it (`let _permit = ...`) for as long as they must be held"]
    pub async fn try_acquire_many(&self, permits: u32) -> Result<Option<SemaphorePermit>> {
        self.take(permits, Some(Duration::ZERO)).await
    }

    /// Waits up to `wait` for one permit: `None` when the wait ran out. `Duration::MAX` waits
    /// forever; `Duration::ZERO` is [`try_acquire`](Self::try_acquire).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    #[must_use = "dropping the permit gives its permits back at once; bind it (`let _permit = ...`) for as long as they must be held"]
    pub async fn try_acquire_for(&self, wait: Duration) -> Result<Option<SemaphorePermit>> {
        self.take(1, Some(wait)).await
    }

    /// Waits up to `wait` for `permits` permits taken together: `None` when the wait ran
    /// out. `Duration::MAX` waits forever; `Duration::ZERO` is
    /// [`try_acquire_many`](Self::try_acquire_many).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    #[must_use = "dropping the permit gives its permits back at once; bind it (`let _permit = ...`) for as long as they must be held"]
    pub async fn try_acquire_many_for(
        &self,
        permits: u32,
        wait: Duration,
    ) -> Result<Option<SemaphorePermit>> {
        self.take(permits, Some(wait)).await
    }

    /// Gives `permits` permits back and wakes as many waiters. `0` does nothing. This is the
    /// way back for permits [forgotten](SemaphorePermit::forget) or
    /// [drained](Self::drain_permits); a [`SemaphorePermit`] gives its own back.
    ///
    /// Anyone may release, whether or not it acquired: releasing more than was taken raises
    /// the number of permits for good — up to [`MAX_PERMITS`] free: a release past it is
    /// refused with [`Error::InvalidArgument`], nothing changed.
    ///
    /// # Cancel safety
    ///
    /// Once the future is polled, the release is carried out even if it is then dropped (a
    /// future dropped before its first poll does nothing); an [`Error::Timeout`] likewise
    /// does not mean it did not happen.
    pub async fn release(&self, permits: u32) -> Result<()> {
        self.inner.named.check()?;
        check_count(permits, "permits")?;
        release(self.inner.clone(), permits).await
    }

    /// Takes every free permit at once (Redisson's `drainPermits`): the count becomes 0, and
    /// the number there was is returned (0 when the semaphore has no count yet, which is left
    /// unset). The drained permits are taken by nobody in particular, as Redisson's are: give
    /// them back with [`release`](Self::release), or they are gone. A count that was negative
    /// (after [`add_permits`](Self::add_permits) took more than there were) is raised to 0
    /// and returned as it was, as Redisson (and `java.util.concurrent.Semaphore`) do.
    ///
    /// Like Redisson's, it clears any expiry set on the key and publishes nothing (no permit
    /// became free).
    #[must_use = "the drained permits are taken: give them back with `release(n)` or they are gone"]
    pub async fn drain_permits(&self) -> Result<i64> {
        let named = &self.inner.named;
        named.check()?;
        let conn = &named.client.conn;
        // A counted call, never re-sent blind: a second run would drain permits released in
        // between, which nobody would give back.
        let call = conn.call(&DRAIN, &[&named.key], vec![]);
        let reply = bounded(call, conn)
            .await
            .map_err(|failed| failed.to_error(conn, named.name()))?;
        reply
            .as_i64()
            .ok_or_else(|| Error::Redis(format!("unexpected drain reply for {:?}", named.name())))
    }

    async fn take(&self, permits: u32, wait: Option<Duration>) -> Result<Option<SemaphorePermit>> {
        let named = &self.inner.named;
        named.check()?;
        check_count(permits, "permits")?;
        if permits == 0 {
            return Ok(Some(SemaphorePermit::new(self.inner.clone(), 0)));
        }
        let attempts = SemaphoreAttempts {
            inner: self.inner.clone(),
            permits,
            recheck_ms: self.recheck.as_millis() as u64,
        };
        let span = tracing::trace_span!("acquire", semaphore = %named.name(), permits);
        traced(wait_for(attempts, wait), span).await
    }
}

/// Gives `permits` (already checked) back, as a call whose caller may leave: once polled, the
/// round trip is finished in the background if it is dropped or times out.
async fn release(inner: Arc<Inner>, permits: u32) -> Result<()> {
    if permits == 0 {
        return Ok(());
    }
    let conn = inner.named.client.conn.clone();
    Finish::new(give_back(inner, permits), &conn)
        .await
        .map(drop)
}

/// Refuses a number of permits Redisson could not hold.
pub(crate) fn check_count(n: u32, what: &str) -> Result<()> {
    if n > MAX_PERMITS {
        return Err(Error::InvalidArgument(format!(
            "{what} {n} is more than the {MAX_PERMITS} a semaphore counts"
        )));
    }
    Ok(())
}

/// Refuses a recheck interval out of range.
pub(crate) fn check_recheck(every: Duration) -> Result<Duration> {
    if every < Duration::from_millis(1) || every > MAX_RECHECK_INTERVAL {
        return Err(Error::InvalidArgument(format!(
            "recheck interval {every:?} is not between 1 ms and {MAX_RECHECK_INTERVAL:?}"
        )));
    }
    Ok(every)
}

/// Reads a permit counter's value (absent: 0).
pub(crate) fn parse_count(named: &Named, value: Option<String>) -> Result<i64> {
    match value {
        None => Ok(0),
        Some(text) => text.parse().map_err(|_| Error::WrongType {
            name: named.name().to_owned(),
            detail: "the semaphore key holds a string that is not a permit count".to_owned(),
        }),
    }
}

/// `trySetPermits` on the counter `counter`, shared by both semaphores; `record` is a plain
/// semaphore's record of its total, set with the count.
pub(crate) async fn set_permits(
    named: &Named,
    counter: &str,
    channel: &str,
    permits: u32,
    record: Option<&str>,
) -> Result<bool> {
    let conn = &named.client.conn;
    let args = vec![
        Value::from(i64::from(permits)),
        Value::from_static_str(conn.publish_command()),
        Value::from(channel),
    ];
    let mut keys = vec![counter];
    keys.extend(record);
    let set: i64 = conn
        .eval(&SET_PERMITS, &keys, args)
        .await
        .map_err(|e| named.error(&e))?;
    Ok(set == 1)
}

/// `addPermits` on the counter `counter`, shared by both semaphores. With `leased`, `other`
/// is a leased semaphore's sorted set of taken permits: they count towards the limit (each
/// comes back to the counter), and its messages carry the delta rather than the new count, as
/// Redisson's `RPermitExpirableSemaphore` does. Without, `other` is a plain semaphore's
/// record of its total, moved by the delta when it exists.
pub(crate) async fn add_permits(
    named: &Named,
    counter: &str,
    channel: &str,
    delta: i64,
    other: Option<&str>,
    leased: bool,
) -> Result<()> {
    if delta.unsigned_abs() > u64::from(MAX_PERMITS) {
        return Err(Error::InvalidArgument(format!(
            "delta {delta} is more than the {MAX_PERMITS} permits a semaphore counts at once"
        )));
    }
    if delta == 0 {
        return Ok(());
    }
    let conn = &named.client.conn;
    let message = if leased { "delta" } else { "count" };
    let args = vec![
        Value::from(delta),
        Value::from_static_str(conn.publish_command()),
        Value::from(message),
        Value::from(channel),
    ];
    let mut keys = vec![counter];
    keys.extend(other);
    // A counted call, never re-sent blind: a second run would add twice.
    let call = conn.call(&ADD_PERMITS, &keys, args);
    let reply = bounded(call, conn)
        .await
        .map_err(|failed| failed.to_error(conn, named.name()))?;
    match reply {
        Value::Null => Err(out_of_range(named, &format!("adding {delta} permits"))),
        _ => Ok(()),
    }
}

/// The refusal of a change that would take a semaphore's count where a Redisson peer could
/// not read it (it reads the count as a Java `int`).
fn out_of_range(named: &Named, change: &str) -> Error {
    Error::InvalidArgument(format!(
        "{change} would take the permits of semaphore {:?} out of the range {} to {MAX_PERMITS} \
         a Redisson peer reads; nothing changed",
        named.name(),
        i32::MIN
    ))
}

impl std::fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.inner.named.name())
            .field("recheck", &self.recheck)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_names_follow_redisson() {
        assert_eq!(
            &*prefix_name(CHANNEL_PREFIX, "slots"),
            "redisson_sc:{slots}"
        );
        assert_eq!(&*prefix_name(CHANNEL_PREFIX, "{a}:b"), "redisson_sc:{a}:b");
    }

    #[test]
    fn counts_and_intervals_are_checked() {
        assert!(check_count(MAX_PERMITS, "permits").is_ok());
        assert!(check_count(MAX_PERMITS + 1, "permits").is_err());
        assert!(check_recheck(Duration::ZERO).is_err());
        assert!(check_recheck(Duration::from_millis(1)).is_ok());
        assert!(check_recheck(Duration::MAX).is_err());
    }
}
