//! [`LeasedSemaphore`]: Redisson's `RPermitExpirableSemaphore` — a semaphore whose permits
//! have ids and leases, so that a crashed holder's permit comes back.

use std::sync::Arc;
use std::time::Duration;

use fred::types::Value;

use crate::conn::{lua_script, Call, Conn, LuaScript, Replicas};
use crate::engine::client_inner::ClientInner;
use crate::engine::holds::{HoldOps, Lease, Renewal};
use crate::engine::hub::Wake;
use crate::kinds::semaphore::{
    add_permits, check_count, check_recheck, set_permits, CHANNEL_PREFIX, DEFAULT_RECHECK_INTERVAL,
};
use crate::kinds::{lease_millis, prefix_name, suffix_name, Hooks, Kind, Named, Reply};
use crate::Guard;
use crate::{Error, Result};

mod permit;
pub use permit::{LeasedPermit, PermitId};
mod hooks;

lua_script!(ACQUIRE, "semaphore/leased_acquire.lua");
lua_script!(RELEASE, "semaphore/leased_release.lua");
lua_script!(RENEW, "semaphore/leased_renew.lua");
lua_script!(STATE, "semaphore/leased_state.lua");
lua_script!(SET_TOTAL, "semaphore/leased_set_permits.lua");
lua_script!(TAKEN, "semaphore/leased_taken.lua");

/// The score of a taken permit without a lease (a Redisson peer's `acquire()`).
const NO_LEASE_SCORE: i64 = 922_337_203_685_477;

/// Scripts of the leased semaphore, loaded at connect.
pub(crate) static SCRIPTS: &[&LuaScript] =
    &[&ACQUIRE, &RELEASE, &RENEW, &STATE, &SET_TOTAL, &TAKEN];

