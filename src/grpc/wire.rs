//! Checks and conversions shared by every gRPC handler: durations, names, tokens, idempotency keys
//! and the caller's deadline. Each failure is an [`Error::InvalidArgument`] that names the proto
//! field.

use std::time::Duration;

use tonic::metadata::MetadataMap;

use crate::error::{Error, Field};

/// Converts a proto duration to milliseconds, rounding sub-millisecond parts up.
///
/// `None` and zero are returned as `None`; negative or malformed values are an error for `field`.
/// A well-formed Duration has `nanos` within ±999,999,999 and of the sign of `seconds` (either
/// sign when `seconds` is 0), so `{seconds: 0, nanos: -1}` is a negative duration, not a
/// malformed one.
pub fn millis(
    field: impl Into<Field>,
    value: Option<prost_types::Duration>,
) -> Result<Option<Duration>, Error> {
    let field = field.into();
    let Some(d) = value else { return Ok(None) };
    let malformed = |why: String| {
        Err(Error::invalid(
            field.clone(),
            format!("is not a well-formed Duration: {why}"),
        ))
    };
    if d.nanos.unsigned_abs() >= 1_000_000_000 {
        return malformed(format!(
            "nanos {} is outside -999999999 to 999999999",
            d.nanos
        ));
    }
    if (d.seconds > 0 && d.nanos < 0) || (d.seconds < 0 && d.nanos > 0) {
        return malformed(format!(
            "seconds {} and nanos {} have opposite signs",
            d.seconds, d.nanos
        ));
    }
    if d.seconds < 0 || d.nanos < 0 {
        return Err(Error::invalid(field, "must not be negative"));
    }
    let secs = u64::try_from(d.seconds).unwrap_or(0);
    // nanos is in [0, 1e9) here, so the conversion cannot fail.
    let nanos = u64::try_from(d.nanos).unwrap_or(0);
    let ms = secs
        .checked_mul(1000)
        .and_then(|m| m.checked_add(nanos.div_ceil(1_000_000)))
        .ok_or_else(|| Error::invalid(field, "is too large"))?;
    Ok((ms > 0).then(|| Duration::from_millis(ms)))
}

/// A required duration within `[min, max]`, at millisecond precision.
pub fn bounded(
    field: impl Into<Field>,
    value: Option<prost_types::Duration>,
    min: Duration,
    max: Duration,
) -> Result<Duration, Error> {
    let field = field.into();
    match millis(field.clone(), value)? {
        None => Err(Error::invalid(
            field,
            format!("is required ({} to {})", show(min), show(max)),
        )),
        Some(d) => within(field, value, d, min, max),
    }
}

/// An optional duration within `[min, max]` when present and non-zero.
pub fn optional_bounded(
    field: impl Into<Field>,
    value: Option<prost_types::Duration>,
    min: Duration,
    max: Duration,
) -> Result<Option<Duration>, Error> {
    let field = field.into();
    millis(field.clone(), value)?
        .map(|d| within(field, value, d, min, max))
        .transpose()
}

/// `d` (the millisecond value of `sent`) when what was sent is within `[min, max]` (whole
/// milliseconds, so its rounded value is too); the error names what the caller sent, as sent
/// (its rounded value may lie within the bounds).
fn within(
    field: impl Into<Field>,
    sent: Option<prost_types::Duration>,
    d: Duration,
    min: Duration,
    max: Duration,
) -> Result<Duration, Error> {
    let sent_exactly = sent.and_then(|p| {
        Some(Duration::new(
            u64::try_from(p.seconds).ok()?,
            u32::try_from(p.nanos).ok()?,
        ))
    });
    let exact = sent_exactly.unwrap_or(d);
    if exact < min || exact > max {
        let value = show(exact);
        return Err(Error::invalid(
            field,
            format!("{value} is outside {} to {}", show(min), show(max)),
        ));
    }
    Ok(d)
}

