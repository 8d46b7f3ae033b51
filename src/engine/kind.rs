//! What a kind is to the engine: the [`Kind`] trait every lock and semaphore implements, the
//! [`Named`] handle each is built on (its client, key and name), and the naming rules its keys
//! and channels follow (Redisson's `prefixName`, one cluster slot). The engine (the wait loop,
//! the guard) works through these alone, so it depends on no kind; the kinds themselves live in
//! [`crate::kinds`].

use std::ops::Range;
use std::sync::Arc;

use crate::engine::client_inner::ClientInner;
use crate::{Error, Result};

/// The longest lock name accepted.
pub const MAX_NAME_LEN: usize = 64 * 1024;

/// What every lock handle has: the client, the Redis key, and where the name is in the key.
pub(crate) struct Named {
    pub(crate) client: Arc<ClientInner>,
    pub(crate) key: Arc<str>,
    /// The lock's name is `key[name]`: the name is not kept apart, since every parked waiter
    /// keeps a handle and the key (the client's key prefix, then the name) has it already.
    name: Range<usize>,
}

impl Named {
    pub(crate) fn new(client: Arc<ClientInner>, name: &str) -> Named {
        let key = joined(&[&client.config.key_prefix, name]);
        let at = client.config.key_prefix.len();
        Named {
            client,
            key,
            name: at..at + name.len(),
        }
    }

    /// The same lock with `key` as its key: a key that has the present one at `at`.
    pub(crate) fn rekey(&mut self, key: Arc<str>, at: usize) {
        self.name = at + self.name.start..at + self.name.end;
        self.key = key;
    }

    /// The lock's name, as the caller gave it.
    pub(crate) fn name(&self) -> &str {
        &self.key[self.name.clone()]
    }

    /// The key the name makes (the client's key prefix, then the name), whatever
    /// [`rekey`](Self::rekey) made the key: the one the kind's channel and other keys are
    /// derived from, so the one whose slot they must share.
    fn name_key(&self) -> &str {
        let prefix = self.client.config.key_prefix.len();
        &self.key[self.name.start - prefix..self.name.end]
    }

    /// Refuses use after shutdown and names Redis cannot take. (The name is checked here, not
    /// once when the handle is made: a handle is often made for one call, and a field for
    /// the verdict would be kept in every one of them.)
    pub(crate) fn check(&self) -> Result<()> {
        if self.client.conn.is_closed() {
            return Err(Error::ShutDown);
        }
        match self.name().len() {
            0 => Err(Error::InvalidArgument("lock name is empty".to_owned())),
            len if len > MAX_NAME_LEN => Err(Error::InvalidArgument(format!(
                "lock name is {len} bytes long; the limit is {MAX_NAME_LEN}"
            ))),
            // On a cluster, a script may only touch keys (and shard channels) of one slot: a
            // lock whose channel lands elsewhere could be taken but never released.
            _ if self.client.conn.is_clustered() && !one_slot(self.name_key()) => {
                Err(Error::InvalidArgument(format!(
                    "lock name {:?} cannot be used on a cluster: its key and its channel {:?} \
                     hash to different slots (a name with a '{{' needs a non-empty hash tag \
                     closed after it, as in \"{{tag}}:rest\"; one without must not contain '}}')",
                    self.name(),
                    prefix_name("redisson_lock__channel", self.name_key()),
                )))
            }
            _ => Ok(()),
        }
    }

    /// The key's `PTTL`: -2 when it is absent, -1 when it has no expiry.
    pub(crate) async fn pttl(&self) -> Result<i64> {
        self.client
            .conn
            .read("PTTL", &self.key, vec![])
            .await
            .map_err(|e| self.error(&e))
    }

    /// Maps a fred error met on this lock.
    pub(crate) fn error(&self, err: &fred::error::Error) -> Error {
        self.client.conn.error(err, self.name())
    }

    /// The owner field of `owner`, or else of the hold of this lock whose scope the caller
    /// runs in; `None` outside every such scope (an acquisition there is a new owner).
    pub(crate) fn owner_field(&self, owner: Option<&Arc<str>>) -> Option<Arc<str>> {
        match owner {
            Some(field) => Some(field.clone()),
            None => self.enclosing().map(|number| self.task_field(number)),
        }
    }