/// A distributed semaphore whose permits have **ids and leases**: at most as many holders at
/// once as it has permits, and a holder that crashes gives its permit back when its lease
/// ends. Made by [`Client::leased_semaphore`](crate::Client::leased_semaphore). Cheap to
/// clone; `Send + Sync`.
///
/// Each acquire takes one permit — or, with [`acquire_many`](Self::acquire_many) and its
/// siblings, several at once, all or none — and returns a [`LeasedPermit`]: the permits' ids,
/// their lease, and [`lost`](LeasedPermit::lost) like a lock guard's. As with a [`Lock`](crate::Lock),
/// the lease is either the client's watchdog lease, renewed by the client's watchdog for as
/// long as the permit is held ([`acquire`](Self::acquire)), or a fixed lease that is never
/// renewed ([`acquire_with_lease`](Self::acquire_with_lease)). Releasing the permit, dropping
/// it, or shutting the client down gives it back at once; a holder that dies stops renewing,
/// and its permit comes back within one lease.
///
/// The name says what it is: a semaphore of leased permits. It is Redisson's
/// `RPermitExpirableSemaphore` on the wire (see below), and Java services using
/// `getPermitExpirableSemaphore(name)` share permits with it.
///
/// # Leases end lazily
///
/// Nothing on the server ends a lease when it runs out: the next acquire (or
/// [`available_permits`](Self::available_permits)) that looks reclaims every permit whose
/// lease has ended and announces it. A waiter refused while leases are running parks at most
/// until the first one ends, then looks again; otherwise it parks until a release wakes it, or
/// at most the [recheck interval](Self::with_recheck_interval) (a Java peer's permit without a
/// lease never ends).
///
/// # Clocks
///
/// Lease ends are epoch milliseconds in Redis. redbaton's scripts read the **server's** clock
/// (`TIME`), so all redbaton clients agree on when a lease ends, whatever their own clocks
/// say, and a permit is never reclaimed while its holder still counts on it (the holder's
/// local deadline is measured from before it sent the acquire). Redisson computes lease ends
/// from each Java client's own clock: a Java client whose clock is ahead of the Redis server's
/// by `s` reclaims redbaton's permits `s` early, and one behind reclaims them late (and
/// redbaton reclaims its permits late or early by as much). Keep clocks synchronised (NTP)
/// when Java services share the semaphore, and leases well above the skew.
///
/// # Wire format
///
/// Redisson's `RPermitExpirableSemaphore`: the key (the name after the client's key prefix)
/// is a string holding the number of **free** permits (absent until set: every acquire
/// waits); `{name}:timeout` (`name:timeout` when the name has a `{`) is a sorted set of the
/// permits taken, whose members are the permit ids as 16 raw bytes and whose scores are the
/// lease ends in epoch milliseconds (`922337203685477` for a Java permit without a lease); the
/// channel is `redisson_sc:{name}` — the same as a [`Semaphore`](crate::Semaphore) of the same
/// name, whose waiters wake on these messages too — and its messages are decimal permit
/// counts: a release publishes the new number of free permits, a reclaim too,
/// [`try_set_permits`](Self::try_set_permits) the count set and
/// [`add_permits`](Self::add_permits) the delta. Counts that are not positive are not
/// published. An expiry set on the key is copied onto the sorted set by each acquire, as
/// Redisson does.
///
/// # Cancellation safety
///
/// Every acquiring method is cancellation safe: dropping its future leaves no permit taken
/// and no subscription behind. An acquire round trip dropped in flight, or whose reply comes
/// later than the command timeout, is finished in a spawned task and its permit released at
/// once; one whose connection broke in flight is settled: its id is released if it was taken.
///
/// # Example
///
/// ```no_run
/// # async fn run() -> redbaton::Result<()> {
/// use std::time::Duration;
/// let client = redbaton::Client::connect("redis://127.0.0.1:6379").await?;
/// let gpus = client.leased_semaphore("gpu-slots");
/// gpus.try_set_permits(2).await?;         // once; false if already set
///
/// let permit = gpus.acquire().await?;     // renewed by the watchdog while held
/// # async fn train() {}
/// tokio::select! {
///     _ = permit.lost() => eprintln!("permit {} lost; stopping", permit.id()),
///     _ = train() => permit.release().await?,
/// }
///
/// // A fixed lease: back in the pool after 10 minutes whatever happens.
/// if let Some(permit) = gpus.try_acquire_with_lease(Duration::ZERO, Duration::from_secs(600)).await? {
///     permit.release().await?;
/// }
/// # client.shutdown().await }
/// ```
#[derive(Clone)]
pub struct LeasedSemaphore {
    inner: Arc<Inner>,
    recheck: Duration,
    /// How many permits an acquire through this handle takes together (1 but for the
    /// handles `acquire_many` and its siblings make).
    permits: u32,
}

/// The most permits one [`LeasedSemaphore::acquire_many`] (or its siblings) takes together:
/// their ids travel in one call and are kept together, 32 hex digits each.
pub const MAX_PERMITS_AT_ONCE: u32 = 1000;

/// What a permit's hold needs: the keys, the channel, the client.
struct Inner {
    /// The engine's view: the name, and as its key the sorted set of taken permits (each
    /// permit is a hold of that key, its field `<client id>:<permit id in hex>`).
    named: Named,
    /// The counter of free permits.
    counter: Arc<str>,
    channel: Arc<str>,
}

impl LeasedSemaphore {
    pub(crate) fn new(client: Arc<ClientInner>, name: &str) -> LeasedSemaphore {
        let mut named = Named::new(client, name);
        let counter = named.key.clone();
        let channel = prefix_name(CHANNEL_PREFIX, &counter);
        let (timeouts, at) = suffix_name(&counter, "timeout");
        named.rekey(timeouts, at);
        LeasedSemaphore {
            inner: Arc::new(Inner {
                named,
                counter,
                channel,
            }),
            recheck: DEFAULT_RECHECK_INTERVAL,
            permits: 1,
        }
    }

    /// The semaphore's name as given.
    pub fn name(&self) -> &str {
        self.inner.named.name()
    }

    /// The Redis key of the counter of free permits (the name after the client's key prefix).
    pub fn key(&self) -> &str {
        &self.inner.counter
    }

    /// The Redis key of the sorted set of taken permits (`{name}:timeout`).
    pub fn timeout_key(&self) -> &str {
        &self.inner.named.key
    }

    /// The channel its releases are announced on.
    pub fn channel(&self) -> &str {
        &self.inner.channel
    }

