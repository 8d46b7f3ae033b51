//! Tests that run part of themselves in a child process: the test re-executes its own binary
//! with `--exact <its full name>` and an argument in [`CHILD_ENV`], and run that way it does the
//! child's part instead of its check ([`child_arg`] tells which). There is no separate entry
//! point for the child: an `#[ignore]`d one would pass as an empty test under
//! `--include-ignored`.

use std::process::{Child, Command, Stdio};

/// Env var carrying the child's argument; set only in a child.
pub const CHILD_ENV: &str = "REDBATON_TEST_CHILD";

/// A child process of this test binary, killed on drop (so a failing test never leaves one).
pub struct ChildProcess(pub Child);

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The name the test harness gives test `name` of the module `module` (pass `module_path!()`):
/// what `--exact` matches is the path below the crate root, so a test in a module of a split
/// test binary is `topic::name`.
pub fn test_name(module: &str, name: &str) -> String {
    match module.split_once("::") {
        Some((_crate, path)) => format!("{path}::{name}"),
        None => name.to_owned(),
    }
}

/// Runs the test `test` of this binary (the caller itself; its full name, see [`test_name`]) as
/// a child process with `arg`.
pub fn spawn_child(test: &str, arg: &str) -> ChildProcess {
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, arg)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("re-execute the test binary");
    ChildProcess(child)
}

/// The child's argument when this process is a child, else `None`.
pub fn child_arg() -> Option<String> {
    std::env::var(CHILD_ENV).ok()
}

/// What a child printed after `tag` on one line (the test harness may print its own text
/// before it on the same line).
pub fn after_tag(line: &str, tag: &str) -> Option<String> {
    line.split_once(tag).map(|(_, rest)| rest.trim().to_owned())
}
