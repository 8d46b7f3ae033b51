//! What the public API promises beyond the lock family's shared invariants (tests/family.rs),
//! one subject per module, each against real redis-server processes: refusals of bad input,
//! the fenced lock's tokens, `run` around a closure, the user's own fred client, ownership by
//! scope, Redlock and MultiLock, `state`. One test binary: each of its own would be linked
//! apart.

mod bad_input;
mod fenced;
mod guard_run;
mod own_client;
mod ownership;
mod redlock;
mod state;
