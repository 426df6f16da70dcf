//! Mosquitto's password hashes, as `mosquitto_passwd` writes them, taken
//! as they are so a site moving devices from Mosquitto keeps its file:
//!
//! - `$6$SALT$HASH`: SHA-512 of the password followed by the salt
//!   (`-H sha512`, Mosquitto 1.6 and earlier);
//! - `$7$ITERATIONS$SALT$HASH`: PBKDF2-HMAC-SHA512 (`-H sha512-pbkdf2`,
//!   the default since 2.0).
//!
//! SALT and HASH are standard base64 (with padding); HASH is 64 bytes.
//! [`parse`] reads one or says, in words, what is wrong; [`verify`] checks
//! a password against it in constant time (the comparison; the hashing is
//! as slow as the file says).

use std::num::NonZeroU32;

use base64::Engine;

/// The most PBKDF2 iterations ferry accepts from a file: ten thousand
/// times Mosquitto's default (101), a bound on what one login may cost.
const MAX_ITERATIONS: u32 = 1_010_000;

/// A Mosquitto hash, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MosquittoHash {
    /// `None`: `$6$`, plain SHA-512; `Some(n)`: `$7$`, PBKDF2 with n
    /// iterations.
    iterations: Option<NonZeroU32>,
    salt: Vec<u8>,
    hash: Vec<u8>,
}

/// Whether `hash` is written in one of Mosquitto's formats (to be read by
/// [`parse`], not as a PHC string).
pub fn is_mosquitto(hash: &str) -> bool {
    hash.starts_with("$6$") || hash.starts_with("$7$")
}

/// Reads a `$6$` or `$7$` hash; the error says what is wrong, in words.
pub fn parse(text: &str) -> Result<MosquittoHash, String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let parts: Vec<&str> = text.split('$').collect();
    let (iterations, salt, hash) = match parts.as_slice() {
        ["", "6", salt, hash] => (None, *salt, *hash),
        ["", "7", n, salt, hash] => {
            let n: u32 = n.parse().map_err(|_| {
                format!("Mosquitto $7$ hash: iterations {n:?} is not a whole number")
            })?;
            let n = NonZeroU32::new(n)
                .filter(|n| n.get() <= MAX_ITERATIONS)
                .ok_or_else(|| {
                    format!("Mosquitto $7$ hash: {n} iterations; 1 to {MAX_ITERATIONS}")
                })?;
            (Some(n), *salt, *hash)
        }
        ["", "6" | "7", ..] => {
            return Err(format!(
                "Mosquitto ${}$ hash with {} fields; mosquitto_passwd writes $6$SALT$HASH and \
                 $7$ITERATIONS$SALT$HASH",
                parts[1],
                parts.len() - 2
            ))
        }
        _ => return Err("not a Mosquitto $6$ or $7$ hash".into()),
    };
    let salt = b64
        .decode(salt)
        .map_err(|e| format!("Mosquitto hash: its salt is not base64 ({e})"))?;
    let hash = b64
        .decode(hash)
        .map_err(|e| format!("Mosquitto hash: its hash is not base64 ({e})"))?;
    if salt.is_empty() {
        return Err("Mosquitto hash: its salt is empty".into());
    }
    if hash.len() != 64 {
        return Err(format!(
            "Mosquitto hash: {} bytes of hash; SHA-512 makes 64",
            hash.len()
        ));
    }
    Ok(MosquittoHash {
        iterations,
        salt,
        hash,
    })
}

/// Whether `password` matches `hash`.
pub fn verify(hash: &MosquittoHash, password: &[u8]) -> bool {
    match hash.iterations {
        Some(n) => ring::pbkdf2::verify(
            ring::pbkdf2::PBKDF2_HMAC_SHA512,
            n,
            &hash.salt,
            password,
            &hash.hash,
        )
        .is_ok(),
        None => {
            let mut ctx = ring::digest::Context::new(&ring::digest::SHA512);
            ctx.update(password);
            ctx.update(&hash.salt);
            let computed = ctx.finish();
            // `Output`'s equality is constant-time.
            use argon2::password_hash::Output;
            match (Output::new(computed.as_ref()), Output::new(&hash.hash)) {
                (Ok(a), Ok(b)) => a == b,
                _ => false,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Made with Debian's mosquitto_passwd 2.0.11: `-H sha512 -c -b f d1
    // secret`, then `-b f d2 secret` (sha512-pbkdf2, 101 iterations).
    const SHA512: &str = "$6$6Cq7NF62ySfAcLD4$BFuSGanSUDqIJ7pQeKoRVXIZe/FR9Cgc+a8jFkGy3/t66nAtIoBpz02RaDDSLeSfgQ6XCD1D5EKFD0lun/31mg==";
    const PBKDF2: &str = "$7$101$OQvikewjtcI+5AML$43TQL/XuHCmflHWZ9/KoUxVamZEiY81Zq1lYc8wuMg7AXIMa6UNvRDUbg3RGrbfLh4OMYSNDPSl2BUi1vRX+6A==";

    #[test]
    fn mosquitto_passwd_s_own_hashes_verify_their_password_only() {
        for text in [SHA512, PBKDF2] {
            assert!(is_mosquitto(text));
            let h = parse(text).unwrap();
            assert!(verify(&h, b"secret"), "{text}");
            assert!(!verify(&h, b"Secret"), "{text}");
        }
    }

    #[test]
    fn a_bad_mosquitto_hash_is_named_in_words() {
        for (text, why) in [
            ("$6$onlyone", "fields"),
            ("$7$x$c2FsdA==$aGFzaA==", "not a whole number"),
            ("$7$0$c2FsdA==$aGFzaA==", "iterations"),
            ("$7$2000000$c2FsdA==$aGFzaA==", "iterations"),
            ("$6$!!$aGFzaA==", "salt is not base64"),
            ("$6$c2FsdA==$aGFzaA==", "64"),
            ("$5$a$b", "not a Mosquitto"),
        ] {
            let e = parse(text).expect_err(text);
            assert!(e.contains(why), "{text}: {e}");
        }
        assert!(parse(SHA512).is_ok());
    }

    #[test]
    fn both_formats_verify_the_password_they_were_made_from() {
        let b64 = base64::engine::general_purpose::STANDARD;
        let salt = b"0123456789ab";
        // $6$: SHA-512(password || salt), as Mosquitto computes it.
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA512);
        ctx.update(b"secret");
        ctx.update(salt);
        let six = format!("$6${}${}", b64.encode(salt), b64.encode(ctx.finish()));
        // $7$: PBKDF2-HMAC-SHA512, 101 iterations, 64 bytes.
        let mut out = [0u8; 64];
        ring::pbkdf2::derive(
            ring::pbkdf2::PBKDF2_HMAC_SHA512,
            NonZeroU32::new(101).unwrap(),
            salt,
            b"secret",
            &mut out,
        );
        let seven = format!("$7$101${}${}", b64.encode(salt), b64.encode(out));
        for text in [six, seven] {
            let h = parse(&text).unwrap();
            assert!(verify(&h, b"secret"), "{text}");
            assert!(!verify(&h, b"secreT"), "{text}");
            assert!(!verify(&h, b""), "{text}");
        }
    }
}
