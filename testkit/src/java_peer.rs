//! The Java Redisson peer: `interop/java`, a driver of the real Redisson built by
//! `scripts/install-java-peer.sh` once per Redisson line. Shared by `tests/redisson/`, the
//! mixed soak (`soak/`) and the compare bench.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// The Redisson versions the install script builds: the newest 4.x and the last 3.x line.
pub const VERSIONS: [&str; 2] = ["4.7.0", "3.52.0"];

/// The environment variable that picks the Redisson version (default: the first of
/// [`VERSIONS`]).
pub const VERSION_ENV: &str = "REDBATON_REDISSON_VERSION";

/// The Redisson version to run: `$REDBATON_REDISSON_VERSION`, else the newest.
pub fn redisson_version() -> String {
    std::env::var(VERSION_ENV).unwrap_or_else(|_| VERSIONS[0].to_owned())
}

/// JVM options for a driver that runs briefly (tests, the soak): the client compiler only and a
/// small heap, so that a JVM starts quickly and leaves the cores to the rest of the run.
pub const QUICK_JVM: &[&str] = &["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xmx256m"];

/// `java <jvm> -cp <the driver and Redisson> redbaton.interop.Driver <mode>`, for the Redisson
/// version [`redisson_version`] names. Panics, naming the install script, when it is not built.
pub fn driver_command(jvm: &[&str], mode: &str) -> Command {
    let version = redisson_version();
    let help = "run `bash scripts/install-java-peer.sh` (needs java 17+ and mvn; builds \
                interop/java against each Redisson line, fetching them from Maven Central)";
    assert!(
        VERSIONS.contains(&version.as_str()),
        "${VERSION_ENV}={version:?}: the install script builds {VERSIONS:?}"
    );
    let project = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|d| d.join("interop/java"))
        .find(|d| d.join("pom.xml").is_file())
        .expect("interop/java/pom.xml not found above CARGO_MANIFEST_DIR");
    let dir = project.join("target").join(&version);
    let built = std::fs::metadata(dir.join(".redbaton-stamp")).and_then(|m| m.modified());
    if let Ok(built) = built {
        assert!(
            newest_source(&project) <= built,
            "the Java Redisson driver in {dir:?} is older than its sources: {help}"
        );
    }
    let classpath = std::fs::read_to_string(dir.join("classpath.txt")).unwrap_or_else(|_| {
        panic!("the Java Redisson driver for {version} is not built in {dir:?}: {help}")
    });
    let java = Command::new("java").arg("-version").output();
    assert!(
        java.is_ok_and(|o| o.status.success()),
        "`java` is not installed: {help}"
    );
    let mut command = Command::new("java");
    command
        .args(jvm)
        .arg("-cp")
        .arg(format!(
            "{}:{}",
            dir.join("classes").display(),
            classpath.trim()
        ))
        .args(["redbaton.interop.Driver", mode]);
    command
}

/// When the driver's pom or a source file last changed.
fn newest_source(project: &std::path::Path) -> std::time::SystemTime {
    fn walk(path: &std::path::Path, newest: &mut std::time::SystemTime) {
        if let Ok(modified) = std::fs::metadata(path).and_then(|m| m.modified()) {
            *newest = (*newest).max(modified);
        }
        if let Ok(entries) = std::fs::read_dir(path) {
            for entry in entries.flatten() {
                walk(&entry.path(), newest);
            }
        }
    }
    let mut newest = std::time::SystemTime::UNIX_EPOCH;
    walk(&project.join("pom.xml"), &mut newest);
    walk(&project.join("src"), &mut newest);
    newest
}
