//! How deep a JSON text nests, found without parsing it. Every parser of
//! peer JSON (device envelopes and controls, backend downlinks and acks)
//! asks this first: a document nested past [`MAX_DEPTH`] is refused before
//! serde recurses into it, so no input can make the gateway walk a
//! thousand levels deep (serde_json itself stops at 128, with an error that
//! names no limit a peer could read in the protocol).

/// The deepest nesting of arrays and objects the gateway reads; the
/// outermost object (an envelope) is level 1. docs/PROTOCOL.md names it.
pub const MAX_DEPTH: usize = 32;

/// Whether `bytes`, read as JSON, opens more than `limit` arrays or objects
/// inside one another. It counts `[` and `{` outside strings (a `\` escapes
/// the next byte inside one) and stops at the first past the limit: one
/// pass, no recursion, no allocation, and an answer for any bytes. On
/// valid JSON it is exact; on anything else serde refuses the text anyway.
pub fn nested_deeper_than(bytes: &[u8], limit: usize) -> bool {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in bytes {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deeper(s: &str, limit: usize) -> bool {
        nested_deeper_than(s.as_bytes(), limit)
    }

    #[test]
    fn nesting_is_counted_outside_strings_only() {
        assert!(!deeper("{}", 1));
        assert!(deeper("{}", 0));
        assert!(!deeper(r#"{"a":[1,{"b":[]}]}"#, 4));
        assert!(deeper(r#"{"a":[1,{"b":[]}]}"#, 3));
        assert!(!deeper(r#"{"a":[1],"b":[2],"c":{"d":3}}"#, 2), "siblings");
        assert!(!deeper(r#"{"s":"[[[[{{{{"}"#, 1), "brackets in a string");
        assert!(!deeper(r#"{"s":"\"[[[[","t":"\\"}"#, 1), "escaped quotes");
        assert!(
            deeper(r#"{"s":"\\",  "t":[[1]]}"#, 2),
            "an escaped backslash ends no string"
        );
        assert!(!deeper("", 0));
        assert!(
            !deeper("]]]]}}}}", 0),
            "closing more than opened is serde's to refuse"
        );
    }

    #[test]
    fn the_limit_is_the_deepest_level_allowed() {
        let at = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(!deeper(&at(MAX_DEPTH), MAX_DEPTH));
        assert!(deeper(&at(MAX_DEPTH + 1), MAX_DEPTH));
        assert!(deeper(&"[".repeat(100_000), MAX_DEPTH), "unclosed");
    }
}
