//! What `ferry device` says, free of I/O: each event as one line, for
//! people (`stored msg_id=a-1 seq=1`) or with `--json` as one JSON object
//! (`{"event":"receipt","msg_id":"a-1","status":"stored","seq":1}`), and
//! whether a receipt is the one `pub` waits for ([`Wait::judge`]).
//!
//! Always holds: a string the gateway or the backend chose (a reason, a
//! payload) is printed escaped (as JSON, or through [`Clip`]), never raw,
//! so it cannot move the terminal's cursor or forge a line; a reason or
//! an error is clipped to [`ferry::clip::MAX`] bytes in human output.

use ferry::client::device::InboxMessage;
use ferry::clip::Clip;
use ferry::protocol::receipt::{Receipt, ReceiptStatus};
use serde_json::{json, Value};

/// The receipt `ferry device pub` waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Wait {
    /// Committed to the gateway's store.
    Stored,
    /// Acked by the backend application.
    Delivered,
}

/// What a receipt for the message means to `pub`.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The awaited receipt (or a later state): done, exit 0.
    Done,
    /// Not yet: keep waiting (`stored` while waiting for `delivered`, or a
    /// retryable `rejected` that the client resends).
    Keep,
    /// It will never come: this reason.
    Never(String),
}

impl Wait {
    pub fn judge(self, receipt: &Receipt) -> Verdict {
        let reason = || receipt.reason.as_deref().unwrap_or("no reason given");
        match receipt.status {
            ReceiptStatus::Stored if self == Wait::Stored => Verdict::Done,
            ReceiptStatus::Stored => Verdict::Keep,
            ReceiptStatus::Delivered => Verdict::Done,
            ReceiptStatus::Rejected if receipt.is_retryable() => Verdict::Keep,
            ReceiptStatus::Rejected => Verdict::Never(format!("rejected: {}", Clip(reason()))),
            ReceiptStatus::Failed => Verdict::Never(format!("failed: {}", Clip(reason()))),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Wait::Stored => "stored",
            Wait::Delivered => "delivered",
        }
    }
}

/// The longest error text printed, in bytes: more than a log line's
/// [`ferry::clip::MAX`], so a TLS error can name the certificate's names.
const MAX_ERROR: usize = 512;

/// A failed connection's error, bounded and escaped, with what to check;
/// `with_password`: whether a password was sent.
pub fn hint(error: &str, with_password: bool) -> String {
    let error = bounded(error, MAX_ERROR);
    let lower = error.to_ascii_lowercase();
    let check =
        if lower.contains("badusernamepassword") || lower.contains("bad_user_name_or_password") {
            if with_password {
                "a wrong password, or a device not in the gateway's password file"
            } else {
                "the gateway asks for a password: give --password-file FILE or --password-stdin"
            }
        } else if lower.contains("notauthorized") || lower.contains("not_authorized") {
            "not authorized (a password needed, or a certificate naming another device)"
        } else if lower.contains("badclientid")
            || lower.contains("identifierrejected")
            || lower.contains("client_identifier_not_valid")
        {
            "the gateway does not take this id"
        } else if lower.contains("not valid for name") {
            "give --server-name with a name the gateway's certificate carries"
        } else {
            return error;
        };
    format!("{error}: {check}")
}

/// At most `max` bytes of `s` (then `…(N bytes)`), control characters
/// escaped.
fn bounded(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let mut out: String = s[..end]
        .chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect();
    if end < s.len() {
        out += &format!("…({} bytes)", s.len());
    }
    out
}

