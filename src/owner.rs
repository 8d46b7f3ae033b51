//! Owner identity: who holds a lock.
//!
//! Redisson names an owner `<client uuid>:<thread id>`, and a Java thread is a sequential
//! execution. In async Rust the sequential context is a hold's scope, not a tokio task (see
//! [`crate::engine::scope`]): every acquisition outside a scope takes a new number from its client,
//! and one inside re-enters the enclosing hold. The hash field keeps Redisson's form,
//! `<client uuid>:<number>`, so Redisson peers see no difference. Work that deliberately
//! moves a hold between tasks or processes names its owner explicitly with
//! [`Lock::with_owner`](crate::Lock::with_owner).

use std::fmt;
use std::str::FromStr;

use crate::Error;

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
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Owner {
    client_id: String,
    number: u64,
}

impl Owner {
    /// The client id part (a UUID for redbaton and Redisson clients).
    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// The owner number part (one per acquisition outside a hold's scope for redbaton, a
    /// thread id for Redisson).
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
    fn owner_round_trips_through_text() {
        let o: Owner = "abc-def:7".parse().unwrap();
        assert_eq!((o.client_id(), o.number()), ("abc-def", 7));
        assert_eq!(o.to_string(), "abc-def:7");
        assert_eq!(o.to_string().parse::<Owner>().unwrap(), o);
        assert!("abc:".parse::<Owner>().is_err());
        assert!(":5".parse::<Owner>().is_err());
        assert!("abc:-1".parse::<Owner>().is_err());
    }
}
