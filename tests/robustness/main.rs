//! Robustness, one subject per module, against real redis-server processes: cancellation at
//! every await, fred's error texts the error classification depends on, failover through a
//! stalled replica, paths the design promises forced one at a time, and the holes found by
//! review pinned. One test binary: each of its own would be linked apart.

mod cancel_steps;
mod errors;
mod failover;
mod forced;
mod reliability;
