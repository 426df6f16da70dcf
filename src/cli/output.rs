//! What the `ferry` commands print: gathered in a [`Text`] and written to
//! stdout whole, once, by [`Text::print`], whose error says whether the
//! reader went away (`ferry dlq list | head`) or the write failed.
//!
//! Always holds: no command writes with `print!`/`println!` (Rust ignores
//! SIGPIPE, so those panic on a closed pipe, exit 101 with a backtrace);
//! a closed stdout is an answer ([`OutputError::Closed`]), not a panic. A line on
//! stderr ([`say`]) is best effort: if stderr is gone too, there is no one
//! left to tell.

use std::fmt::{self, Display};
use std::io::{self, Write};

/// Why [`Text::print`] did not write everything.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// The reader of stdout went away (EPIPE).
    #[error("stdout was closed")]
    Closed,
    #[error("cannot write to stdout: {0}")]
    Failed(io::Error),
}

/// A command's output, line by line.
#[derive(Debug, Default)]
pub struct Text(String);

impl Text {
    pub fn new() -> Text {
        Text::default()
    }

    /// Appends `line` and a newline.
    pub fn line(&mut self, line: impl Display) {
        use fmt::Write as _;
        // Writing into a String cannot fail.
        let _ = writeln!(self.0, "{line}");
    }

    /// Appends `text` as it is (a rendered table ends in its own newline).
    pub fn push(&mut self, text: &str) {
        self.0.push_str(text);
    }

    /// Writes it all to stdout and flushes.
    pub fn print(self) -> Result<(), OutputError> {
        write_to(&mut io::stdout().lock(), self.0.as_bytes())
    }
}

fn write_to(out: &mut impl Write, bytes: &[u8]) -> Result<(), OutputError> {
    out.write_all(bytes)
        .and_then(|()| out.flush())
        .map_err(|e| match e.kind() {
            io::ErrorKind::BrokenPipe => OutputError::Closed,
            _ => OutputError::Failed(e),
        })
}

/// `line` on stderr, if stderr is still there.
pub fn say(line: impl Display) {
    let _ = writeln!(io::stderr().lock(), "{line}");
}

/// A refused config's problems as the lines a command prints after its
/// `ferry: `: one per key, each `FILE: config key ...`.
pub fn config_problems(config: &std::path::Path, errors: &ferry::config::ConfigErrors) -> String {
    let lines: Vec<String> = errors
        .iter()
        .map(|e| format!("{}: {e}", config.display()))
        .collect();
    lines.join("\nferry: ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_gathered_and_a_closed_reader_is_an_answer_not_a_panic() {
        let mut text = Text::new();
        text.line(format_args!("{}: {}", "a", 1));
        text.push("b\n");
        assert_eq!(text.0, "a: 1\nb\n");
        let mut sink = Vec::new();
        assert!(write_to(&mut sink, text.0.as_bytes()).is_ok());
        assert_eq!(sink, b"a: 1\nb\n");
        // A real pipe whose reader is gone (Rust ignores SIGPIPE: EPIPE).
        let (reader, mut writer) = io::pipe().expect("a pipe");
        drop(reader);
        assert!(matches!(
            write_to(&mut writer, b"x"),
            Err(OutputError::Closed)
        ));
    }
}
