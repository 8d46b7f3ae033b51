//! The history checker for mutual exclusion, shared by `tests/torture.rs` and the soak
//! (`examples/soak`, which includes this file with `#[path]`).
//!
//! A history is every critical section run under a lock name: when it began and ended on one
//! monotonic clock, the fencing number taken inside it (INCR on a side key), and whether its
//! guard reported the lease lost by the end. Two claims are checked:
//!
//! - sections whose leases were valid throughout never overlap in time;
//! - the fencing numbers of those sections follow their order.
//!
//! A section whose lease was lost proves nothing (its holder was told), so it takes part in
//! neither check: a stalled holder's late INCR may well land inside a newer holder's section.
#![allow(dead_code)]

use std::time::Duration;

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
    /// The guard reported its lease lost by the end of the section.
    pub lost: bool,
}

/// What checking one name's history found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Sections whose leases were valid throughout: the ones checked for overlap.
    pub checked: usize,
    /// One line per valid section that began before an earlier valid section ended.
    pub overlaps: Vec<String>,
    /// One line per pair of consecutive valid sections whose fences are out of order.
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
    let mut valid: Vec<&Section> = sections.iter().copied().filter(|s| !s.lost).collect();
    valid.sort_by_key(|s| (s.start, s.end));
    let mut verdict = Verdict {
        checked: valid.len(),
        ..Verdict::default()
    };
    // The latest end of the valid sections so far, and the section it belongs to.
    let mut last: Option<&Section> = None;
    for s in &valid {
        if let Some(prev) = last {
            if s.start < prev.end {
                verdict.overlaps.push(format!(
                    "{name}: a section (fence {:?}) began {:?} before the previous one (fence {:?}) ended, at +{:?}",
                    s.fence,
                    prev.end - s.start,
                    prev.fence,
                    s.start
                ));
            }
        }
        if last.is_none_or(|prev| s.end > prev.end) {
            last = Some(s);
        }
    }
    let fenced: Vec<&Section> = valid
        .iter()
        .copied()
        .filter(|s| s.fence.is_some())
        .collect();
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

/// Checks one name's history: sections whose leases were valid throughout never overlap,
/// and the fencing numbers taken inside them follow their order. Returns how many sections
/// were checked for overlap, or the first violation.
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