    /// This handle with parked waiters looking again by themselves at least every `every`
    /// (instead of [`DEFAULT_RECHECK_INTERVAL`](crate::DEFAULT_RECHECK_INTERVAL)) when no
    /// lease is due sooner. Refused with [`Error::InvalidArgument`] below 1 ms or above
    /// [`MAX_RECHECK_INTERVAL`](crate::MAX_RECHECK_INTERVAL).
    pub fn with_recheck_interval(&self, every: Duration) -> Result<LeasedSemaphore> {
        Ok(LeasedSemaphore {
            inner: self.inner.clone(),
            recheck: check_recheck(every)?,
            permits: self.permits,
        })
    }

    /// Takes a permit, waiting as long as it takes; the watchdog renews its lease until it is
    /// released.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future takes no permit (see the type's documentation).
    #[must_use = "dropping the permit releases it at once; bind it (`let _permit = ...`) for as long as it must be held"]
    pub async fn acquire(&self) -> Result<LeasedPermit> {
        let permit = self.take(None, Lease::Watchdog).await?;
        Ok(permit.expect("waiting without a deadline ends only in a permit or an error"))
    }

    /// Takes a permit for a fixed `lease`, waiting as long as it takes. The lease is never
    /// renewed: past it the permit goes back to the pool, and the permit reports
    /// [`lost`](LeasedPermit::lost).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    #[must_use = "dropping the permit releases it at once; bind it (`let _permit = ...`) for as long as it must be held"]
    pub async fn acquire_with_lease(&self, lease: Duration) -> Result<LeasedPermit> {
        let lease = Lease::Fixed(lease_millis(lease)?);
        let permit = self.take(None, lease).await?;
        Ok(permit.expect("waiting without a deadline ends only in a permit or an error"))
    }

    /// One attempt, no waiting: `None` when no permit is free.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    #[must_use = "dropping the permit releases it at once; bind it (`let _permit = ...`) for as long as it must be held"]
    pub async fn try_acquire(&self) -> Result<Option<LeasedPermit>> {
        self.take(Some(Duration::ZERO), Lease::Watchdog).await
    }

    /// Waits up to `wait` for a permit (renewed by the watchdog): `None` when the wait ran
    /// out. `Duration::MAX` waits forever; `Duration::ZERO` is
    /// [`try_acquire`](Self::try_acquire).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    #[must_use = "dropping the permit releases it at once; bind it (`let _permit = ...`) for as long as it must be held"]
    pub async fn try_acquire_for(&self, wait: Duration) -> Result<Option<LeasedPermit>> {
        self.take(Some(wait), Lease::Watchdog).await
    }

    /// Waits up to `wait` for a permit taken for a fixed `lease` (never renewed).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    #[must_use = "dropping the permit releases it at once; bind it (`let _permit = ...`) for as long as it must be held"]
    pub async fn try_acquire_with_lease(
        &self,
        wait: Duration,
        lease: Duration,
    ) -> Result<Option<LeasedPermit>> {
        let lease = Lease::Fixed(lease_millis(lease)?);
        self.take(Some(wait), lease).await
    }

    /// Takes `permits` permits together, all or none (Redisson's `acquire(permits)`), waiting
    /// as long as it takes; the watchdog renews their lease until they are released. They are
    /// one [`LeasedPermit`], with an id each ([`ids`](LeasedPermit::ids)).
    ///
    /// Refused with [`Error::InvalidArgument`] for 0 or more than [`MAX_PERMITS_AT_ONCE`].
    /// There is no queue: a request for many permits can starve behind requests for few.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    #[must_use = "dropping the permit releases it at once; bind it (`let _permit = ...`) for as long as it must be held"]
    pub async fn acquire_many(&self, permits: u32) -> Result<LeasedPermit> {
        let permit = self.taking(permits)?.take(None, Lease::Watchdog).await?;
        Ok(permit.expect("waiting without a deadline ends only in a permit or an error"))
    }

