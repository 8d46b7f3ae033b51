//! A [`LeasedPermit`] and its [`PermitId`]: permits with ids and leases, held until
//! released, dropped or lost.

use super::*;

/// One permit of a [`LeasedSemaphore`] — or several taken together by
/// [`acquire_many`](LeasedSemaphore::acquire_many) and its siblings — held until released or
/// dropped (dropping releases it in a background task, logged at `debug`).
///
/// While it lives, the permit may still be *lost*: a fixed lease ran out, someone released it
/// by its id, or the watchdog could not renew it for a whole lease (Redis unreachable).
/// [`lost`](LeasedPermit::lost) resolves when that happens. Permits taken together are held
/// and lost together: when one of them is released by its id, the others are not renewed any
/// more and come back when their lease ends.
#[must_use = "dropping the permit releases it"]
pub struct LeasedPermit {
    pub(super) guard: Guard<LeasedSemaphore>,
}

/// The id of a [`LeasedPermit`]: 16 random bytes, shown as 32 lowercase hex digits (as
/// Redisson shows its permit ids); parsed from hex in either case.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PermitId([u8; 16]);

impl PermitId {
    /// The id's 16 bytes, as stored in Redis.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The id made of these 16 bytes.
    pub fn from_bytes(bytes: [u8; 16]) -> PermitId {
        PermitId(bytes)
    }

    pub(super) fn random() -> PermitId {
        PermitId(rand::random())
    }
}

impl std::fmt::Display for PermitId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl std::fmt::Debug for PermitId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PermitId({self})")
    }
}

impl std::str::FromStr for PermitId {
    type Err = Error;

    fn from_str(text: &str) -> Result<PermitId> {
        let bad =
            || Error::InvalidArgument(format!("permit id {text:?} is not 32 hexadecimal digits"));
        if text.len() != 32 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let mut bytes = [0u8; 16];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(PermitId(bytes))
    }
}

impl LeasedPermit {
    /// The permit's id (as Redisson would show it: 32 hex digits); of permits taken together,
    /// the first one's (see [`ids`](Self::ids)).
    pub fn id(&self) -> PermitId {
        self.guard.extra()
    }

    /// The ids of the permits it holds: one, or those taken together, in the order taken.
    pub fn ids(&self) -> Vec<PermitId> {
        let field = self.guard.field();
        let hexes = field.rsplit(':').next().unwrap_or_default();
        hexes
            .as_bytes()
            .chunks(32)
            .map(|hex| {
                std::str::from_utf8(hex)
                    .ok()
                    .and_then(|hex| hex.parse().ok())
                    .expect("a permit's field ends in its ids, made here")
            })
            .collect()
    }

    /// How many permits it holds (1, or as many as were taken together).
    pub fn permits(&self) -> u32 {
        self.ids().len() as u32
    }

    /// Gives the permit back and wakes a waiter.
    ///
    /// Returns [`Error::NotHeld`] when the permit was lost meanwhile (its lease ended, it was
    /// released by id, renewal failed): then nothing is sent. If Redis does not confirm the
    /// release within the command timeout, the error is returned and the release goes on in
    /// the background.
    ///
    /// # Cancel safety
    ///
    /// Calling `release` gives the permit back whether or not its future is awaited to the
    /// end: dropped before its first poll, the future drops the permit, which releases it in
    /// the background; dropped once polled, the release is finished in the background.
    pub async fn release(self) -> Result<()> {
        self.guard.unlock().await
    }

    /// Resolves when the permit is lost. Never resolves while it is held.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only watches.
    pub async fn lost(&self) {
        self.guard.lost().await
    }

    /// When the permit was lost: `None` while it is valid (see
    /// [`Guard::lost_at`](crate::Guard::lost_at)).
    pub fn lost_at(&self) -> Option<std::time::Instant> {
        self.guard.lost_at()
    }

    /// Whether the permit is lost (by Redis's word or by the local clock).
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// The semaphore this permit belongs to.
    pub fn semaphore(&self) -> &LeasedSemaphore {
        self.guard.lock()
    }
}

impl std::fmt::Debug for LeasedPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeasedPermit")
            .field("semaphore", &self.semaphore().name())
            .field("id", &self.id())
            .field("lost", &self.is_lost())
            .finish()
    }
}
