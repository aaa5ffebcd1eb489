//! The command that `baton lock`, `baton semaphore` and `baton campaign` run, as a job: a process
//! group of its own, so that stopping it reaches every process it started (a shell's children, a
//! build's compilers), not only the one `baton` spawned.
//!
//! - **Stopping** ([`Job::stop`]) sends the signal to the whole group (and `SIGCONT`, so that a
//!   stopped job acts on it), waits up to the grace period for the command and then for the rest
//!   of its group to exit, and sends `SIGKILL` to the group if anything is left. Processes that
//!   leave the group (`setsid`, daemons) are out of reach, as with coreutils `timeout`.
//! - **The terminal.** When `baton`'s standard input is a terminal whose foreground job is
//!   `baton`'s own process group (run from an interactive shell), the command's group becomes the
//!   terminal's foreground group for as long as it runs, and the terminal is given back when it
//!   exits. The command can then read the terminal, and the keys Ctrl-C, Ctrl-\ and Ctrl-Z reach it
//!   once, from the terminal, as if the shell had started it; they do not reach `baton`. When the
//!   command is stopped from the terminal (Ctrl-Z), `baton` takes the terminal back and stops
//!   itself with the same signal, so the shell sees its job stopped; `fg` or `bg` resumes both.
//!   A lease is kept alive only while `baton` runs: one suspended for longer than its ttl is lost
//!   when `baton` resumes, and the command is stopped then.
//!   Started in the background (`&`), the job gets the terminal when the shell brings `baton` to
//!   the foreground after the command stopped wanting it (`fg`).
//! - Otherwise (no terminal, or `baton` in the background) the command's group never reads the
//!   terminal's signals; those `baton` receives are passed on to the group once.
//!
//! - **`baton` killed** (SIGKILL, the OOM killer) can neither stop the command nor keep its lease:
//!   on Linux the command is killed with it (`PR_SET_PDEATHSIG`), so that it does not run on
//!   after the lease lapses and another holder starts. Only the command itself: processes it
//!   started live on unless they end with it (`exec` in a shell command makes the shell's
//!   program the command).
//!
//! The command is reaped here (`waitpid`, woken by `SIGCHLD`), which also reports it stopped. On
//! Linux `baton` is a child subreaper: what the command leaves behind when it exits (a shell's
//! background jobs) becomes `baton`'s children instead of init's, so their ends wake `baton` and
//! it reaps them, and `baton` exits 76 only once the whole group is gone.

use std::{
    io::IsTerminal,
    os::{
        fd::{AsFd, BorrowedFd},
        unix::process::CommandExt,
    },
    process::Command,
    time::Duration,
};

use nix::{
    errno::Errno,
    sys::{
        signal::{SigSet, SigmaskHow, Signal, killpg, pthread_sigmask, raise},
        wait::{WaitPidFlag, WaitStatus, waitpid},
    },
    unistd::{Pid, getpgid, getpgrp, getpid, getppid, getsid, setpgid, tcgetpgrp, tcsetpgrp},
};
use tokio::{
    signal::unix::{SignalKind, signal},
    time::{Instant, timeout_at},
};

/// How often the rest of a stopped command's group is checked for, once the command itself has
/// exited, in case no `SIGCHLD` tells: a member whose parent left the group is not `baton`'s
/// child, and without a subreaper (outside Linux) none is.
const GROUP_CHECK_INTERVAL: Duration = Duration::from_millis(100);
/// How long processes sent SIGKILL get to be gone: they are as soon as the kernel has run them.
const KILL_WAIT: Duration = Duration::from_secs(2);

/// Exit code 128 + N for signal N, as shells report a process killed by a signal.
pub fn signal_code(signal: Signal) -> u8 {
    128u8.saturating_add(u8::try_from(signal as i32).unwrap_or(0))
}

/// A running command and its process group.
pub struct Job {
    /// The command's pid, which is also its process group's id.
    pid: Pid,
    /// The code `baton` reports for the command once it was reaped: its exit code, or 128 + N.
    code: Option<u8>,
    /// Wakes [`Job::wait`] when a child changes state.
    sigchld: tokio::signal::unix::Signal,
    /// Whether standard input is `baton`'s controlling terminal, whose foreground the job gets
    /// (see the module's documentation).
    terminal: bool,
}