    /// Takes `permits` permits together for a fixed `lease` (never renewed), all or none,
    /// waiting as long as it takes (Redisson's `acquire(permits, lease, unit)`). Refused as
    /// [`acquire_many`](Self::acquire_many) is.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    #[must_use = "dropping the permit releases it at once; bind it (`let _permit = ...`) for as long as it must be held"]
    pub async fn acquire_many_with_lease(
        &self,
        permits: u32,
        lease: Duration,
    ) -> Result<LeasedPermit> {
        let lease = Lease::Fixed(lease_millis(lease)?);
        let permit = self.taking(permits)?.take(None, lease).await?;
        Ok(permit.expect("waiting without a deadline ends only in a permit or an error"))
    }

    /// One attempt at `permits` permits taken together, all or none (renewed by the
    /// watchdog), no waiting (Redisson's `tryAcquire(permits)`): `None` when fewer were free.
    /// Refused as [`acquire_many`](Self::acquire_many) is.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    #[must_use = "dropping the permit releases it at once; bind it (`let _permit = ...`) for as long as it must be held"]
    pub async fn try_acquire_many(&self, permits: u32) -> Result<Option<LeasedPermit>> {
        self.taking(permits)?
            .take(Some(Duration::ZERO), Lease::Watchdog)
            .await
    }

    /// Waits up to `wait` for `permits` permits taken together, all or none (renewed by the
    /// watchdog): `None` when the wait ran out. `Duration::ZERO` is
    /// [`try_acquire_many`](Self::try_acquire_many); `Duration::MAX` waits forever. Refused
    /// as [`acquire_many`](Self::acquire_many) is.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    #[must_use = "dropping the permit releases it at once; bind it (`let _permit = ...`) for as long as it must be held"]
    pub async fn try_acquire_many_for(
        &self,
        permits: u32,
        wait: Duration,
    ) -> Result<Option<LeasedPermit>> {
        self.taking(permits)?
            .take(Some(wait), Lease::Watchdog)
            .await
    }

    /// Waits up to `wait` for `permits` permits taken together for a fixed `lease` (never
    /// renewed), all or none (Redisson's `tryAcquire(permits, wait, lease, unit)`; with
    /// `Duration::MAX` for `wait`, its `acquire(permits, lease, unit)`). Refused as
    /// [`acquire_many`](Self::acquire_many) is.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    #[must_use = "dropping the permit releases it at once; bind it (`let _permit = ...`) for as long as it must be held"]
    pub async fn try_acquire_many_with_lease(
        &self,
        permits: u32,
        wait: Duration,
        lease: Duration,
    ) -> Result<Option<LeasedPermit>> {
        let lease = Lease::Fixed(lease_millis(lease)?);
        self.taking(permits)?.take(Some(wait), lease).await
    }

    /// This handle, taking `permits` permits together.
    fn taking(&self, permits: u32) -> Result<LeasedSemaphore> {
        if permits == 0 || permits > MAX_PERMITS_AT_ONCE {
            return Err(Error::InvalidArgument(format!(
                "{permits} permits at once: between 1 and {MAX_PERMITS_AT_ONCE} are taken together"
            )));
        }
        Ok(LeasedSemaphore {
            permits,
            ..self.clone()
        })
    }

    async fn take(&self, wait: Option<Duration>, lease: Lease) -> Result<Option<LeasedPermit>> {
        let guard = crate::engine::acquire::acquire(self, wait, lease).await?;
        Ok(guard.map(|guard| LeasedPermit { guard }))
    }

    /// Releases the permit `id`, whoever took it (Redisson's `tryRelease(permitId)`): `true`
    /// when it was held and is free now, `false` when there is no such permit or its lease
    /// had already ended (a permit whose lease ended but that was not reclaimed yet is freed
    /// all the same, as Redisson does). A [`LeasedPermit`] of this id reports
    /// [`lost`](LeasedPermit::lost) once its client notices.
    pub async fn release_id(&self, id: &PermitId) -> Result<bool> {
        let named = &self.inner.named;
        named.check()?;
        let conn = &named.client.conn;
        let call = self
            .inner
            .release(conn, &id.to_string(), 1, 0, Replicas::Await);
        let reply = crate::engine::call::bounded(call, conn)
            .await
            .map_err(|failed| failed.to_error(conn, named.name()))?;
        Ok(reply.as_i64() == Some(0))
    }

