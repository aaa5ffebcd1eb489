//! Page tokens: where a page stopped in the result order (an exclusive range start, never an
//! offset), bound to the query it belongs to and checked for corruption.
//!
//! A token is URL-safe base64 (no padding) of:
//!
//! | bytes | meaning |
//! |---|---|
//! | 1 | format version (1) |
//! | 1 | group the next page starts in (automatic mode), or 1 |
//! | 8 | fingerprint of the query: kind of call, name, matching form of the query, mode, order |
//! | n | position: the last entry the previous page looked at (may be empty: the group's start) |
//! | 8 | checksum of everything before it |
//!
//! Tokens carry no secret: a client could forge one, but a position is only ever used as the
//! exclusive start of a range read in the same dictionary or list, so a forged token can only
//! return entries the same query could have returned.

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};

use crate::error::Error;

/// The longest page token accepted, in characters.
pub const MAX_TOKEN_CHARS: usize = 4096;
const VERSION: u8 = 1;
const HEADER: usize = 1 + 1 + 8;
const TRAILER: usize = 8;

/// Where the next page starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// The group (automatic mode) the next page starts in; 1 otherwise.
    pub group: u8,
    /// The last entry looked at, exclusive; empty for the group's start.
    pub position: Vec<u8>,
}

/// What a token belongs to: a token made for one scope is rejected by any other.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    /// The kind of call ("complete", "list-recent", "complete-recent").
    pub call: &'a str,
    /// The dictionary's or list's name.
    pub name: &'a str,
    /// The query's matching form ("" when there is none).
    pub query: &'a str,
    /// Mode and order, as short names.
    pub mode: &'a str,
    /// The order's short name ("" when there is none).
    pub order: &'a str,
}

impl Scope<'_> {
    fn fingerprint(&self) -> u64 {
        let mut h = Fnv::new();
        for part in [self.call, self.name, self.query, self.mode, self.order] {
            h.write(&(part.len() as u64).to_be_bytes());
            h.write(part.as_bytes());
        }
        h.finish()
    }
}

/// Encodes `cursor` as a token for `scope`.
pub fn encode(scope: &Scope<'_>, cursor: &Cursor) -> String {
    let mut raw = Vec::with_capacity(HEADER + cursor.position.len() + TRAILER);
    raw.push(VERSION);
    raw.push(cursor.group);
    raw.extend_from_slice(&scope.fingerprint().to_be_bytes());
    raw.extend_from_slice(&cursor.position);
    let mut h = Fnv::new();
    h.write(&raw);
    raw.extend_from_slice(&h.finish().to_be_bytes());
    URL_SAFE_NO_PAD.encode(raw)
}

/// Decodes the `page_token` field: `None` for an empty token (the first page).
pub fn decode(
    field: &'static str,
    scope: &Scope<'_>,
    token: &str,
) -> Result<Option<Cursor>, Error> {
    if token.is_empty() {
        return Ok(None);
    }
    if token.len() > MAX_TOKEN_CHARS {
        return Err(Error::invalid(
            field,
            format!("is longer than {MAX_TOKEN_CHARS} characters"),
        ));
    }
    let corrupt = || {
        Error::invalid(
            field,
            "is corrupt: pass a next_page_token exactly as returned",
        )
    };
    let raw = URL_SAFE_NO_PAD.decode(token).map_err(|_| corrupt())?;
    if raw.len() < HEADER + TRAILER || raw[0] != VERSION {
        return Err(corrupt());
    }
    let (body, sum) = raw.split_at(raw.len() - TRAILER);
    let mut h = Fnv::new();
    h.write(body);
    if h.finish().to_be_bytes() != sum {
        return Err(corrupt());
    }
    if body[2..HEADER] != scope.fingerprint().to_be_bytes() {
        return Err(Error::invalid(
            field,
            "belongs to another query: keep the name, query, mode and order of the first page",
        ));
    }
    Ok(Some(Cursor {
        group: body[1],
        position: body[HEADER..].to_vec(),
    }))
}

/// FNV-1a, 64 bits: a fixed, portable hash (tokens must survive a Baton upgrade or restart).
pub(super) struct Fnv(u64);

impl Fnv {
    pub(super) fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    pub(super) fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    pub(super) fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(query: &str) -> Scope<'_> {
        Scope {
            call: "complete",
            name: "guild",
            query,
            mode: "prefix",
            order: "lex",
        }
    }

    /// A token decodes to the cursor it was made from, for the same scope only.
    #[test]
    fn round_trip_and_scope() {
        let cursor = Cursor {
            group: 3,
            position: b"ann\0Ann \xff\x00".to_vec(),
        };
        let token = encode(&scope("ann"), &cursor);
        assert_eq!(
            decode("page_token", &scope("ann"), &token).unwrap(),
            Some(cursor)
        );
        let err = decode("page_token", &scope("anna"), &token).unwrap_err();
        assert!(err.to_string().contains("another query"), "{err}");
        assert_eq!(decode("page_token", &scope("ann"), "").unwrap(), None);
    }

    /// Any changed, cut or extended token is rejected as corrupt.
    #[test]
    fn corruption_is_detected() {
        let token = encode(
            &scope("ann"),
            &Cursor {
                group: 1,
                position: b"anna\0Anna".to_vec(),
            },
        );
        let raw = URL_SAFE_NO_PAD.decode(&token).unwrap();
        for i in 0..raw.len() {
            let mut bad = raw.clone();
            bad[i] ^= 0x01;
            let bad = URL_SAFE_NO_PAD.encode(bad);
            let err = decode("page_token", &scope("ann"), &bad).unwrap_err();
            assert!(err.to_string().starts_with("page_token: "), "{err}");
        }
        for bad in [
            &token[..token.len() - 1],
            &token[..4],
            "!!!",
            "AAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        ] {
            assert!(decode("page_token", &scope("ann"), bad).is_err(), "{bad}");
        }
        let long = "A".repeat(MAX_TOKEN_CHARS + 1);
        assert!(decode("page_token", &scope("ann"), &long).is_err());
    }
}
