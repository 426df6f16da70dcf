//! A message id read from the head of a JSON object that may be cut short:
//! an oversized message is kept only as its head, and its rejection still
//! names the id when the id came before the cut. Never panics on any input.

use crate::ids::MsgId;

/// The top-level `msg_id` of a JSON object that may be cut short (an
/// oversized message of which only the head was kept), if it comes before
/// the cut and is a valid id. Reads at most `head`; never panics.
pub fn sniff_msg_id(head: &[u8]) -> Option<MsgId> {
    let mut s = Scanner { b: head, i: 0 };
    s.ws();
    s.eat(b'{')?;
    loop {
        s.ws();
        let key = s.string()?;
        s.ws();
        s.eat(b':')?;
        s.ws();
        if key == b"msg_id" {
            let value = s.string()?;
            return std::str::from_utf8(value)
                .ok()
                .and_then(|v| MsgId::new(v).ok());
        }
        s.skip_value()?;
        s.ws();
        s.eat(b',')?;
    }
}

/// A forward-only reader over possibly truncated JSON; `None` means "cut
/// short or not JSON".
struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Scanner<'a> {
    fn ws(&mut self) {
        while self.b.get(self.i).is_some_and(|c| c.is_ascii_whitespace()) {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.b.get(self.i) == Some(&c)).then(|| self.i += 1)
    }

    /// A string's raw bytes between the quotes (escapes left as they are).
    fn string(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let start = self.i;
        loop {
            match *self.b.get(self.i)? {
                b'\\' => self.i += 2,
                b'"' => {
                    self.i += 1;
                    return Some(&self.b[start..self.i - 1]);
                }
                _ => self.i += 1,
            }
        }
    }

    /// Skips one value of any kind, nested ones included.
    fn skip_value(&mut self) -> Option<()> {
        let mut depth = 0usize;
        loop {
            match *self.b.get(self.i)? {
                b'"' => {
                    self.string()?;
                }
                b'{' | b'[' => {
                    depth += 1;
                    self.i += 1;
                }
                b'}' | b']' => {
                    depth = depth.checked_sub(1)?;
                    self.i += 1;
                }
                b',' if depth == 0 => return Some(()),
                _ => self.i += 1,
            }
            if depth == 0 && matches!(self.b.get(self.i), Some(b',' | b'}')) {
                return Some(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_msg_id_is_sniffed_from_a_cut_head_at_the_top_level_only() {
        let id = |s: &str| sniff_msg_id(s.as_bytes()).map(|m| m.as_str().to_string());
        assert_eq!(
            id(r#"{"msg_id":"a-1","payload":"xxxx"#).as_deref(),
            Some("a-1")
        );
        assert_eq!(
            id(r#" { "ts" : 5, "payload": {"msg_id":"inner","x":[1,{"y":"}"}]}, "msg_id" : "outer", "p"#)
                .as_deref(),
            Some("outer")
        );
        assert_eq!(id(r#"{"payload":"xxxxxxxxxxxx"#), None, "cut before the id");
        assert_eq!(id(r#"{"msg_id":"a b"}"#), None, "not a valid id");
        assert_eq!(id(r#"{"msg_id":"a-"#), None, "the id itself is cut");
        assert_eq!(id("[1,2]"), None);
        assert_eq!(id(""), None);
        assert_eq!(id(r#"{"a":"\"","msg_id":"q-1"}"#).as_deref(), Some("q-1"));
        for n in 0..40 {
            sniff_msg_id(&br#"{"a":[{"b":"\\"}],"msg_id":"z"}"#[..n.min(30)]);
        }
    }
}