fn show(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// Converts a duration to its proto form.
pub fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        // subsec_nanos is below 1e9, which fits in i32.
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

/// A non-empty string of at most `max` bytes.
pub fn text(field: impl Into<Field>, value: &str, max: usize) -> Result<&str, Error> {
    let field = field.into();
    if value.is_empty() {
        return Err(Error::invalid(field, "must not be empty"));
    }
    optional_text(field, value, max)
}

/// A string of at most `max` bytes, possibly empty.
pub fn optional_text(field: impl Into<Field>, value: &str, max: usize) -> Result<&str, Error> {
    if value.len() > max {
        return Err(Error::invalid(
            field,
            format!("is {} bytes, more than the {max} allowed", value.len()),
        ));
    }
    Ok(value)
}

/// A lease token as Baton issues them: a UUID in its 36-character hyphenated form.
pub fn token(field: impl Into<Field>, value: &str) -> Result<uuid::Uuid, Error> {
    let field = field.into();
    if value.is_empty() {
        return Err(Error::invalid(field, "must not be empty"));
    }
    uuid::Uuid::try_parse(value)
        .ok()
        .filter(|u| value.len() == 36 && u.hyphenated().to_string() == value)
        .ok_or_else(|| {
            Error::invalid(
                field,
                "is not of the form Baton's tokens have (a UUID in lowercase hyphenated form)",
            )
        })
}

/// The answer to a request whose gRPC framing is broken: it ended before a whole message (no
/// message at all, or a message cut short), or its compression flag is wrong (set without a
/// `grpc-encoding`, or neither 0 nor 1). tonic answers `INTERNAL`, the code of a server fault,
/// which Baton's metrics and log would count as one; it is the client's fault, so it becomes
/// `INVALID_ARGUMENT` with tonic's words. Any other answer is left as it is. Used as a
/// `map_response` layer over every service, inside the metrics layer.
pub fn broken_request_is_invalid<B>(mut response: http::Response<B>) -> http::Response<B> {
    let headers = response.headers();
    if headers.get("grpc-status").map(|v| v.as_bytes()) != Some(b"13") {
        return response;
    }
    let Some(status) = tonic::Status::from_header_map(headers) else {
        return response;
    };
    let message = status.message();
    let what = if message == INCOMPLETE_REQUEST || message.starts_with(TRUNCATED_REQUEST) {
        "the request ended before a whole message"
    } else if message.starts_with(BAD_COMPRESSION_FLAG) {
        "the request's compression flag is wrong"
    } else {
        return response;
    };
    let invalid = tonic::Status::invalid_argument(format!("{what}: {message}"));
    // Only fails for a message that cannot be a header value; this one can.
    let _ = invalid.add_header(response.headers_mut());
    response
}

/// tonic's words for a unary request whose stream ended with no message.
const INCOMPLETE_REQUEST: &str = "Missing request message.";
/// tonic's words for a request whose last message was cut short.
const TRUNCATED_REQUEST: &str = "Unexpected EOF decoding stream";
/// How tonic's words start for a message whose compression flag is set without a
/// `grpc-encoding`, or is neither 0 nor 1.
const BAD_COMPRESSION_FLAG: &str = "protocol error: received message with";

/// Smallest margin kept before a caller's deadline.
pub const MIN_DEADLINE_MARGIN: Duration = Duration::from_millis(1);
/// Largest margin kept before a caller's deadline.
pub const MAX_DEADLINE_MARGIN: Duration = Duration::from_millis(50);

/// The time kept free before a caller's `deadline` so that an answer sent by then still reaches
/// it: a fifth of the deadline, within [`MIN_DEADLINE_MARGIN`] and [`MAX_DEADLINE_MARGIN`].
pub fn deadline_margin(deadline: Duration) -> Duration {
    (deadline / 5).clamp(MIN_DEADLINE_MARGIN, MAX_DEADLINE_MARGIN)
}

/// Cuts `wait` short so that a waiting call answers before the caller's gRPC `deadline` (read
/// with [`deadline`]): the wait ends two margins before it, one for the last attempt and one for
/// the answer's way back.
pub fn fit_wait(wait: Duration, deadline: Option<Duration>) -> Duration {
    match deadline {
        Some(d) => wait.min(d.saturating_sub(2 * deadline_margin(d))),
        None => wait,
    }
}

/// Whether an answer ready `elapsed` after the call arrived would still reach a caller whose
/// `deadline` was that long, with [`deadline_margin`] to spare.
pub fn in_time(elapsed: Duration, deadline: Option<Duration>) -> bool {
    deadline.is_none_or(|d| elapsed + deadline_margin(d) <= d)
}

/// An optional idempotency key: at most `max` bytes of ASCII letters, digits and `-_.:`.
pub fn idempotency_key(
    field: impl Into<Field>,
    value: &str,
    max: usize,
) -> Result<Option<String>, Error> {
    let field = field.into();
    optional_text(field.clone(), value, max)?;
    if let Some(bad) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')))
    {
        return Err(Error::invalid(
            field,
            format!("{bad:?} is not allowed: use letters, digits and -_.: only"),
        ));
    }
    Ok((!value.is_empty()).then(|| value.to_owned()))
}

/// How long until the caller's gRPC deadline (`grpc-timeout` header), if it sent one.
pub fn deadline(metadata: &MetadataMap) -> Option<Duration> {
    grpc_timeout(metadata.get("grpc-timeout")?.to_str().ok()?)
}

/// A `grpc-timeout` header's value (digits and a unit, e.g. `250m`) as a duration, if valid.
pub fn grpc_timeout(raw: &str) -> Option<Duration> {
    let (value, unit) = raw.split_at(raw.len().checked_sub(1)?);
    let value: u64 = value.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(value.saturating_mul(3600)),
        "M" => Duration::from_secs(value.saturating_mul(60)),
        "S" => Duration::from_secs(value),
        "m" => Duration::from_millis(value),
        "u" => Duration::from_micros(value),
        "n" => Duration::from_nanos(value),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pd(seconds: i64, nanos: i32) -> Option<prost_types::Duration> {
        Some(prost_types::Duration { seconds, nanos })
    }

    /// Sub-millisecond parts round up; zero and absent mean none; negatives are rejected.
    #[test]
    fn millis_rounding_and_sign() {
        assert_eq!(
            millis("ttl", pd(1, 1)).unwrap(),
            Some(Duration::from_millis(1001))
        );
        assert_eq!(millis("ttl", pd(0, 0)).unwrap(), None);
        assert_eq!(millis("ttl", None).unwrap(), None);
        assert!(millis("ttl", pd(i64::MAX, 0)).is_err());
        // Negative durations, whichever field carries the sign, are said to be negative.
        for negative in [pd(-1, 0), pd(0, -5), pd(-1, -5)] {
            let err = millis("ttl", negative).unwrap_err().to_string();
            assert_eq!(err, "ttl: must not be negative");
        }
        // Nanos out of range, or of another sign than the seconds: malformed, and the message
        // says which.
        for (malformed, why) in [
            (pd(1, -5), "seconds 1 and nanos -5 have opposite signs"),
            (pd(-1, 1), "seconds -1 and nanos 1 have opposite signs"),
            (
                pd(0, 1_000_000_000),
                "nanos 1000000000 is outside -999999999 to 999999999",
            ),
            (
                pd(1, -1_000_000_000),
                "nanos -1000000000 is outside -999999999 to 999999999",
            ),
        ] {
            let err = millis("ttl", malformed).unwrap_err().to_string();
            assert_eq!(err, format!("ttl: is not a well-formed Duration: {why}"));
        }
    }

    /// Bounds are inclusive and the error names the field.
    #[test]
    fn bounded_names_field() {
        let min = Duration::from_millis(10);
        let max = Duration::from_secs(3600);
        assert_eq!(bounded("ttl", pd(0, 10_000_000), min, max).unwrap(), min);
        assert_eq!(bounded("ttl", pd(3600, 0), min, max).unwrap(), max);
        let err = bounded("ttl", pd(3600, 1), min, max).unwrap_err();
        assert!(err.to_string().starts_with("ttl: "), "{err}");
        assert!(bounded("ttl", None, min, max).is_err());
        // Bounds apply to what was sent, not to its value rounded up to the millisecond.
        let err = bounded("ttl", pd(0, 9_999_999), min, max).unwrap_err();
        assert_eq!(
            err.to_string(),
            "ttl: 9ms 999us 999ns is outside 10ms to 1h"
        );
        assert_eq!(
            bounded("ttl", pd(3599, 999_999_999), min, max).unwrap(),
            max
        );
    }

    /// Only the canonical hyphenated UUID form is a token.
    #[test]
    fn token_format() {
        let t = uuid::Uuid::new_v4().hyphenated().to_string();
        assert!(token("token", &t).is_ok());
        assert!(token("token", &t.to_uppercase()).is_err());
        assert!(token("token", &t.replace('-', "")).is_err());
        assert!(token("token", "").is_err());
        assert!(token("token", "not-a-token").is_err());
    }

    /// The grpc-timeout header is parsed in every unit.
    #[test]
    fn deadline_header() {
        let mut m = MetadataMap::new();
        assert_eq!(deadline(&m), None);
        m.insert("grpc-timeout", "250m".parse().unwrap());
        assert_eq!(deadline(&m), Some(Duration::from_millis(250)));
        m.insert("grpc-timeout", "3S".parse().unwrap());
        assert_eq!(deadline(&m), Some(Duration::from_secs(3)));
        m.insert("grpc-timeout", "x".parse().unwrap());
        assert_eq!(deadline(&m), None);
    }
}
