//! Exit statuses and the one-line failure messages that go with them.

use std::fmt;
use std::process::ExitCode;

use redbaton::Error;

/// A usage error: bad option, bad duration, missing `--`.
pub const USAGE: u8 = 64;
/// Invalid NAME, or the key is not a lock.
pub const DATA: u8 = 65;
/// Redis unreachable.
pub const UNAVAILABLE: u8 = 69;
/// Anything else.
pub const SOFTWARE: u8 = 70;
/// CMD ran, but the lock could not be released afterwards: it may stay held until its lease
/// ends.
pub const RELEASE_FAILED: u8 = 74;
/// The lease was lost while CMD ran, or before it could start.
pub const LEASE_LOST: u8 = 76;
/// Authentication refused.
pub const NOPERM: u8 = 77;
/// CMD could not be executed.
pub const NOT_EXECUTABLE: u8 = 126;
/// CMD was not found.
pub const NOT_FOUND: u8 = 127;

/// A failure: the status to exit with and the line to print on stderr (none when empty:
/// `exec --quiet`'s conflict).
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }

    /// A failure that prints nothing.
    pub fn quiet(code: u8) -> Self {
        Failure::new(code, "")
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// The status for a library error.
pub fn code_of(err: &Error) -> u8 {
    match err {
        Error::Connection(_) | Error::Timeout(_) => UNAVAILABLE,
        Error::Auth(_) => NOPERM,
        Error::WrongType { .. } | Error::InvalidArgument(_) => DATA,
        _ => SOFTWARE,
    }
}

impl From<Error> for Failure {
    fn from(err: Error) -> Self {
        let message = match &err {
            Error::Connection(detail) => format!("Redis unreachable: {detail}"),
            Error::WrongType { name, .. } => {
                format!("key {name:?} is not a lock (WRONGTYPE); it was left untouched")
            }
            other => other.to_string(),
        };
        Failure::new(code_of(&err), message)
    }
}

/// What `main` returns: success, a status of our own, or a failure to report.
pub enum Outcome {
    Status(u8),
    Failed(Failure),
}

impl Outcome {
    pub fn exit(self) -> ExitCode {
        match self {
            Outcome::Status(code) => ExitCode::from(code),
            Outcome::Failed(failure) => {
                if !failure.message.is_empty() {
                    eprintln!("redbaton: {failure}");
                }
                ExitCode::from(failure.code)
            }
        }
    }
}

impl From<Result<u8, Failure>> for Outcome {
    fn from(result: Result<u8, Failure>) -> Self {
        match result {
            Ok(code) => Outcome::Status(code),
            Err(failure) => Outcome::Failed(failure),
        }
    }
}
