//! The history checker for mutual exclusion, shared by `tests/torture.rs` and the soak
//! (`soak/`).
//!
//! A history is every critical section run under a lock name: when it began and ended on one
//! monotonic clock, the fencing number taken inside it (INCR on a side key), and when — if at
//! all before its end — its holder was told the lease was lost (the guard's `lost()`
//! resolved). Two claims are checked:
//!
//! - no two holders overlap while both believe they hold: a section counts from its start
//!   until it ended or its holder was told, whichever came first. A holder told late — its
//!   lease ended in Redis, another holder entered, and only then did `lost()` resolve — is
//!   invariant 8's failure (docs/DESIGN.md), and shows up here as an overlap;
//! - the fencing numbers of the sections never told lost follow their order. A section told
//!   lost takes no part in this one: a stalled holder's late INCR may well land inside a newer
//!   holder's section, after it was told.
#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use futures::FutureExt;

/// One critical section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Section {
    /// Index of the lock name.
    pub name: usize,
    /// When the section began (after the acquire returned), since a common epoch of one
    /// monotonic clock.
    pub start: Duration,
    /// When the section ended (before the release), on the same clock.
    pub end: Duration,
    /// The fencing number taken inside the section; `None` when its INCR got no reply.
    pub fence: Option<i64>,
    /// When the holder was told its lease was lost, on the same clock; `None` when it was not
    /// told by the end of the section.
    pub lost_at: Option<Duration>,
}

impl Section {
    /// The holder was told its lease was lost, during the section or as it ended.
    pub fn lost(&self) -> bool {
        self.lost_at.is_some()
    }

    /// Until when the holder believed it held: the end, or when it was told, if earlier.
    fn believed_until(&self) -> Duration {
        self.lost_at.map_or(self.end, |told| told.min(self.end))
    }
}

/// What checking one name's history found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Sections never told lost: checked for overlap over their whole length, and for fence
    /// order.
    pub checked: usize,
    /// Sections told lost part-way: checked for overlap up to when they were told.
    pub checked_until_told: usize,
    /// One line per section that began while another holder still believed it held.
    pub overlaps: Vec<String>,
    /// One line per pair of consecutive sections (never told lost) whose fences are out of
    /// order.
    pub fence_disorders: Vec<String>,
}

impl Verdict {
    /// No overlap, no fence out of order.
    pub fn is_clean(&self) -> bool {
        self.overlaps.is_empty() && self.fence_disorders.is_empty()
    }
}

/// Checks one name's history and reports every violation found.
pub fn judge_history(name: &str, sections: &[&Section]) -> Verdict {
    // Every stretch a holder believed it held; empty ones (told before the section began)
    // claim nothing.
    let mut believed: Vec<&Section> = sections
        .iter()
        .copied()
        .filter(|s| s.believed_until() > s.start)
        .collect();
    believed.sort_by_key(|s| (s.start, s.believed_until()));
    let mut verdict = Verdict {
        checked: sections.iter().filter(|s| !s.lost()).count(),
        checked_until_told: believed.iter().filter(|s| s.lost()).count(),
        ..Verdict::default()
    };
    // The latest believed end of the stretches so far, and the section it belongs to.
    let mut last: Option<&Section> = None;
    for s in &believed {
        if let Some(prev) = last {
            if s.start < prev.believed_until() {
                let told = |s: &Section| match s.lost_at {
                    Some(at) => format!(", told lost at +{at:?}"),
                    None => String::new(),
                };
                verdict.overlaps.push(format!(
                    "{name}: a section (fence {:?}{}) began at +{:?}, {:?} before the previous \
                     holder (fence {:?}, +{:?} to +{:?}{}) stopped believing it held",
                    s.fence,
                    told(s),
                    s.start,
                    prev.believed_until() - s.start,
                    prev.fence,
                    prev.start,
                    prev.end,
                    told(prev),
                ));
            }
        }
        if last.is_none_or(|prev| s.believed_until() > prev.believed_until()) {
            last = Some(s);
        }
    }
    let mut fenced: Vec<&Section> = sections
        .iter()
        .copied()
        .filter(|s| !s.lost() && s.fence.is_some())
        .collect();
    fenced.sort_by_key(|s| (s.start, s.end));
    for pair in fenced.windows(2) {
        if pair[0].fence >= pair[1].fence {
            verdict.fence_disorders.push(format!(
                "{name}: fencing out of order ({:?} then {:?}, at +{:?})",
                pair[0].fence, pair[1].fence, pair[1].start
            ));
        }
    }
    verdict
}

/// Checks one name's history: no two holders overlap while both believe they hold, and the
/// fencing numbers of the sections never told lost follow their order. Returns how many
/// sections were checked over their whole length, or the first violation.
pub fn check_history(name: &str, sections: &[&Section]) -> Result<usize, String> {
    let verdict = judge_history(name, sections);
    match verdict
        .overlaps
        .into_iter()
        .chain(verdict.fence_disorders)
        .next()
    {
        Some(violation) => Err(violation),
        None => Ok(verdict.checked),
    }
}

/// Runs a critical section while listening for its holder's lost-lease signal, and returns
/// the section's output with when, on `clock`'s scale, the holder stopped being known valid —
/// if the signal came by the end.
///
/// `lost` resolves with how long ago the lease stopped being known valid (see [`told_ago`]):
/// the library's own instant, so the time this task takes to be scheduled after the signal
/// is not counted against the library — a holder that asked `is_lost()` at any moment after
/// that instant was told. The signal is polled before the section at every wake-up, so it is
/// taken when it resolves, not when the section happens to end; once more after the section,
/// so a signal that raced the section's last step still marks the section lost.
pub async fn watch_lost<T>(
    section: impl Future<Output = T>,
    lost: impl Future<Output = Duration>,
    clock: impl Fn() -> Duration,
) -> (T, Option<Duration>) {
    let mut section = std::pin::pin!(section);
    let mut lost = std::pin::pin!(lost.fuse());
    let mut lost_at = None;
    let output = loop {
        tokio::select! {
            biased;
            ago = &mut lost, if lost_at.is_none() => lost_at = Some(clock().saturating_sub(ago)),
            output = &mut section => break output,
        }
    };
    if lost_at.is_none() {
        if let Some(ago) = lost.now_or_never() {
            lost_at = Some(clock().saturating_sub(ago));
        }
    }
    (output, lost_at)
}

/// A holder's lost-lease signal for [`watch_lost`]: resolves when `lost` does, with how long
/// ago the lease stopped being known valid by `lost_at` (a guard's `lost_at()`; zero if it
/// gives no instant).
pub async fn told_ago(
    lost: impl Future<Output = ()>,
    lost_at: impl FnOnce() -> Option<std::time::Instant>,
) -> Duration {
    lost.await;
    lost_at().map_or(Duration::ZERO, |at| at.elapsed())
}
