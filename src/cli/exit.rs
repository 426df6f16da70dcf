//! How `ferry` ends: one [`Exit`] per kind of outcome, and the only place
//! exit codes are written. Every command returns an `Exit` (or an error
//! that maps to one); `main` hands it to the process.
//!
//! | outcome | code |
//! |---|---|
//! | done | 0 |
//! | a runtime failure (the store, a file, the network) | 1 |
//! | usage or config: a bad argument, key or value | 64 |
//! | stdout closed by its reader (`ferry dlq list \| head`) | 141 |

use std::process::ExitCode;

use ferry::ops::OpsError;

use super::output::OutputError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Ok,
    /// Something failed while doing what was asked.
    Runtime,
    /// What was asked cannot be: fix the command line or the config.
    Usage,
    /// The reader of stdout went away: as a shell reports a command that
    /// SIGPIPE ended (128 + 13), with nothing said.
    StdoutClosed,
}

impl Exit {
    pub fn code(self) -> u8 {
        match self {
            Exit::Ok => 0,
            Exit::Runtime => 1,
            Exit::Usage => 64,
            Exit::StdoutClosed => 141,
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit.code())
    }
}

impl From<&OpsError> for Exit {
    fn from(e: &OpsError) -> Exit {
        match e {
            OpsError::Usage(_) => Exit::Usage,
            OpsError::Runtime(_) => Exit::Runtime,
        }
    }
}

impl From<&OutputError> for Exit {
    fn from(e: &OutputError) -> Exit {
        match e {
            OutputError::Closed => Exit::StdoutClosed,
            OutputError::Failed(_) => Exit::Runtime,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_outcome_has_its_documented_code() {
        let codes = [Exit::Ok, Exit::Runtime, Exit::Usage, Exit::StdoutClosed].map(Exit::code);
        assert_eq!(codes, [0, 1, 64, 141]);
        assert_eq!(Exit::from(&OpsError::Usage("x".into())), Exit::Usage);
        assert_eq!(Exit::from(&OpsError::Runtime("x".into())), Exit::Runtime);
    }
}
