//! The lock family's conformance suite (testkit/src/family/): every invariant of
//! docs/DESIGN.md that all lock kinds share, one test each, run against every kind. What is
//! special to a kind is tested in its own file (tests/lock/, tests/api/fenced.rs, ...).
//!
//! Adding a kind: describe it in the catalog at the end of testkit/src/family/mod.rs, then
//! add its line here.

use testkit::family;

use family::conformance;

conformance!(lock, redbaton::Lock);
conformance!(fenced_lock, redbaton::FencedLock);
conformance!(read_lock, redbaton::ReadLock);
conformance!(write_lock, redbaton::WriteLock);
conformance!(fair_lock, redbaton::FairLock);