/// One event worth a line.
#[derive(Debug)]
pub enum Line<'a> {
    /// Connected (again) to `at` as `device`.
    Connected {
        device: &'a str,
        at: &'a str,
    },
    /// No connection (it broke, or an attempt failed); the client tries
    /// again.
    NoConnection {
        at: &'a str,
        error: &'a str,
    },
    /// The uplink went out on `topic`.
    Sent {
        msg_id: &'a str,
        topic: &'a str,
    },
    Receipt(&'a Receipt),
    Inbox(&'a InboxMessage),
    /// Everything up to `upto` confirmed.
    Confirmed {
        upto: u64,
    },
}

impl Line<'_> {
    /// The line, without its newline.
    pub fn render(&self, as_json: bool) -> String {
        if as_json {
            self.json().to_string()
        } else {
            self.human()
        }
    }

    fn json(&self) -> Value {
        match self {
            Line::Connected { device, at } => {
                json!({"event": "connected", "device": device, "at": at})
            }
            Line::NoConnection { at, error } => {
                json!({"event": "no_connection", "at": at, "error": error})
            }
            Line::Sent { msg_id, topic } => {
                json!({"event": "sent", "msg_id": msg_id, "topic": topic})
            }
            Line::Receipt(r) => {
                let mut v = serde_json::to_value(r).expect("a receipt is JSON");
                v["event"] = json!("receipt");
                v
            }
            Line::Inbox(m) => {
                let mut v = json!({"event": "inbox", "seq": m.seq, "msg_id": m.msg_id});
                if let Some(body) = &m.body {
                    v["body"] = body.clone();
                }
                if let Some(status) = &m.status {
                    v["status"] = json!(status);
                }
                v
            }
            Line::Confirmed { upto } => json!({"event": "confirmed", "upto": upto}),
        }
    }

    fn human(&self) -> String {
        match self {
            Line::Connected { device, at } => format!("connected as {device} to {at}"),
            Line::NoConnection { at, error } => {
                format!("no connection to {at}: {}; trying again", Clip(error))
            }
            Line::Sent { msg_id, topic } => format!("sent msg_id={msg_id} on {topic}"),
            Line::Receipt(r) => {
                let status = serde_json::to_value(r.status).expect("a status is JSON");
                let mut line = status.as_str().unwrap_or("?").to_string();
                match &r.msg_id {
                    Some(id) => line += &format!(" msg_id={id}"),
                    None => line += " msg_id=(unreadable)",
                }
                if let Some(seq) = r.seq {
                    line += &format!(" seq={}", seq.0);
                }
                if let Some(reason) = &r.reason {
                    line += &format!(" reason=\"{}\"", Clip(reason));
                }
                if let Some(row) = r.dead_letter {
                    line += &format!(" dead_letter={row}");
                }
                line
            }
            Line::Inbox(m) => {
                let mut line = format!("inbox seq={} msg_id={}", m.seq, m.msg_id);
                if let Some(body) = &m.body {
                    line += &format!(" body={body}");
                }
                if let Some(status) = &m.status {
                    line += &format!(" {status}");
                }
                line
            }
            Line::Confirmed { upto } => format!("confirmed upto={upto}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry::ids::{MsgId, Seq};

    fn id() -> MsgId {
        MsgId::new("a-1").unwrap()
    }

    #[test]
    fn pub_is_done_on_the_awaited_receipt_or_a_later_one_and_never_on_a_final_refusal() {
        let stored = Receipt::stored(&id(), Seq(1));
        let delivered = Receipt::delivered(&id(), Seq(1));
        assert_eq!(Wait::Stored.judge(&stored), Verdict::Done);
        assert_eq!(Wait::Delivered.judge(&stored), Verdict::Keep);
        assert_eq!(Wait::Stored.judge(&delivered), Verdict::Done);
        assert_eq!(Wait::Delivered.judge(&delivered), Verdict::Done);
        let rate = Receipt::refused(Some(&id()), "rate: over 200 publishes per second");
        assert_eq!(
            Wait::Stored.judge(&rate),
            Verdict::Keep,
            "resent by the client"
        );
        let bad = Receipt::rejected(Some(&id()), "malformed: stream level \"a b\"", 3);
        assert_eq!(
            Wait::Stored.judge(&bad),
            Verdict::Never("rejected: malformed: stream level \"a b\"".into())
        );
        let failed = Receipt::failed(&id(), Seq(1), "nacked: unknown sensor");
        assert_eq!(
            Wait::Delivered.judge(&failed),
            Verdict::Never("failed: nacked: unknown sensor".into())
        );
    }

    #[test]
    fn a_connection_error_is_bounded_escaped_and_says_what_to_check() {
        let refused = hint(
            "Connection refused, return code: `BadUserNamePassword`",
            true,
        );
        assert!(
            refused.ends_with(": a wrong password, or a device not in the gateway's password file")
        );
        let none = hint(
            "Connection refused, return code: `BadUserNamePassword`",
            false,
        );
        assert!(
            none.ends_with(
                ": the gateway asks for a password: give --password-file FILE or --password-stdin"
            ),
            "{none}"
        );
        let long = format!(
            "TLS: certificate not valid for name \"127.0.0.1\"\n{}",
            "x".repeat(600)
        );
        let said = hint(&long, false);
        assert!(said.contains("\\n") && !said.contains('\n'), "{said}");
        assert!(said.contains(&format!("…({} bytes)", long.len())), "{said}");
        assert!(said.ends_with("give --server-name with a name the gateway's certificate carries"));
        assert_eq!(hint("I/O: timed out", true), "I/O: timed out");
    }

    #[test]
    fn lines_read_as_events_for_people_and_as_one_object_each_for_scripts() {
        let r = Receipt::rejected(Some(&id()), "malformed: x\n\u{1b}[2J", 12);
        let human = Line::Receipt(&r).render(false);
        assert_eq!(
            human,
            "rejected msg_id=a-1 reason=\"malformed: x\\n\\u{1b}[2J\" dead_letter=12"
        );
        let json: Value = serde_json::from_str(&Line::Receipt(&r).render(true)).unwrap();
        assert_eq!(json["event"], "receipt");
        assert_eq!(json["status"], "rejected");
        assert_eq!(json["dead_letter"], 12);

        let m = InboxMessage {
            seq: 4,
            msg_id: "n-9".into(),
            body: Some(json!({"seq": 4, "msg_id": "n-9", "payload": "hi"})),
            status: None,
        };
        let human = Line::Inbox(&m).render(false);
        assert!(
            human.starts_with("inbox seq=4 msg_id=n-9 body={"),
            "{human}"
        );
        assert!(!human.contains('\n'));
        let json: Value = serde_json::from_str(&Line::Inbox(&m).render(true)).unwrap();
        assert_eq!(json["body"]["payload"], "hi");
        let tombstone = InboxMessage {
            body: None,
            status: Some("expired".into()),
            ..m
        };
        assert_eq!(
            Line::Inbox(&tombstone).render(false),
            "inbox seq=4 msg_id=n-9 expired"
        );
        assert_eq!(
            Line::Confirmed { upto: 4 }.render(true),
            r#"{"event":"confirmed","upto":4}"#
        );
    }
}