    /// The owner `owner` names, or else the enclosing hold's (see [`owner_field`]).
    ///
    /// [`owner_field`]: Named::owner_field
    /// An owner read this way is given out: the hold it names is never handed on in memory
    /// (see [`Entry::give_out`](crate::engine::holds::Entry::give_out)).
    pub(crate) fn owner(&self, owner: Option<&Arc<str>>) -> Option<crate::Owner> {
        let field = self.owner_field(owner)?;
        self.client.holds.give_out(&self.key, &field);
        Some(field.parse().expect("owner fields are always well-formed"))
    }

    /// The owner number of the hold of this lock whose scope the caller runs in, if any.
    pub(crate) fn enclosing(&self) -> Option<u64> {
        crate::engine::scope::enclosing(&self.client.id, &self.key)
    }

    /// The owner field of the owner numbered `number` in this client.
    pub(crate) fn task_field(&self, number: u64) -> Arc<str> {
        owner_text(&self.client.id, number)
    }

    /// The error for a key that exists without the expiry every lock has.
    pub(crate) fn no_expiry(&self) -> Error {
        Error::WrongType {
            name: self.name().to_owned(),
            detail: "a hash without the expiry every lock has".to_owned(),
        }
    }
}

/// `<client id>:<number>` as one allocation (it is made on every acquire).
fn owner_text(client_id: &str, number: u64) -> Arc<str> {
    let mut digits = [0u8; 20];
    joined(&[client_id, ":", decimal(number, &mut digits)])
}

/// `number` in decimal, written at the end of `buf` (20 digits hold any `u64`): the owner
/// field is made on every acquire, and the formatting machinery costs more than the copy.
fn decimal(mut number: u64, buf: &mut [u8; 20]) -> &str {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (number % 10) as u8;
        number /= 10;
        if number == 0 {
            break;
        }
    }
    std::str::from_utf8(&buf[at..]).expect("ASCII digits")
}

/// `parts` joined as one allocation: copied into a stack buffer first when they fit, as an
/// owner field always does and most keys do (a `String` made into an `Arc<str>` would be two
/// allocations), with no formatting pass (a key and a field are made on every cycle).
fn joined(parts: &[&str]) -> Arc<str> {
    let len: usize = parts.iter().map(|part| part.len()).sum();
    let mut buf = [0u8; 160];
    if len > buf.len() {
        return parts.concat().into();
    }
    let mut at = 0;
    for part in parts {
        buf[at..at + part.len()].copy_from_slice(part.as_bytes());
        at += part.len();
    }
    Arc::from(std::str::from_utf8(&buf[..len]).expect("joined from whole strings"))
}

/// What an acquire script said.
#[derive(Debug)]
pub(crate) enum Reply<E> {
    /// Acquired: the owner's count is now `count` (1 for a fresh hold); `extra` is what the
    /// kind hands out besides (the fenced lock's token).
    Acquired {
        /// The owner's reentry count after this acquire.
        count: i64,
        /// What the kind adds to its guard.
        extra: E,
    },
    /// Another owner holds it for this many more milliseconds.
    Held(u64),
    /// Refused as [`Held`](Reply::Held), though permits are free: fewer than this acquire asks
    /// for, but a smaller request could take them (its wake-up is passed on to one).
    TooFew(u64),
}

/// What the engine asks of a kind, kept out of reach: the supertrait of [`Kind`] lives in a
/// private module, so outside code can neither implement `Kind` (the engine relies on each
/// kind's scripts and wire format) nor call these hooks (they run scripts and read replies
/// the engine must see).
pub(crate) mod hooks {
    use std::sync::Arc;
    use std::time::Duration;

    use fred::types::Value;

    use super::{Named, Reply};
    use crate::conn::{Call, Conn};
    use crate::engine::holds::HoldOps;
    use crate::engine::hub::Wake;
    use crate::Result;

    /// The engine's hooks of a [`Kind`](super::Kind).
    #[allow(private_interfaces)] // sealed: nameable only inside the crate
    pub trait Hooks: Clone {
        /// What a guard of this kind carries besides its hold (`()`, or the fenced lock's token).
        type Extra: Copy + Send + Sync + std::fmt::Debug + 'static;

        /// The lock's name, key and client.
        fn named(&self) -> &Named;

        /// The explicit owner of this handle, if any (else the owner of the enclosing hold's
        /// scope, or a new one).
        fn explicit_owner(&self) -> Option<&Arc<str>>;

        /// The hash field for the owner field `owner` (the write lock appends `:write`).
        fn field(&self, owner: Arc<str>) -> Arc<str> {
            owner
        }

