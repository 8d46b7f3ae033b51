//! Every shell example in README.md (which is also the CLI's README: cli/Cargo.toml points
//! `readme` at it) runs as written against a real redis-server: each command line of a ```sh
//! block, and the command of each ```crontab entry, run by `sh` as cron would.

mod cli_support;
use testkit as support;

use std::path::Path;
use std::process::Command;

use cli_support::{bin, run};
use support::RedisServer;

/// The README's set-up commands, skipped by name: they install packages and build and test
/// the whole workspace (what the demo does is tested in cli.rs).
const SKIPPED: &[&str] = &["bash scripts/demo.sh", "bash scripts/test.sh"];

/// The only text replaced in the examples: paths that stand for the reader's own programs,
/// with harmless commands in their place. Redis comes from `REDIS_URL`, `$VERSION` from the
/// environment, and `redbaton` from `PATH`, as the README says.
const STUBS: &[(&str, &str)] = &[
    ("/opt/billing/sync.sh", "true"),
    ("./deploy.sh", "echo deploy"),
];

/// A command found in the README, and the block it came from.
struct Example {
    fence: String,
    line: usize,
    command: String,
}

/// The commands of README's ```sh and ```crontab blocks, in order.
fn examples(readme: &str) -> Vec<Example> {
    let mut found = Vec::new();
    let mut fence: Option<String> = None;
    for (i, line) in readme.lines().enumerate() {
        let trimmed = line.trim();
        if let Some(info) = trimmed.strip_prefix("```") {
            fence = match fence {
                Some(_) => None,
                None => Some(info.trim().to_owned()),
            };
            continue;
        }
        let Some(kind) = fence.as_deref() else {
            continue;
        };
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let command = match kind {
            "sh" | "bash" | "shell" => trimmed.to_owned(),
            // A crontab entry: five time fields, then the command cron gives to `sh`.
            "crontab" => cron_command(trimmed)
                .unwrap_or_else(|| panic!("README.md:{}: not a crontab entry: {trimmed}", i + 1)),
            _ => continue,
        };
        found.push(Example {
            fence: kind.to_owned(),
            line: i + 1,
            command,
        });
    }
    found
}

/// The command of a crontab entry (what follows its five time fields).
fn cron_command(entry: &str) -> Option<String> {
    let mut rest = entry;
    for _ in 0..5 {
        let field_end = rest.find(char::is_whitespace)?;
        rest = rest[field_end..].trim_start();
    }
    (!rest.is_empty()).then(|| rest.to_owned())
}

#[test]
fn readme_shell_examples_run_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let server = RedisServer::start();
    let bin_dir = Path::new(bin()).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let dir = std::env::temp_dir().join(format!("redbaton-readme-{}", server.port));
    std::fs::create_dir_all(&dir).unwrap();

    let mut skipped = Vec::new();
    let mut ran = 0;
    for example in examples(&readme) {
        let bare = example.command.split('#').next().unwrap().trim();
        if SKIPPED.contains(&bare) {
            skipped.push(bare.to_owned());
            continue;
        }
        let mut command = example.command.clone();
        for (from, to) in STUBS {
            command = command.replace(from, to);
        }
        let (code, out, err) = run({
            let mut sh = Command::new("sh");
            sh.arg("-c")
                .arg(&command)
                .current_dir(&dir)
                .env("PATH", &path)
                .env("REDIS_URL", server.url())
                .env("VERSION", "v1.2.3")
                .env_remove("REDBATON_LOCK")
                .env_remove("REDBATON_OWNER");
            sh
        });
        // `status` answers 1 for a free lock and `unlock --force` 1 for none (documented
        // answers, not failures); everything else must succeed.
        let answers_no = bare.contains("redbaton status") || bare.contains("redbaton unlock");
        assert!(
            code == 0 || (answers_no && code == 1),
            "README.md:{} (```{}): `{}` exited {code}\nstdout: {out}\nstderr: {err}",
            example.line,
            example.fence,
            example.command
        );
        ran += 1;
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        skipped, SKIPPED,
        "the set-up commands are skipped, no others"
    );
    assert!(ran >= 4, "the CLI examples were found and run: {ran}");
}
