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
//! - Otherwise (no terminal, or `baton` in the background) the command's group never reads the
//!   terminal's signals; those `baton` receives are passed on to the group once.
//!
//! The command is reaped here (`waitpid`, woken by `SIGCHLD`), which also reports it stopped.

use std::{
    io::IsTerminal,
    os::{fd::AsFd, unix::process::CommandExt},
    process::Command,
    time::Duration,
};

use nix::{
    errno::Errno,
    sys::{
        signal::{SigSet, SigmaskHow, Signal, killpg, pthread_sigmask, raise},
        wait::{WaitPidFlag, WaitStatus, waitpid},
    },
    unistd::{Pid, getpgrp, tcgetpgrp, tcsetpgrp},
};
use tokio::{
    signal::unix::{SignalKind, signal},
    time::{Instant, sleep, timeout_at},
};

/// How often the rest of a stopped command's group is checked for, once the command itself has
/// exited: those processes are not `baton`'s children, so nothing tells when they end.
const GROUP_CHECK_INTERVAL: Duration = Duration::from_millis(10);

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
    /// Whether the job runs in the terminal's foreground (see the module's documentation).
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
        let terminal = has_terminal();
        let child = Command::new(program)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .process_group(0)
            .spawn()?;
        // std's handle is only dropped: this module reaps the child.
        let pid = Pid::from_raw(i32::try_from(child.id()).map_err(std::io::Error::other)?);
        let job = Self {
            pid,
            code: None,
            sigchld,
            terminal,
        };
        if terminal {
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
            if timeout_at(deadline, self.wait()).await.is_err() {
                return;
            }
            while self.group_alive() && Instant::now() < deadline {
                sleep(GROUP_CHECK_INTERVAL).await;
            }
        };
        tokio::select! {
            () = graceful => {}
            () = hurry => {}
        }
        if self.code.is_none() || self.group_alive() {
            self.signal(Signal::SIGKILL);
        }
        self.wait().await
    }

    /// Whether any process of the job's group is left (a zombie the command left counts until
    /// its new parent reaps it).
    fn group_alive(&self) -> bool {
        // EPERM: a member `baton` may not signal (it changed its user) is a member all the same.
        !matches!(killpg(self.pid, None), Err(Errno::ESRCH))
    }

    /// Collects the command's state changes without blocking.
    fn reap(&mut self) {
        let mut flags = WaitPidFlag::WNOHANG;
        if self.terminal {
            flags |= WaitPidFlag::WUNTRACED;
        }
        while self.code.is_none() {
            match waitpid(self.pid, Some(flags)) {
                Ok(WaitStatus::Exited(_, code)) => self.exited(u8::try_from(code).unwrap_or(255)),
                Ok(WaitStatus::Signaled(_, sig, _)) => self.exited(signal_code(sig)),
                Ok(WaitStatus::Stopped(_, sig)) => self.stopped(sig),
                Ok(WaitStatus::StillAlive) => return,
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => {
                    // Only this module waits for the command, so this cannot happen; were it to,
                    // the command's fate is unknown.
                    eprintln!("baton: waiting for the command failed: {e}");
                    self.exited(super::EXIT_SOFTWARE);
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

    /// The command was stopped by `sig` while the job has the terminal.
    fn stopped(&mut self, sig: Signal) {
        if !matches!(sig, Signal::SIGTSTP | Signal::SIGTTIN | Signal::SIGTTOU) {
            // SIGSTOP from someone: theirs to continue.
            return;
        }
        if tcgetpgrp(std::io::stdin().as_fd()) == Ok(getpgrp()) {
            // It read the terminal in the instant before it was given it.
            self.give_terminal();
            return;
        }
        // Ctrl-Z, or a job put in the background that wants the terminal: the shell must see
        // its job (baton) stopped to take the terminal back.
        self.take_terminal();
        let _ = raise(sig);
        // Continued by the shell: in the foreground again (`fg`) the terminal is the job's.
        if tcgetpgrp(std::io::stdin().as_fd()) == Ok(getpgrp()) {
            self.give_terminal();
        } else {
            let _ = killpg(self.pid, Signal::SIGCONT);
        }
    }

    /// Makes the job's group the terminal's foreground group (`baton` has it), and continues the
    /// job in case it was stopped for reading the terminal before it was its.
    fn give_terminal(&self) {
        let _ = tcsetpgrp(std::io::stdin().as_fd(), self.pid);
        let _ = killpg(self.pid, Signal::SIGCONT);
    }

    /// Gives the terminal back to `baton`'s group if the job's group has it.
    fn take_terminal(&self) {
        let stdin = std::io::stdin();
        if tcgetpgrp(stdin.as_fd()) != Ok(self.pid) {
            return;
        }
        // A background process setting the foreground group is sent SIGTTOU unless it blocks it.
        let ttou = SigSet::from(Signal::SIGTTOU);
        let mut old = SigSet::empty();
        if pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou), Some(&mut old)).is_ok() {
            let _ = tcsetpgrp(stdin.as_fd(), getpgrp());
            let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
        }
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

/// Whether standard input is a terminal whose foreground group is `baton`'s.
fn has_terminal() -> bool {
    let stdin = std::io::stdin();
    stdin.is_terminal() && tcgetpgrp(stdin.as_fd()) == Ok(getpgrp())
}
