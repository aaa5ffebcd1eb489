//! The domain error shared by every service, and its one mapping to gRPC status codes.

use std::time::Duration;

use bb8_redis::redis::{ErrorKind, RedisError};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// How long a caller is told to wait before retrying after Redis was unreachable.
pub const UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_millis(200);

/// A duration for messages: whole days, hours, minutes or seconds in words ("1 day", "365 days",
/// "10 minutes"), anything finer as humantime writes it (humantime would say
/// `11months 30days 3h 50m 24s` for 365 days).
pub fn in_words(d: Duration) -> String {
    let secs = d.as_secs();
    if d.subsec_nanos() != 0 || secs == 0 {
        return humantime::format_duration(d).to_string();
    }
    let (n, unit) = [(86_400, "day"), (3_600, "hour"), (60, "minute")]
        .into_iter()
        .find(|(size, _)| secs.is_multiple_of(*size))
        .map_or((secs, "second"), |(size, unit)| (secs / size, unit));
    format!("{n} {unit}{}", if n == 1 { "" } else { "s" })
}

/// The proto name of a request field (`ttl`, `terms[3].score`), as errors report it.
pub type Field = std::borrow::Cow<'static, str>;

/// Why a request failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// A request field is missing, empty, too large or out of range.
    #[error("{field}: {reason}")]
    InvalidArgument {
        /// The field's name as written in the proto.
        field: Field,
        /// What is wrong with it.
        reason: String,
    },
    /// The request is well formed but the state does not allow it (e.g. a lease no longer held).
    #[error("{0}")]
    FailedPrecondition(String),
    /// Redis could not be reached (no connection, a refusal); nothing was changed by this call.
    #[error("redis unavailable: {0}")]
    Unavailable(String),
    /// The call was sent but its answer never came (no answer in time, the connection lost after
    /// the call was written): Redis may have run it, or may still run it later (a paused server
    /// runs what waits in its input buffers when it resumes). Reported as `UNAVAILABLE`.
    #[error("redis unavailable: {0}")]
    Unanswered(String),
    /// Baton is shutting down and takes no new work.
    #[error("baton is shutting down")]
    ShuttingDown,
    /// The caller went away (cancelled the call or disconnected) before the work finished.
    #[error("the caller cancelled the request")]
    Cancelled,
    /// The answer could not reach the caller before its deadline; what the call did was undone.
    #[error("{0}")]
    DeadlineExceeded(String),
    /// A bound on what one caller may hold was reached (e.g. holds of one lease).
    #[error("{0}")]
    ResourceExhausted(String),
    /// Something that should not happen (an unexpected Redis reply, a script error).
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// An `InvalidArgument` error for `field`.
    pub fn invalid(field: impl Into<Field>, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Codes of Redis error replies that mean "not now", never "never": the call changed nothing and
/// may succeed when retried, so they are reported UNAVAILABLE with a retry delay.
///
/// - `LOADING`: the server is loading its dataset after a restart.
/// - `BUSY`: a script has run longer than `busy-reply-threshold` and blocks the server.
/// - `OOM`: `maxmemory` is reached and the eviction policy frees nothing for this write.
/// - `NOREPLICAS`: fewer replicas than `min-replicas-to-write` are connected.
/// - `MISCONF`: the server refuses writes because it cannot persist (`stop-writes-on-bgsave-error`).
/// - `NOAUTH`, `WRONGPASS`, `NOPERM`: the password or ACL changed under a running Baton (a
///   rotation); they last until Baton's credentials and the server's agree again.
/// - `READONLY`, `MASTERDOWN`: the node is (or follows) a replica, during a failover.
/// - `TRYAGAIN`, `CLUSTERDOWN`, `MOVED`, `ASK`: a Cluster resharding or failover in progress
///   (answered after Baton's own retries and redirections ran out).
pub const RETRYABLE_REDIS_CODES: &[&str] = &[
    "LOADING",
    "BUSY",
    "OOM",
    "NOREPLICAS",
    "MISCONF",
    "NOAUTH",
    "WRONGPASS",
    "NOPERM",
    "READONLY",
    "MASTERDOWN",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "MOVED",
    "ASK",
];

/// Whether a Redis error is worth retrying (see [`RETRYABLE_REDIS_CODES`]): connection trouble,
/// a refused or failed authentication, Sentinels that cannot name a master, or one of the codes.
pub fn retryable(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
        || matches!(
            e.kind(),
            ErrorKind::AuthenticationFailed
                | ErrorKind::ClusterConnectionNotFound
                | ErrorKind::MasterNameNotFoundBySentinel
                | ErrorKind::NoValidReplicasFoundBySentinel
        )
        || e.code()
            .is_some_and(|code| RETRYABLE_REDIS_CODES.contains(&code))
        || denied_in_script(e)
}

/// How Redis words an ACL refusal met inside a script (a plain `ERR`, where a command sent
/// directly gets `NOPERM`): Baton's Redis user lacks a command, key or channel a script needs.
pub const SCRIPT_ACL_DENIAL: &str = "The user executing the script can't";

/// Whether `e` is an ACL refusal met inside a script (see [`SCRIPT_ACL_DENIAL`]): a setting to
/// fix in Redis, reported like `NOPERM`.
fn denied_in_script(e: &RedisError) -> bool {
    e.code() == Some("ERR") && e.detail().is_some_and(|d| d.contains(SCRIPT_ACL_DENIAL))
}

/// A Redis error as the cause of a failed call: an error reply as Redis wrote it (`CODE detail`),
/// anything else as redis-rs describes it.
pub fn describe(e: &RedisError) -> String {
    if e.kind() == ErrorKind::AuthenticationFailed {
        // redis-rs keeps only its own words for a refused AUTH; Redis answered WRONGPASS.
        return "WRONGPASS: Redis refused Baton's user name and password (changed since they were \
                configured?)"
            .to_owned();
    }
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) if e.kind() != ErrorKind::Parse => format!("{code} {detail}"),
        (Some(code), None) => code.to_owned(),
        _ => e.to_string(),
    }
}

