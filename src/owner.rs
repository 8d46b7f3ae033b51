//! Owner identity: who holds a lock.
//!
//! Redisson names an owner `<client uuid>:<thread id>`. A tokio task moves between threads, so
//! redbaton's owner number is the current **tokio task id**: nested `lock()` calls in one task
//! re-enter, while another task of the same process waits like any other process. Code that
//! runs outside any task (the body of `#[tokio::main]`, or `block_on`) gets a per-thread number
//! from a range task ids never reach (task ids count up from 1; these start at 2^62).
//!
//! Futures combined with `join!`/`select!` inside one task share its id, and so re-enter each
//! other's locks. Work that deliberately moves between tasks can name its owner explicitly with
//! [`Lock::with_owner`](crate::Lock::with_owner).

use std::cell::Cell;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::Error;

/// First owner number handed to code running outside a tokio task.
const THREAD_OWNER_BASE: u64 = 1 << 62;

static NEXT_THREAD_OWNER: AtomicU64 = AtomicU64::new(THREAD_OWNER_BASE);

thread_local! {
    static THREAD_OWNER: Cell<u64> = const { Cell::new(0) };
}

/// The owner number of the caller: its tokio task id, or a per-thread number outside tasks.
pub(crate) fn current_owner_number() -> u64 {
    if let Some(id) = tokio::task::try_id() {
        // `Id` exposes no integer accessor; its Display form is the number. Written into a
        // stack buffer: this runs on every acquire, and must not allocate.
        if let Some(n) = display_number(&id) {
            return n;
        }
    }
    THREAD_OWNER.with(|cell| {
        if cell.get() == 0 {
            cell.set(NEXT_THREAD_OWNER.fetch_add(1, Ordering::Relaxed));
        }
        cell.get()
    })
}

/// Reads the number `value` displays as, without allocating (`None` if it is not one).
fn display_number(value: &impl fmt::Display) -> Option<u64> {
    struct Digits {
        buf: [u8; 20],
        len: usize,
    }
    impl fmt::Write for Digits {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            let end = self.len + s.len();
            self.buf
                .get_mut(self.len..end)
                .ok_or(fmt::Error)?
                .copy_from_slice(s.as_bytes());
            self.len = end;
            Ok(())
        }
    }
    let mut digits = Digits {
        buf: [0; 20],
        len: 0,
    };
    fmt::write(&mut digits, format_args!("{value}")).ok()?;
    std::str::from_utf8(&digits.buf[..digits.len])
        .ok()?
        .parse()
        .ok()
}

/// An explicit lock owner: the hash field `<client uuid>:<number>` stored in Redis.
///
/// Parse one from its text form to act as that owner, for example to re-enter a lock that a
/// parent process holds (the command-line tool passes it in `REDBATON_OWNER`), or to unlock in
/// a task other than the one that locked.
///
/// ```
/// let owner: redbaton::Owner = "157ddcf5-0cc2-445d-bdea-98160a459bd5:42".parse().unwrap();
/// assert_eq!(owner.number(), 42);
/// assert!("no-colon".parse::<redbaton::Owner>().is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Owner {
    client_id: String,
    number: u64,
}

impl Owner {
    pub(crate) fn new(client_id: &str, number: u64) -> Self {
        Owner {
            client_id: client_id.to_owned(),
            number,
        }
    }

    /// The client id part (a UUID for redbaton and Redisson clients).
    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// The owner number part (a task id, a thread id for Redisson).
    pub fn number(&self) -> u64 {
        self.number
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.client_id, self.number)
    }
}

impl FromStr for Owner {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let invalid = || {
            Error::InvalidArgument(format!(
                "owner {s:?} is not of the form <client id>:<number>"
            ))
        };
        let (client_id, number) = s.rsplit_once(':').ok_or_else(invalid)?;
        let number = number.parse::<u64>().map_err(|_| invalid())?;
        if client_id.is_empty() || client_id.contains(char::is_whitespace) {
            return Err(invalid());
        }
        Ok(Owner {
            client_id: client_id.to_owned(),
            number,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_numbers_do_not_collide_with_task_ids() {
        let here = current_owner_number();
        assert!(here >= THREAD_OWNER_BASE);
        assert_eq!(here, current_owner_number(), "stable per thread");
        let other = std::thread::spawn(current_owner_number).join().unwrap();
        assert_ne!(here, other);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tasks_get_their_own_numbers() {
        let a = tokio::spawn(async { current_owner_number() })
            .await
            .unwrap();
        let b = tokio::spawn(async { current_owner_number() })
            .await
            .unwrap();
        assert_ne!(a, b);
        assert!(a < THREAD_OWNER_BASE && b < THREAD_OWNER_BASE);
    }

    #[test]
    fn display_numbers_are_read_without_allocating() {
        assert_eq!(display_number(&0u64), Some(0));
        assert_eq!(display_number(&u64::MAX), Some(u64::MAX));
        assert_eq!(display_number(&"12x"), None);
        assert_eq!(display_number(&"123456789012345678901"), None, "too long");
    }

    #[test]
    fn owner_round_trips_through_text() {
        let o = Owner::new("abc-def", 7);
        assert_eq!(o.to_string(), "abc-def:7");
        assert_eq!(o.to_string().parse::<Owner>().unwrap(), o);
        assert!("abc:".parse::<Owner>().is_err());
        assert!(":5".parse::<Owner>().is_err());
        assert!("abc:-1".parse::<Owner>().is_err());
    }
}
