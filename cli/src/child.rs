//! CMD as a child in a process group of its own: spawning, the terminal, signals, reaping.

use std::ffi::OsString;
use std::io;
use std::os::fd::BorrowedFd;
use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::errno::Errno;
use nix::sys::signal::{killpg, sigprocmask, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{getpgrp, getpid, getppid, setpgid, tcgetpgrp, tcsetpgrp, Pid};

/// A running CMD: its pid, which is also its process group id.
pub struct Child {
    pid: Pid,
    /// Whether CMD's group was made the terminal's foreground group (to be taken back).
    took_terminal: bool,
}

/// How CMD ended.
#[derive(Clone, Copy, Debug)]
pub enum Ended {
    Exited(i32),
    Signaled(i32),
}

impl Ended {
    /// The status a shell would report: the exit code, or 128+N for signal N.
    pub fn status(self) -> u8 {
        match self {
            Ended::Exited(code) => (code & 0xff) as u8,
            Ended::Signaled(sig) => (128 + sig).clamp(0, 255) as u8,
        }
    }
}

fn stdin() -> BorrowedFd<'static> {
    // SAFETY: fd 0 stays open for the life of the process; it is only borrowed for a call.
    unsafe { BorrowedFd::borrow_raw(0) }
}

/// Whether this process is in the foreground of the terminal on stdin.
fn owns_terminal() -> bool {
    use std::io::IsTerminal;
    io::stdin().is_terminal() && tcgetpgrp(stdin()).is_ok_and(|pg| pg == getpgrp())
}

/// Makes `pgrp` the terminal's foreground group, with SIGTTOU blocked so a background caller
/// is not stopped by it. Only async-signal-safe calls (it also runs between fork and exec).
fn give_terminal(pgrp: Pid) -> nix::Result<()> {
    let mut ttou = SigSet::empty();
    ttou.add(Signal::SIGTTOU);
    let mut old = SigSet::empty();
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&ttou), Some(&mut old))?;
    let result = tcsetpgrp(stdin(), pgrp);
    sigprocmask(SigmaskHow::SIG_SETMASK, Some(&old), None)?;
    result
}

/// Starts `cmd` with `envs` in a new process group. It receives SIGKILL if this process dies
/// (Linux parent-death signal), and gets the terminal when this process had it.
pub fn spawn(cmd: &[OsString], envs: &[(&str, &str)]) -> io::Result<Child> {
    let parent = getpid();
    let take_terminal = owns_terminal();
    let mut command = Command::new(&cmd[0]);
    command.args(&cmd[1..]);
    for (key, value) in envs {
        command.env(key, value);
    }
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe system calls (setpgid, tcsetpgrp, sigprocmask, prctl, getppid).
    unsafe {
        command.pre_exec(move || {
            setpgid(Pid::from_raw(0), Pid::from_raw(0))?;
            if take_terminal {
                give_terminal(getpid())?;
            }
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            // The parent may have died before the line above: then nobody guards the lock.
            if getppid() != parent {
                return Err(io::Error::other("redbaton exited before CMD started"));
            }
            Ok(())
        });
    }
    let child = command.spawn()?;
    let pid = Pid::from_raw(child.id() as i32);
    // Also from this side, so the group exists whichever process runs first. EACCES means
    // the child already called exec, after setting its group itself.
    let _ = setpgid(pid, pid);
    if take_terminal {
        let _ = give_terminal(pid);
    }
    // The std handle is not needed: CMD is reaped with waitpid below.
    drop(child);
    Ok(Child {
        pid,
        took_terminal: take_terminal,
    })
}

impl Child {
    /// Sends `signal` to CMD's whole process group.
    pub fn signal_group(&self, signal: Signal) {
        match killpg(self.pid, signal) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(e) => tracing::warn!(error = %e, ?signal, "could not signal CMD's process group"),
        }
    }

    /// Whether any process is left in CMD's group (zombies this process has reaped are not).
    pub fn group_alive(&self) -> bool {
        killpg(self.pid, None::<Signal>).is_ok()
    }

    /// Reaps every exited child without blocking; returns how CMD ended once it has.
    /// This process is a child subreaper, so CMD's orphaned descendants are reaped here too.
    pub fn reap(&self) -> Option<Ended> {
        let mut ended = None;
        loop {
            match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) if pid == self.pid => {
                    ended = Some(Ended::Exited(code))
                }
                Ok(WaitStatus::Signaled(pid, sig, _)) if pid == self.pid => {
                    ended = Some(Ended::Signaled(sig as i32))
                }
                Ok(WaitStatus::StillAlive) | Err(_) => return ended,
                Ok(_) => {}
            }
        }
    }

    /// Takes the terminal back after CMD ended.
    pub fn restore_terminal(&self) {
        if self.took_terminal {
            let _ = give_terminal(getpgrp());
        }
    }
}

/// Makes orphaned descendants of CMD children of this process, so they can be reaped (and
/// do not linger as zombies in CMD's group while it is being stopped).
pub fn become_subreaper() {
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::debug!(error = %e, "could not become a child subreaper");
    }
}
