//! The lock family's conformance suite (testkit/src/family/): every invariant of
//! docs/DESIGN.md that all lock kinds share, one test each, run against every kind. What is
//! special to a kind is tested in its own file (tests/lock/, tests/api/fenced.rs, ...).
//!
//! Adding a kind: add it to the kit's catalog of kinds (testkit/src/kinds.rs: `KINDS` and
//! `lock_family!`) and describe it for this suite at the end of testkit/src/family/mod.rs.

use testkit::family;

use family::conformance;

// Every kind of the lock family, from the kit's catalog (testkit/src/kinds.rs).
testkit::lock_family!(conformance);
