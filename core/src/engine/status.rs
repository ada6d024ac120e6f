//! The helper's end of the status pipe ([`gpucr_abi::engine::Status`]): one line, then
//! closed. The plugin waits for it before it lets CRIU go on.

use std::io::Write;
use std::os::fd::OwnedFd;

use gpucr_abi::engine::Status;

/// The helper's end of the status pipe; said once, then closed.
#[derive(Debug)]
pub struct StatusPipe {
    pipe: Option<std::fs::File>,
}

impl StatusPipe {
    pub fn new(fd: OwnedFd) -> StatusPipe {
        StatusPipe {
            pipe: Some(std::fs::File::from(fd)),
        }
    }

    /// The helper serves `backend`.
    pub fn ready(&mut self, backend: &str) {
        self.say(Status::Ready(backend.to_owned()));
    }

    /// Nothing for gpucr here: the plugin stays out of the way.
    pub fn none(&mut self) {
        self.say(Status::None);
    }

    /// Setting up failed (a no-op once something else was said).
    pub fn error(&mut self, message: &str) {
        self.say(Status::Error(message.to_owned()));
    }

    fn say(&mut self, status: Status) {
        if let Some(mut pipe) = self.pipe.take() {
            // The plugin reads until the pipe closes; a plugin that went away needs no
            // answer.
            let _ = pipe.write_all(status.line().as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_first_line_is_said() {
        let (r, w) = nix::unistd::pipe().unwrap();
        let mut status = StatusPipe::new(w);
        status.ready("sim");
        status.error("too late");
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(r), &mut text).unwrap();
        assert_eq!(Status::parse(&text), Status::Ready("sim".into()));
    }
}