impl From<RedisError> for Error {
    fn from(e: RedisError) -> Self {
        if retryable(&e) {
            Self::Unavailable(describe(&e))
        } else {
            Self::Internal(describe(&e))
        }
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Self {
        let message = e.to_string();
        match e {
            Error::InvalidArgument { field, reason } => {
                let details = ErrorDetails::with_bad_request_violation(field, reason);
                Status::with_error_details(Code::InvalidArgument, message, details)
            }
            Error::FailedPrecondition(_) => Status::failed_precondition(message),
            Error::Unavailable(_) | Error::Unanswered(_) | Error::ShuttingDown => {
                let details = ErrorDetails::with_retry_info(Some(UNAVAILABLE_RETRY_AFTER));
                Status::with_error_details(Code::Unavailable, message, details)
            }
            Error::Cancelled => Status::cancelled(message),
            Error::DeadlineExceeded(_) => Status::deadline_exceeded(message),
            Error::ResourceExhausted(_) => Status::resource_exhausted(message),
            Error::Internal(_) => Status::internal(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Durations are said in words a person reads: whole units as words, finer ones as
    /// humantime writes them.
    #[test]
    fn durations_in_words() {
        assert_eq!(in_words(Duration::from_secs(86_400)), "1 day");
        assert_eq!(in_words(Duration::from_secs(365 * 86_400)), "365 days");
        assert_eq!(in_words(Duration::from_secs(600)), "10 minutes");
        assert_eq!(in_words(Duration::from_secs(7_200)), "2 hours");
        assert_eq!(in_words(Duration::from_secs(90)), "90 seconds");
        assert_eq!(in_words(Duration::from_millis(1_500)), "1s 500ms");
    }

    /// Invalid arguments name the field in the message and in a BadRequest detail.
    #[test]
    fn invalid_argument_names_field() {
        let status = Status::from(Error::invalid("ttl", "must be at least 10ms"));
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().starts_with("ttl: "));
        let details = status.get_error_details();
        let bad = details.bad_request().expect("bad request detail");
        assert_eq!(bad.field_violations[0].field, "ttl");
    }

    /// The Redis error of a reply written as Redis writes it (`-CODE detail`).
    fn reply_error(reply: &str) -> RedisError {
        bb8_redis::redis::parse_redis_value(format!("-{reply}\r\n").as_bytes())
            .and_then(|v| v.extract_error())
            .expect_err("an error reply")
    }

    /// The replies that mean "not now" become UNAVAILABLE with the reply as the cause; script
    /// errors and unknown codes stay INTERNAL.
    #[test]
    fn retryable_replies_are_unavailable() {
        for reply in [
            "NOREPLICAS Not enough good replicas to write.",
            "OOM command not allowed when used memory > 'maxmemory'. script: abc, on @user_script:80.",
            "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
            "NOAUTH Authentication required.",
            "WRONGPASS invalid username-password pair or user is disabled.",
            "LOADING Redis is loading the dataset in memory",
            "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
            "READONLY You can't write against a read only replica.",
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "CLUSTERDOWN The cluster is down",
            "MOVED 3999 127.0.0.1:6381",
            "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
            "ERR The user executing the script can't run this command or subcommand script: abc, on @user_script:540.",
        ] {
            match Error::from(reply_error(reply)) {
                Error::Unavailable(cause) => assert_eq!(cause, reply),
                other => panic!("{reply}: {other:?}"),
            }
        }
        for reply in [
            "ERR Error running script (call to f_abc): @user_script:1: boom",
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            "NOSCRIPT No matching script.",
        ] {
            assert!(
                matches!(Error::from(reply_error(reply)), Error::Internal(ref c) if c == reply),
                "{reply}"
            );
        }
    }

    /// A refused AUTH (which redis-rs reports without Redis's words) is UNAVAILABLE and says so.
    #[test]
    fn refused_credentials_are_unavailable() {
        let e = RedisError::from((
            ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        ));
        assert!(matches!(Error::from(e), Error::Unavailable(ref c) if c.contains("WRONGPASS")));
    }

    /// Redis trouble maps to UNAVAILABLE with retry info.
    #[test]
    fn unavailable_carries_retry_info() {
        let status = Status::from(Error::Unavailable("connection refused".into()));
        assert_eq!(status.code(), Code::Unavailable);
        let details = status.get_error_details();
        let retry = details.retry_info().expect("retry info");
        assert_eq!(retry.retry_delay, Some(UNAVAILABLE_RETRY_AFTER));
    }
}
