//! The API token (`--api-token-file`): calls must carry `authorization: Bearer <token>`.
//!
//! The file holds one token per line (blank lines ignored), so that a token can be rotated
//! without refusing anyone: add the new one, move the clients to it, remove the old one. Tokens
//! are kept as SHA-256 digests and a presented token is compared with every accepted one in
//! constant time, so neither its contents nor how much of it matched shows in the time an answer
//! takes.

use std::{
    path::PathBuf,
    sync::{Arc, RwLock},
};

use subtle::ConstantTimeEq as _;

use super::files::Source;

/// Largest token file accepted, in bytes.
pub const MAX_TOKEN_FILE_BYTES: u64 = 4096;
/// Most tokens accepted at once (lines of the token file).
pub const MAX_TOKENS: usize = 8;
/// Shortest token accepted without a warning, in bytes.
pub const SHORT_TOKEN_BYTES: usize = 16;

type Digest = [u8; 32];

fn digest(bytes: &[u8]) -> Digest {
    let mut out = [0; 32];
    out.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref());
    out
}

/// The tokens accepted.
#[derive(Debug, Clone)]
pub struct Tokens(Vec<Digest>);

impl Tokens {
    /// Parses a token file: one token per line, each 1 to [`MAX_TOKEN_FILE_BYTES`] visible ASCII
    /// characters (what an HTTP header value can carry), at most [`MAX_TOKENS`]; at least one.
    /// Warns of a token shorter than [`SHORT_TOKEN_BYTES`].
    pub fn parse(contents: &[u8], path: &str) -> Result<Self, String> {
        let text = std::str::from_utf8(contents)
            .map_err(|_| format!("the API token file {path} is not UTF-8 text"))?;
        let mut tokens = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let token = line.trim();
            if token.is_empty() {
                continue;
            }
            if !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(format!(
                    "the API token file {path}: line {} holds a character that is not visible \
                     ASCII (a token must fit an HTTP header)",
                    n + 1
                ));
            }
            if tokens.len() == MAX_TOKENS {
                return Err(format!(
                    "the API token file {path} holds more than {MAX_TOKENS} tokens"
                ));
            }
            if token.len() < SHORT_TOKEN_BYTES {
                tracing::warn!(
                    line = n + 1,
                    "an API token is shorter than {SHORT_TOKEN_BYTES} characters: easy to guess"
                );
            }
            tokens.push(digest(token.as_bytes()));
        }
        if tokens.is_empty() {
            return Err(format!("the API token file {path} holds no token"));
        }
        Ok(Self(tokens))
    }

    /// Whether `presented` is one of the tokens, compared in constant time.
    pub fn accepts(&self, presented: &[u8]) -> bool {
        let presented = digest(presented);
        let mut found = subtle::Choice::from(0);
        for token in &self.0 {
            found |= token.ct_eq(&presented);
        }
        found.into()
    }
}

/// Why a call's credentials were refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No `authorization` metadata.
    Missing,
    /// `authorization` is not `Bearer <token>`.
    Malformed,
    /// A token that is not accepted.
    Wrong,
    /// Several `authorization` values: which one counts would be a guess, so none does.
    Repeated,
}

impl Refusal {
    /// The message of the `UNAUTHENTICATED` status.
    pub fn message(self) -> &'static str {
        match self {
            Self::Missing => {
                "this Baton requires an API token: send the metadata `authorization: Bearer \
                 <token>` with the token of its --api-token-file"
            }
            Self::Malformed => {
                "the `authorization` metadata must be `Bearer <token>` (the token of Baton's \
                 --api-token-file)"
            }
            Self::Wrong => {
                "the API token is not valid: it is not one of the tokens of Baton's \
                 --api-token-file"
            }
            Self::Repeated => {
                "the `authorization` metadata is given more than once: send it once, \
                 `Bearer <token>`"
            }
        }
    }
}

/// The tokens in force, reloaded when the file changes; cheap to clone.
#[derive(Clone)]
pub struct ApiToken {
    path: PathBuf,
    current: Arc<RwLock<Option<Arc<Tokens>>>>,
}

impl ApiToken {
    /// The tokens of the file at `path`, in force once [`TokenSource`] applies it.
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            current: Arc::new(RwLock::new(None)),
        }
    }

    /// Checks the values of a call's `authorization` metadata: exactly one, carrying a token in
    /// force.
    pub fn check<'v>(
        &self,
        mut authorization: impl Iterator<Item = &'v [u8]>,
    ) -> Result<(), Refusal> {
        let value = authorization.next().ok_or(Refusal::Missing)?;
        if authorization.next().is_some() {
            return Err(Refusal::Repeated);
        }
        let token = bearer(value).ok_or(Refusal::Malformed)?;
        let current = self
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        match current {
            Some(tokens) if tokens.accepts(token) => Ok(()),
            _ => Err(Refusal::Wrong),
        }
    }
}

/// The token of an `authorization` value `Bearer <token>` (the scheme in any case, spaces
/// around the token ignored).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer ";
    if value.len() <= SCHEME.len() || !value[..SCHEME.len()].eq_ignore_ascii_case(SCHEME) {
        return None;
    }
    let token = value[SCHEME.len()..].trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// The token file as a watched [`Source`].
pub struct TokenSource {
    token: ApiToken,
    paths: Vec<PathBuf>,
}

impl TokenSource {
    /// Watches the file of `token`, putting each valid change in force.
    pub fn new(token: ApiToken) -> Self {
        let paths = vec![token.path.clone()];
        Self { token, paths }
    }
}

impl Source for TokenSource {
    fn what(&self) -> &'static str {
        "API token"
    }

    fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    fn max_bytes(&self) -> u64 {
        MAX_TOKEN_FILE_BYTES
    }

    fn apply(&self, contents: &[Vec<u8>]) -> Result<(), String> {
        let [file] = contents else {
            return Err("the API token file was not read".to_owned());
        };
        let tokens = Tokens::parse(file, &self.token.path.display().to_string())?;
        *self
            .token
            .current
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(tokens));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each non-blank line is a token; an empty file, a control character or too many tokens
    /// are refused.
    #[test]
    fn token_files_are_checked() {
        let tokens = Tokens::parse(
            b"first-token-0123456789\n\n  second-token-0123456789\r\n",
            "f",
        )
        .expect("two tokens");
        assert!(tokens.accepts(b"first-token-0123456789"));
        assert!(tokens.accepts(b"second-token-0123456789"));
        assert!(!tokens.accepts(b"first-token-012345678"));
        assert!(!tokens.accepts(b""));
        for bad in [&b""[..], b"\n \n", b"a\x01b", b"caf\xc3\xa9", b"\xff"] {
            assert!(Tokens::parse(bad, "f").is_err(), "{bad:?}");
        }
        let many = (0..=MAX_TOKENS)
            .map(|n| format!("token-{n:020}\n"))
            .collect::<String>();
        assert!(Tokens::parse(many.as_bytes(), "f").is_err());
    }

    /// `Bearer` in any case, then the token; anything else is malformed.
    #[test]
    fn bearer_values() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer   abc "), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bearer "), None);
        assert_eq!(bearer(b"Bearer"), None);
        assert_eq!(bearer(b"abc"), None);
    }
}