    /// Sets the number of free permits to `permits` if the semaphore has none set yet (its
    /// key is absent): `true` when set, `false` when it already existed. Waiters are told.
    pub async fn try_set_permits(&self, permits: u32) -> Result<bool> {
        let inner = &self.inner;
        inner.named.check()?;
        check_count(permits, "permits")?;
        set_permits(&inner.named, &inner.counter, &inner.channel, permits, None).await
    }

    /// Adds `delta` free permits (a negative `delta` removes free ones; the count may go
    /// below zero). Creates the semaphore if it has no count yet. Clears any expiry set on
    /// the key, as Redisson does.
    ///
    /// Refused with [`Error::InvalidArgument`], nothing changed, when the free permits would
    /// go below `i32::MIN`, or they and the permits taken (each comes back to the count)
    /// above [`MAX_PERMITS`](crate::MAX_PERMITS): a Redisson peer reads the count as a Java
    /// `int`.
    pub async fn add_permits(&self, delta: i64) -> Result<()> {
        let inner = &self.inner;
        inner.named.check()?;
        let taken = Some(&*inner.named.key);
        add_permits(
            &inner.named,
            &inner.counter,
            &inner.channel,
            delta,
            taken,
            true,
        )
        .await
    }

    /// Makes the semaphore's total `permits`, on a live semaphore too (Redisson's
    /// `setPermits`): every permit whose lease ended is reclaimed first, then the free count
    /// becomes `permits` less the permits still taken (10 in total, 4 taken, set to 6: 2
    /// free; set to 3: -1 free, and acquires wait until one more is released). A semaphore
    /// with no count yet is created. Waiters are told when permits are free. Returns the new
    /// free count.
    ///
    /// Unlike Redisson's, ended leases do not count: a dead holder's permits come back
    /// first. Refused with [`Error::InvalidArgument`] for more than
    /// [`MAX_PERMITS`](crate::MAX_PERMITS).
    pub async fn set_permits(&self, permits: u32) -> Result<i64> {
        let inner = &self.inner;
        let named = &inner.named;
        named.check()?;
        check_count(permits, "permits")?;
        let conn = &named.client.conn;
        let args = vec![
            Value::from(i64::from(permits)),
            Value::from_static_str(conn.publish_command()),
            Value::from(&*inner.channel),
        ];
        let keys = [&*inner.counter, &*named.key];
        let (free, _taken): (i64, i64) = conn
            .eval(&SET_TOTAL, &keys, args)
            .await
            .map_err(|e| named.error(&e))?;
        Ok(free)
    }

    /// The permits taken now, by id, with the lease each has left by the server's clock
    /// (`None`: no lease, a Redisson peer's permit without one), after reclaiming every
    /// permit whose lease ended; at most `limit` of them, soonest to end first. For
    /// inspection (`redbaton status`); a permit's holder may be any process.
    pub async fn permits_taken(&self, limit: usize) -> Result<Vec<(PermitId, Option<Duration>)>> {
        let inner = &self.inner;
        let named = &inner.named;
        named.check()?;
        if limit == 0 {
            return Ok(Vec::new());
        }
        let conn = &named.client.conn;
        let args = vec![
            Value::from_static_str(conn.publish_command()),
            Value::from(&*inner.channel),
            Value::from(limit.min(i64::MAX as usize) as i64),
        ];
        let keys = [&*inner.counter, &*named.key];
        let listed: Vec<Value> = conn
            .eval(&TAKEN, &keys, args)
            .await
            .map_err(|e| named.error(&e))?;
        let unexpected = || Error::Redis(format!("unexpected permit list for {:?}", named.name()));
        let (now, listed) = listed.split_first().ok_or_else(unexpected)?;
        let now_ms = now.as_i64().ok_or_else(unexpected)?;
        let mut taken = Vec::new();
        for pair in listed.chunks(2) {
            let [id, score] = pair else {
                return Err(unexpected());
            };
            let bytes = id.as_bytes().and_then(|b| <[u8; 16]>::try_from(b).ok());
            // A member that is no permit id (written by hand) is not listed.
            let Some(bytes) = bytes else { continue };
            let score = score.as_f64().ok_or_else(unexpected)? as i64;
            let left = (score < NO_LEASE_SCORE)
                .then(|| Duration::from_millis(score.saturating_sub(now_ms).max(0) as u64));
            taken.push((PermitId::from_bytes(bytes), left));
        }
        Ok(taken)
    }

