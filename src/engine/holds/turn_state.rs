//! The turn's state machine (see [`crate::engine::holds`]): at most one counted call per lock key and
//! owner in flight, the others queued for it, and a queued caller that gives up passing on a
//! hand-over it may have consumed.
//!
//! Pure: the holds registry keeps it under its entry's lock and wakes the callers queued for
//! it by a `Notify`, as the model tests below do under a model checker (see `src/engine/model.rs`),
//! exploring callers that take the turn, wait for it, try it once (a baton pass takes the next
//! owner's turn only if it is free), or give up while woken.

/// Who has the turn, and how many wait for it.
#[derive(Default)]
pub(crate) struct TurnState {
    /// A counted call is in flight.
    busy: bool,
    /// Callers waiting for the turn.
    queued: u32,
}

impl TurnState {
    /// A caller takes the turn if it is free (`true`); otherwise it is queued for it.
    pub(crate) fn take_or_queue(&mut self) -> bool {
        if self.busy {
            self.queued += 1;
            return false;
        }
        self.busy = true;
        true
    }

    /// A queued caller takes the turn if it is free now (and leaves the queue then).
    pub(crate) fn take_queued(&mut self) -> bool {
        if self.busy {
            return false;
        }
        self.busy = true;
        self.queued -= 1;
        true
    }

    /// A queued caller gives up (its deadline passed, or it was dropped). Returns whether
    /// to wake the next queued caller: a hand-over meant for this one may have been consumed.
    pub(crate) fn give_up(&mut self) -> bool {
        self.queued -= 1;
        !self.busy && self.queued > 0
    }

    /// The caller with the turn frees it. Returns whether to wake a queued caller.
    pub(crate) fn free(&mut self) -> bool {
        self.busy = false;
        self.queued > 0
    }

    /// Nobody has the turn or waits for it.
    pub(crate) fn idle(&self) -> bool {
        !self.busy && self.queued == 0
    }
}

/// Model tests: callers of one owner's turn, as [`Holds::turn`](crate::engine::holds::Holds::turn)
/// and the turn's drop make them, under interleavings chosen by a model checker. The hold has
/// one guard per patient caller (re-entry); each releases one under the turn, and the one that
/// finds none left ends the hold.
#[cfg(test)]
mod model {
    use super::*;
    use crate::engine::model::explore;
    use shuttle::future::{block_on, spawn};
    use shuttle::sync::Mutex;
    use std::sync::Arc;
    use tokio::sync::Notify;

    /// How long a caller waits for the turn.
    #[derive(Clone, Copy)]
    enum Patience {
        /// Until it gets it.
        Forever,
        /// Not at all: a baton pass takes the next owner's turn only if it is free.
        Try,
        /// Until it has been queued a moment (its deadline passes, or it is dropped, maybe
        /// right after the turn was handed to it).
        Moment,
    }

    struct Hold {
        turn: TurnState,
        /// Callers with the turn (the property: never more than one).
        inside: u32,
        /// The hold's guards, and how many times the hold ended.
        guards: u32,
        ended: u32,
    }

    struct Entry {
        state: Mutex<Hold>,
        turn_free: Notify,
    }

    impl Entry {
        /// The turn, as `Holds::turn` waits for it.
        async fn turn(&self, patience: Patience) -> bool {
            if self.state.lock().unwrap().turn.take_or_queue() {
                return true;
            }
            loop {
                let free = self.turn_free.notified();
                let mut free = std::pin::pin!(free);
                free.as_mut().enable();
                if self.state.lock().unwrap().turn.take_queued() {
                    return true;
                }
                match patience {
                    Patience::Forever => free.await,
                    Patience::Try => return self.give_up(),
                    Patience::Moment => {
                        shuttle::thread::yield_now();
                        return self.give_up();
                    }
                }
            }
        }

        /// A queued caller leaves, as `Queued`'s drop does.
        fn give_up(&self) -> bool {
            if self.state.lock().unwrap().turn.give_up() {
                self.turn_free.notify_one();
            }
            false
        }

        /// The turn is freed, as `Turn`'s drop does.
        fn free(&self) {
            let wake = {
                let mut hold = self.state.lock().unwrap();
                hold.inside -= 1;
                hold.turn.free()
            };
            if wake {
                self.turn_free.notify_one();
            }
        }

        /// A caller with the turn: releases a guard if it has one.
        fn inside(&self, releases: bool) {
            {
                let mut hold = self.state.lock().unwrap();
                hold.inside += 1;
                assert_eq!(hold.inside, 1, "two callers with the turn");
                if releases {
                    hold.guards -= 1;
                    hold.ended += u32::from(hold.guards == 0);
                }
            }
            // Its call in flight.
            shuttle::thread::yield_now();
            self.free();
        }
    }

    fn scenario(callers: &'static [Patience]) {
        let patient = callers
            .iter()
            .filter(|p| matches!(p, Patience::Forever))
            .count();
        let entry = Arc::new(Entry {
            state: Mutex::new(Hold {
                turn: TurnState::default(),
                inside: 0,
                guards: patient as u32,
                ended: 0,
            }),
            turn_free: Notify::new(),
        });
        let tasks: Vec<_> = callers
            .iter()
            .map(|&patience| {
                let entry = entry.clone();
                spawn(async move {
                    if entry.turn(patience).await {
                        entry.inside(matches!(patience, Patience::Forever));
                    }
                })
            })
            .collect();
        block_on(async {
            for task in tasks {
                task.await.unwrap();
            }
        });
        let hold = entry.state.lock().unwrap();
        assert_eq!(hold.ended, 1, "the hold must end once, by its last guard");
        assert!(hold.turn.idle(), "the turn left taken or queued");
    }

    #[test]
    fn the_turn_is_exclusive_and_every_patient_caller_gets_it() {
        use Patience::*;
        explore(|| scenario(&[Forever, Forever, Forever]));
    }

    #[test]
    fn callers_that_give_up_pass_the_turn_on() {
        use Patience::*;
        explore(|| scenario(&[Forever, Moment, Forever, Try]));
    }
}
