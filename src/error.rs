//! The domain error shared by every service, and its one mapping to gRPC status codes.

use std::time::Duration;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// How long a caller is told to wait before retrying after Redis was unreachable.
pub const UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_millis(200);

/// Why a request failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// A request field is missing, empty, too large or out of range.
    #[error("{field}: {reason}")]
    InvalidArgument {
        /// The field's name as written in the proto.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The request is well formed but the state does not allow it (e.g. a lease no longer held).
    #[error("{0}")]
    FailedPrecondition(String),
    /// Redis did not answer in time or refused the connection; nothing was changed by this call.
    #[error("redis unavailable: {0}")]
    Unavailable(String),
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
    pub fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field,
            reason: reason.into(),
        }
    }
}

impl From<bb8_redis::redis::RedisError> for Error {
    fn from(e: bb8_redis::redis::RedisError) -> Self {
        if e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.is_unrecoverable_error()
        {
            Self::Unavailable(e.to_string())
        } else {
            match e.kind() {
                bb8_redis::redis::ErrorKind::Server(
                    bb8_redis::redis::ServerErrorKind::BusyLoading
                    | bb8_redis::redis::ServerErrorKind::TryAgain
                    | bb8_redis::redis::ServerErrorKind::ClusterDown
                    | bb8_redis::redis::ServerErrorKind::MasterDown
                    | bb8_redis::redis::ServerErrorKind::ReadOnly,
                ) => Self::Unavailable(e.to_string()),
                _ => Self::Internal(e.to_string()),
            }
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
            Error::Unavailable(_) | Error::ShuttingDown => {
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
