//! Relaying the command's output as it comes, keeping at most the first
//! `--max-output` bytes of stdout, stderr and its terminal together (in
//! the order they arrive) and counting the rest.

use std::io::Write;
use std::os::fd::AsFd;

/// Once output passes `--max-output` CAP, a command still writing is
/// stopped when the total passes `max(64 × CAP, 1 MiB)` or 10 s after it
/// passed CAP, whichever comes first (unless `--overflow discard`): enough
/// slack that a command printing a little past the cap and exiting keeps
/// its own exit code, and a bound on what a runaway (`yes`) costs.
pub const STOP_FACTOR: u64 = 64;
/// The smallest total at which a command is stopped for its output.
pub const STOP_MIN: u64 = 1 << 20;
/// How long a command may go on writing after passing the cap.
pub const STOP_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

/// The total output at which a command over `cap` is stopped.
pub fn stop_bound(cap: u64) -> u64 {
    cap.saturating_mul(STOP_FACTOR).max(STOP_MIN)
}

/// Which of the command's streams a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Out,
    Err,
    /// The caller's terminal on stdin (the command's terminal echoing what
    /// is typed when neither stdout nor stderr is a terminal).
    Terminal,
}

/// The byte budget and where output goes.
pub struct Relay {
    limit: Option<u64>,
    total: u64,
    kept: u64,
    /// The last byte written to stdout was a newline (or none was written).
    stdout_at_line_start: bool,
    /// A sink that failed (a closed pipe) is no longer written; the
    /// command's output is still drained and counted.
    out_broken: bool,
    err_broken: bool,
    tty_broken: bool,
}

impl Relay {
    pub fn new(limit: Option<u64>) -> Relay {
        Relay {
            limit,
            total: 0,
            kept: 0,
            stdout_at_line_start: true,
            out_broken: false,
            err_broken: false,
            tty_broken: false,
        }
    }

    /// How many bytes of a chunk of `len` arriving now are kept.
    pub fn admit(&mut self, len: usize) -> usize {
        let len = len as u64;
        self.total += len;
        let room = self.limit.map_or(len, |l| l.saturating_sub(self.kept));
        let take = room.min(len);
        self.kept += take;
        take as usize
    }

    /// Accepts a chunk and writes what is kept of it.
    pub fn relay(&mut self, stream: Stream, chunk: &[u8]) {
        let take = self.admit(chunk.len());
        if take == 0 {
            return;
        }
        let part = &chunk[..take];
        match stream {
            Stream::Out => {
                if !self.out_broken {
                    let mut out = std::io::stdout().lock();
                    self.out_broken = out.write_all(part).and_then(|_| out.flush()).is_err();
                }
                self.stdout_at_line_start = part.last() == Some(&b'\n');
            }
            Stream::Err => {
                if !self.err_broken {
                    self.err_broken = std::io::stderr().lock().write_all(part).is_err();
                }
            }
            Stream::Terminal => {
                if !self.tty_broken {
                    self.tty_broken = write_all_to_stdin(part).is_err();
                }
            }
        }
    }

    /// Whether more than the cap arrived.
    pub fn over(&self) -> bool {
        self.limit.is_some_and(|l| self.total > l)
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    /// The cap, if any.
    pub fn limit(&self) -> Option<u64> {
        self.limit
    }

    pub fn kept(&self) -> u64 {
        self.kept
    }

    /// Whether a line printed on stdout now starts on a line of its own.
    pub fn stdout_at_line_start(&self) -> bool {
        self.stdout_at_line_start
    }
}

/// Writes to descriptor 0 (a terminal, opened for reading and writing).
fn write_all_to_stdin(mut data: &[u8]) -> nix::Result<()> {
    let stdin = std::io::stdin();
    while !data.is_empty() {
        match nix::unistd::write(stdin.as_fd(), data) {
            Ok(0) => return Err(nix::Error::EIO),
            Ok(n) => data = &data[n..],
            Err(nix::Error::EINTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_first_bytes_across_chunks_and_counts_all() {
        let mut r = Relay::new(Some(10));
        assert_eq!(r.admit(4), 4);
        assert_eq!(r.admit(4), 4);
        assert_eq!(r.admit(4), 2);
        assert_eq!(r.admit(7), 0);
        assert_eq!((r.kept(), r.total()), (10, 19));
    }

    #[test]
    fn the_stop_bound_is_64_times_the_cap_and_at_least_a_mebibyte() {
        assert_eq!(stop_bound(1000), 1 << 20);
        assert_eq!(stop_bound(1 << 20), 64 << 20);
        assert_eq!(stop_bound(u64::MAX), u64::MAX);
        let mut r = Relay::new(Some(3));
        r.admit(3);
        assert!(!r.over());
        r.admit(1);
        assert!(r.over());
    }

    #[test]
    fn no_limit_keeps_everything_and_zero_keeps_nothing() {
        let mut r = Relay::new(None);
        assert_eq!(r.admit(1 << 20), 1 << 20);
        assert_eq!(r.kept(), r.total());
        let mut z = Relay::new(Some(0));
        assert_eq!(z.admit(5), 0);
        assert_eq!((z.kept(), z.total()), (0, 5));
    }
}