        /// The owner part of a hash field made by [`field`](Hooks::field).
        fn owner_part<'a>(&self, field: &'a str) -> &'a str {
            field
        }

        /// The channel a waiter with `field` listens on, and how its messages wake.
        fn channel(&self, field: &Arc<str>) -> (Arc<str>, Wake);

        /// The acquire script for `field` with `lease_ms`. `waits`: the caller will wait if it is
        /// refused (the fair lock queues such a caller).
        fn acquire(&self, conn: &Conn, field: &str, lease_ms: i64, waits: bool) -> Call;

        /// Reads the acquire script's reply.
        fn decode(&self, reply: Value) -> Result<Reply<Self::Extra>>;

        /// Release and renewal of this kind's holds.
        fn ops(&self) -> Arc<dyn HoldOps>;

        /// What a waiter that gives up (timeout, cancellation, error) leaves behind to undo, as a
        /// call to run (the fair lock leaves its queue). Most kinds leave nothing. The engine runs
        /// it under the owner's turn, so after any attempt of the owner still in flight.
        fn give_up(&self, _conn: &Conn, _field: &str) -> Option<Call> {
            None
        }

        /// Whether a hold of this kind released by its owner's last guard may be passed to a
        /// parked waiter of the same client (see [`crate::engine::baton`]); such a kind supplies
        /// [`pass`](Hooks::pass).
        const PASSES: bool = false;

        /// The baton pass: one script that releases `field`'s hold if it is the last and, while
        /// no other client listens on the lock's channel, gives the lock to `next` with
        /// `lease_ms` (replying `-2`); otherwise it acts as the release script. With it, what the
        /// passed guard carries. Only kinds with [`PASSES`](Hooks::PASSES) supply it.
        fn pass(
            &self,
            _conn: &Conn,
            _field: &str,
            _next: &str,
            _lease_ms: i64,
        ) -> Option<(Call, Self::Extra)> {
            None
        }

        /// How many subscribers the lock's channel has (this client's own among them), read in
        /// the background for the local hand-off (see [`crate::engine::baton`]). Only kinds with
        /// [`PASSES`](Hooks::PASSES) supply it. (It takes the connection, which outside code
        /// cannot name, so that nothing outside can run it through a generic `K: Kind`.)
        fn listeners(
            &self,
            _conn: &Arc<Conn>,
        ) -> Option<futures::future::BoxFuture<'static, Result<i64>>> {
            None
        }

        /// The handle one acquire call works with, given how long it waits (`None`: no deadline;
        /// `Some(ZERO)`: one attempt): its attempts, give-up and guard use it. The fair lock
        /// queues with the wait, and must give up with the same. Most kinds ignore it.
        fn waiting(&self, _wait: Option<Duration>) -> Self {
            self.clone()
        }
    }
}

/// What every lock and semaphore handle is to the engine: [`Lock`](crate::Lock),
/// [`FairLock`](crate::FairLock), [`FencedLock`](crate::FencedLock), the halves
/// [`ReadLock`](crate::ReadLock) and [`WriteLock`](crate::WriteLock), and
/// [`LeasedSemaphore`](crate::LeasedSemaphore). A [`Guard<K>`](crate::Guard) is a hold of a
/// `K`.
///
/// It is named here so that code can be generic over guards. It is sealed: what the engine
/// asks of a kind (its scripts, channel, replies) lives in a private supertrait, so only this
/// crate implements it and nothing outside can call those hooks.
///
/// ```no_run
/// use redbaton::{Guard, Kind};
///
/// /// Runs `work` under any lock's guard, then releases it.
/// async fn under<K: Kind, T>(
///     guard: Guard<K>,
///     work: impl std::future::Future<Output = T>,
/// ) -> redbaton::Result<T> {
///     println!("holding {} as {}", K::KIND, guard.owner());
///     let out = guard.run(|| work).await?;
///     guard.unlock().await?;
///     Ok(out)
/// }
///
/// # async fn demo(client: redbaton::Client) -> redbaton::Result<()> {
/// under(client.lock("a").lock().await?, async {}).await?;
/// under(client.fair_lock("b").lock().await?, async {}).await?;
/// under(client.read_write_lock("c").write().lock().await?, async {}).await?;
/// # Ok(()) }
/// ```
pub trait Kind: hooks::Hooks + Clone + Send + Sync + 'static {
    /// The kind's name: its `kind` label in metrics (see the `metrics` feature).
    const KIND: &'static str;
}