impl Job {
    /// Starts `command` with `env` added to `baton`'s environment, in a new process group,
    /// given the terminal when `baton` has it.
    pub fn spawn(command: &[String], env: &[(&str, String)]) -> std::io::Result<Self> {
        let (program, args) = command
            .split_first()
            .ok_or_else(|| std::io::Error::other("no command"))?;
        // Listening before the child exists, so that no exit can be missed.
        let sigchld = signal(SignalKind::child())?;
        // The command's orphans become baton's children (see the module's documentation).
        #[cfg(target_os = "linux")]
        let _ = nix::sys::prctl::set_child_subreaper(true);
        let terminal = has_terminal();
        let foreground = terminal && in_foreground();
        let mut command = Command::new(program);
        command
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .process_group(0);
        let ttou = SigSet::from(Signal::SIGTTOU);
        #[cfg(target_os = "linux")]
        let parent = getpid();
        // SAFETY: the closure runs in the child between fork and exec, where only
        // async-signal-safe calls are allowed: it makes only prctl, getppid, setpgid,
        // pthread_sigmask and tcsetpgrp calls, on values made before the fork (nothing allocates,
        // locks or touches std's globals: standard input is borrowed by its descriptor number).
        unsafe {
            command.pre_exec(move || {
                // A baton killed outright (SIGKILL, the OOM killer) can stop nothing and renews
                // nothing: the command is killed with it rather than run on after the lease
                // lapses. The signal follows the thread that forked, baton's main thread (its
                // runtime is single-threaded), which lives as long as baton. A baton that died
                // before the call left the command to another parent, so it ends here.
                #[cfg(target_os = "linux")]
                {
                    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
                    if getppid() != parent {
                        return Err(std::io::Error::other("baton exited"));
                    }
                }
                if foreground {
                    // The child takes the terminal itself before it runs the command (as a
                    // shell's children do), so that the command never sees it as someone
                    // else's; baton does it too, after the spawn.
                    let stdin = BorrowedFd::borrow_raw(0);
                    setpgid(Pid::from_raw(0), Pid::from_raw(0))?;
                    let mut old = SigSet::empty();
                    pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou), Some(&mut old))?;
                    let taken = tcsetpgrp(stdin, getpgrp());
                    pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None)?;
                    taken?;
                }
                Ok(())
            });
        }
        let child = command.spawn()?;
        // std's handle is only dropped: this module reaps the child.
        let pid = Pid::from_raw(i32::try_from(child.id()).map_err(std::io::Error::other)?);
        let job = Self {
            pid,
            code: None,
            sigchld,
            terminal,
        };
        if foreground {
            job.give_terminal();
        }
        Ok(job)
    }

    /// Waits for the command to exit: its exit code, or 128 + the signal that killed it.
    /// Cancel-safe: dropping the future loses nothing.
    pub async fn wait(&mut self) -> u8 {
        loop {
            if let Some(code) = self.code {
                return code;
            }
            self.reap();
            if self.code.is_none() {
                self.sigchld.recv().await;
            }
        }
    }

    /// Sends `sig` to the whole group (then `SIGCONT`, so that a stopped job acts on it).
    pub fn signal(&self, sig: Signal) {
        // The group may be gone already; the caller learns it from waiting.
        let _ = killpg(self.pid, sig);
        if sig != Signal::SIGKILL && sig != Signal::SIGCONT {
            let _ = killpg(self.pid, Signal::SIGCONT);
        }
    }

    /// Stops the job: `sig` to the group, up to `grace` for the command and then the rest of its
    /// group to exit, `SIGKILL` to the group for whatever is left. `hurry` resolving (a second
    /// interrupt) ends the grace period at once. Returns the command's code, as [`Job::wait`].
    pub async fn stop(
        &mut self,
        sig: Signal,
        grace: Duration,
        hurry: impl Future<Output = ()>,
    ) -> u8 {
        let deadline = Instant::now() + grace;
        self.signal(sig);
        let graceful = async {
            if timeout_at(deadline, self.wait()).await.is_ok() {
                self.wait_group(deadline).await;
            }
        };
        tokio::select! {
            () = graceful => {}
            () = hurry => {}
        }
        if self.code.is_none() || self.group_alive() {
            self.signal(Signal::SIGKILL);
        }
        let code = self.wait().await;
        self.wait_group(Instant::now() + KILL_WAIT).await;
        code
    }

    /// Waits, up to `deadline`, until no process of the job's group is left (the command itself
    /// has exited), reaping those that became `baton`'s.
    async fn wait_group(&mut self, deadline: Instant) {
        loop {
            self.reap();
            if !self.group_alive() || Instant::now() >= deadline {
                return;
            }
            let tick = deadline.min(Instant::now() + GROUP_CHECK_INTERVAL);
            let _ = timeout_at(tick, self.sigchld.recv()).await;
        }
    }

    /// Whether any process of the job's group is left (a zombie the command left counts until
    /// its new parent reaps it).
    fn group_alive(&self) -> bool {
        // EPERM: a member `baton` may not signal (it changed its user) is a member all the same.
        !matches!(killpg(self.pid, None), Err(Errno::ESRCH))
    }

    /// Collects the state changes of `baton`'s children without blocking: the command's (its
    /// exit, its stops) and the ends of the orphans it left.
    fn reap(&mut self) {
        let mut flags = WaitPidFlag::WNOHANG;
        if self.terminal {
            flags |= WaitPidFlag::WUNTRACED;
        }
        loop {
            match waitpid(None, Some(flags)) {
                Ok(WaitStatus::StillAlive) => return,
                // An orphan of the command's, now reaped (or stopped: not baton's business).
                Ok(status) if status.pid() != Some(self.pid) => {}
                Ok(WaitStatus::Exited(_, code)) => self.exited(u8::try_from(code).unwrap_or(255)),
                Ok(WaitStatus::Signaled(_, sig, _)) => self.exited(signal_code(sig)),
                Ok(WaitStatus::Stopped(_, sig)) => self.stopped(sig),
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => {
                    if self.code.is_none() {
                        // Only this module waits for the command, so this cannot happen; were
                        // it to, the command's fate is unknown.
                        noteln!("baton: waiting for the command failed: {e}");
                        self.exited(super::EXIT_SOFTWARE);
                    }
                    return;
                }
            }
        }
    }

    fn exited(&mut self, code: u8) {
        self.code = Some(code);
        if self.terminal {
            self.take_terminal();
            self.terminal = false;
        }
    }

    /// The command was stopped by `sig` (`baton` has a terminal).
    fn stopped(&mut self, sig: Signal) {
        if !matches!(sig, Signal::SIGTSTP | Signal::SIGTTIN | Signal::SIGTTOU) {
            // SIGSTOP from someone: theirs to continue.
            return;
        }
        if in_foreground() {
            // It read the terminal in the instant before it was given it.
            self.give_terminal();
            return;
        }
        if !under_job_control() {
            // No shell would see baton stopped (its group is orphaned: stop signals are
            // discarded): a job stopped from the terminal goes on; one that wants the terminal
            // stays stopped, as it would stop again at once.
            if sig == Signal::SIGTSTP {
                let _ = killpg(self.pid, Signal::SIGCONT);
            }
            return;
        }
        // Ctrl-Z, or a job in the background that wants the terminal: the shell must see its
        // job (baton) stopped to take the terminal back.
        self.take_terminal();
        let _ = raise(sig);
        // Continued by the shell: in the foreground (`fg`) the terminal is the job's again; in
        // the background (`bg`) the job goes on without it.
        if in_foreground() {
            self.give_terminal();
        } else {
            let _ = killpg(self.pid, Signal::SIGCONT);
        }
    }

    /// Makes the job's group the terminal's foreground group, unless it is already (it takes the
    /// terminal itself when started), and continues the job in case it was stopped for reading
    /// the terminal before it was its.
    fn give_terminal(&self) {
        if tcgetpgrp(std::io::stdin().as_fd()) != Ok(self.pid) {
            set_foreground(self.pid);
        }
        let _ = killpg(self.pid, Signal::SIGCONT);
    }

    /// Gives the terminal back to `baton`'s group if the job's group has it.
    fn take_terminal(&self) {
        if tcgetpgrp(std::io::stdin().as_fd()) == Ok(self.pid) {
            set_foreground(getpgrp());
        }
    }
}