    /// The number of free permits now, after reclaiming every permit whose lease ended (0
    /// when the semaphore has no count yet).
    pub async fn available_permits(&self) -> Result<i64> {
        Ok(self.state(None).await?.0)
    }

    /// The number of permits taken now (by anyone), after reclaiming every permit whose
    /// lease ended.
    pub async fn acquired_permits(&self) -> Result<u64> {
        Ok(self.state(None).await?.1)
    }

    /// Sets the lease of the permit `id`, whoever took it, to end `lease` from now — longer
    /// or shorter than it was (Redisson's `updateLeaseTime(permitId, lease, unit)`): `true`
    /// when the permit was held, `false` when there is no such permit or its lease had
    /// already ended (it is reclaimed then, never revived, as Redisson does). Every permit
    /// whose lease ended is reclaimed first. Refused with [`Error::InvalidArgument`] for a
    /// lease shorter than [`MIN_LEASE`](crate::MIN_LEASE) or longer than [`MAX_LEASE`](crate::MAX_LEASE).
    ///
    /// Meant for permits held by id (a Java peer's, or one known only by its id). A
    /// [`LeasedPermit`] of this client keeps its own view: the watchdog goes on renewing a
    /// watchdog-leased one (a renewal never shortens a lease, so a shorter one lasts until
    /// the next renewal), and a fixed-lease one still reports [`lost`](LeasedPermit::lost)
    /// when its first lease ends, after which it is no longer released by its guard — the
    /// permit then comes back when the new lease ends.
    pub async fn update_lease_time(&self, id: &PermitId, lease: Duration) -> Result<bool> {
        let lease_ms = lease_millis(lease)?;
        Ok(self.state(Some((id, lease_ms))).await?.2)
    }

    /// Reclaims every permit whose lease ended, then counts the free and the taken permits —
    /// and, given `(id, lease)`, sets that permit's lease if it is still held.
    async fn state(&self, update: Option<(&PermitId, i64)>) -> Result<(i64, u64, bool)> {
        let inner = &self.inner;
        let named = &inner.named;
        named.check()?;
        let conn = &named.client.conn;
        let keys = [&*inner.counter, &*named.key];
        let mut args = vec![
            Value::from_static_str(conn.publish_command()),
            Value::from(&*inner.channel),
        ];
        if let Some((id, lease_ms)) = update {
            args.extend([Value::from(id.to_string()), Value::from(lease_ms)]);
        }
        let (free, taken, updated): (i64, i64, i64) = conn
            .eval(&STATE, &keys, args)
            .await
            .map_err(|e| named.error(&e))?;
        Ok((free, taken.max(0) as u64, updated == 1))
    }
}

impl std::fmt::Debug for LeasedSemaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeasedSemaphore")
            .field("name", &self.inner.named.name())
            .field("recheck", &self.recheck)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permit_ids_print_and_parse_as_hex() {
        let id = PermitId::from_bytes([
            0x00, 0xff, 0x10, 0x80, 0x7f, 0xc3, 0x28, 0xa0, 1, 2, 3, 4, 5, 6, 7, 0xfe,
        ]);
        let text = id.to_string();
        assert_eq!(text, "00ff10807fc328a001020304050607fe");
        assert_eq!(text.parse::<PermitId>().unwrap(), id);
        assert_eq!(text.to_uppercase().parse::<PermitId>().unwrap(), id);
        let bads = [
            String::new(),
            "00ff".to_owned(),
            "zz".repeat(16),
            "é".repeat(16),
            "+f".repeat(16),
            "0".repeat(33),
        ];
        for bad in &bads {
            assert!(matches!(
                bad.parse::<PermitId>(),
                Err(Error::InvalidArgument(_))
            ));
        }
        assert_ne!(PermitId::random(), PermitId::random());
    }
}
