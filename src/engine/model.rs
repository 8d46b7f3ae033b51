//! What the model tests of the concurrent state machines share (the hub's wake-ups in
//! [`crate::engine::hub::wake_state`], the baton queue in [`crate::engine::baton::queue_state`], the turn in
//! [`crate::engine::holds::turn_state`]): the model checker's schedules, and its atomics.
//!
//! The checker is shuttle: it runs a test's tasks one at a time and picks which runs next at
//! every operation on its own primitives (atomics, mutexes, spawns), PCT and uniformly random
//! schedulers from fixed seeds, so every run explores the same schedules and a failure prints
//! one to replay. It needs no cfg flag, so these tests run with the rest of the unit tests.

use std::sync::Arc;

use shuttle::scheduler::{PctScheduler, RandomScheduler};

/// Schedules per scheduler: a few thousand runs of a small scenario take well under a second.
const SCHEDULES: usize = 1500;

/// Runs `scenario` under [`SCHEDULES`] schedules of each scheduler: PCT (which finds a bug
/// needing a few preemptions with a known probability) and random ones. Shuttle runs every
/// atomic access as `SeqCst`: this explores interleavings, not weaker memory orderings.
pub(crate) fn explore(scenario: impl Fn() + Send + Sync + 'static) {
    let config = || {
        let mut config = shuttle::Config::new();
        config.silence_warnings = true;
        config
    };
    let scenario = Arc::new(scenario);
    let again = scenario.clone();
    let pct = PctScheduler::new_from_seed(0x5eed, 3, SCHEDULES);
    shuttle::Runner::new(pct, config()).run(move || again());
    let random = RandomScheduler::new_from_seed(0xba70, SCHEDULES);
    shuttle::Runner::new(random, config()).run(move || scenario());
}