/// `prefix:{name}`, or `prefix:name` when the name already has a `{` (Redisson's
/// `prefixName`): the braces put the channel or helper key in the lock key's cluster slot,
/// unless the key's own hash tag already decides it.
pub(crate) fn prefix_name(prefix: &str, key: &str) -> Arc<str> {
    if key.contains('{') {
        joined(&[prefix, ":", key])
    } else {
        joined(&[prefix, ":{", key, "}"])
    }
}

/// Redisson's `suffixName`: `{key}:suffix`, or `key:suffix` when the key already has a `{`
/// (the helper key lands in the key's cluster slot, as [`prefix_name`]'s names do); and where
/// `key` starts in it.
pub(crate) fn suffix_name(key: &str, suffix: &str) -> (Arc<str>, usize) {
    if key.contains('{') {
        (joined(&[key, ":", suffix]), 0)
    } else {
        (joined(&["{", key, "}:", suffix]), 1)
    }
}

/// Whether every name a kind derives from `key` (channels and helper keys, made by
/// [`prefix_name`] or the `{key}:suffix` / `key:suffix` form) lands in `key`'s cluster slot.
/// Both forms hash the same part of the name, so one comparison covers them; the hashed
/// parts, not the slots, are compared: two different parts may share a slot by chance for one
/// prefix and not for another.
pub(crate) fn one_slot(key: &str) -> bool {
    hashed(key) == hashed(&prefix_name("p", key))
}

/// The part of `key` Redis hashes to pick its slot: the content of the first `{…}`, when the
/// first `{` is closed by a later `}` with something between; else the whole key.
fn hashed(key: &str) -> &str {
    if let Some(open) = key.find('{') {
        let rest = &key[open + 1..];
        if let Some(len) = rest.find('}').filter(|&len| len > 0) {
            return &rest[..len];
        }
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixed_names_follow_redisson() {
        assert_eq!(
            &*prefix_name("redisson_lock__channel", "order:42"),
            "redisson_lock__channel:{order:42}"
        );
        assert_eq!(
            &*prefix_name("redisson_lock__channel", "{user}:a"),
            "redisson_lock__channel:{user}:a"
        );
    }

    #[test]
    fn suffixed_names_follow_redisson() {
        assert_eq!(suffix_name("gpu", "timeout"), ("{gpu}:timeout".into(), 1));
        assert_eq!(suffix_name("{a}:b", "timeout"), ("{a}:b:timeout".into(), 0));
    }

    #[test]
    fn names_placed_in_one_slot_are_told_apart() {
        let slot = |s: &str| fred::util::redis_keyslot(s.as_bytes());
        for bad in ["a}b", "x{", "a{", "{}z", "q}b", "}", "a{b", "{}"] {
            assert!(!one_slot(bad), "{bad:?} accepted");
        }
        for good in [
            "order:42", "{user}:a", "a{b}c}", "{a}", "x:{y}", "a:{b}{c}", "é{ü}",
        ] {
            assert!(one_slot(good), "{good:?} refused");
        }
        // The rule agrees with the slots Redis would compute, for every derived form.
        for name in [
            "a}b", "x{", "{}z", "order:42", "{user}:a", "a{b}c}", "k{}{t}",
        ] {
            let same = slot(name) == slot(&prefix_name("redisson_lock__channel", name))
                && slot(name) == slot(&prefix_name("redisson_lock_queue", name))
                && slot(name) == slot(&suffix_name(name, "timeout").0);
            assert_eq!(one_slot(name), same, "{name:?}");
        }
    }

    #[test]
    fn texts_of_any_length() {
        assert_eq!(&*joined(&["app:", "order:42"]), "app:order:42");
        assert_eq!(&*joined(&[]), "");
        let long = "y".repeat(1000);
        assert_eq!(&*joined(&["p:", &long]), format!("p:{long}"));
        let fits = "z".repeat(158);
        assert_eq!(&*joined(&["p:", &fits]), format!("p:{fits}"));
    }

    #[test]
    fn owner_texts_of_any_length() {
        assert_eq!(&*owner_text("abc", 7), "abc:7");
        assert_eq!(&*owner_text("abc", 0), "abc:0");
        assert_eq!(&*owner_text("abc", 1_000_000), "abc:1000000");
        let long = "x".repeat(200);
        assert_eq!(
            &*owner_text(&long, u64::MAX),
            format!("{long}:{}", u64::MAX)
        );
    }
}