/// Makes `pgid` the terminal's foreground group. A process outside the foreground group that
/// does this is sent SIGTTOU (which would stop `baton`) unless it blocks it: it is blocked for
/// the call.
fn set_foreground(pgid: Pid) {
    let ttou = SigSet::from(Signal::SIGTTOU);
    let mut old = SigSet::empty();
    if pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou), Some(&mut old)).is_ok() {
        let _ = tcsetpgrp(std::io::stdin().as_fd(), pgid);
        let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
    }
}

impl Drop for Job {
    /// A job dropped while its command runs (an early return, a panic) is killed and reaped, and
    /// the terminal given back.
    fn drop(&mut self) {
        if self.code.is_none() {
            let _ = killpg(self.pid, Signal::SIGKILL);
            while let Err(Errno::EINTR) = waitpid(self.pid, None) {}
        }
        if self.terminal {
            self.take_terminal();
        }
    }
}

/// Whether standard input is a terminal and `baton`'s controlling terminal (the one a shell's job
/// control works on).
fn has_terminal() -> bool {
    let stdin = std::io::stdin();
    stdin.is_terminal() && tcgetpgrp(stdin.as_fd()).is_ok()
}

/// Whether `baton`'s process group is the terminal's foreground group.
fn in_foreground() -> bool {
    tcgetpgrp(std::io::stdin().as_fd()) == Ok(getpgrp())
}

/// Whether a shell controls `baton` as a job: its parent, in the same session, is in another
/// process group (otherwise `baton`'s group is orphaned, and the kernel discards stop signals
/// sent to it).
fn under_job_control() -> bool {
    let parent = getppid();
    getsid(Some(parent)).ok() == getsid(None).ok() && getpgid(Some(parent)).ok() != Some(getpgrp())
}
