//! One-shot calls: `describe`, `ratelimit check`, `complete`, `health`; text for people,
//! `--json` for scripts.

use std::time::Duration;

use serde_json::{Value, json};
use tonic::{Code, Request};
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use super::{
    Algorithm, ClientArgs, CompleteArgs, DescribeArgs, DescribeKind, EXIT_NO, Failure, HealthArgs,
    MatchMode, RateLimitCheckArgs, connect, proto_duration, std_duration,
};
use crate::proto::v1::{
    AutocompleteMatchKind, AutocompleteMatchMode, AutocompleteOrder,
    AutocompleteServiceCompleteRequest, LockMode, LockServiceDescribeRequest, RateLimitAlgorithm,
    RateLimitDecidedBy, RateLimitServiceCheckRequest, SemaphoreServiceDescribeRequest,
    autocomplete_service_client::AutocompleteServiceClient, lock_service_client::LockServiceClient,
    rate_limit_service_client::RateLimitServiceClient,
    semaphore_service_client::SemaphoreServiceClient,
};

/// A request with the command's deadline.
pub(super) fn request<T>(message: T, client: &ClientArgs) -> Request<T> {
    let mut request = Request::new(message);
    request.set_timeout(client.timeout);
    request
}

/// Seconds with millisecond precision, for JSON.
pub(super) fn secs(d: Option<Duration>) -> Value {
    d.map_or(Value::Null, |d| json!(d.as_millis() as f64 / 1000.0))
}

/// A duration for people, e.g. `9.87s`.
pub(super) fn human(d: Option<Duration>) -> String {
    d.map_or_else(
        || "-".to_owned(),
        |d| format!("{:.3}s", d.as_millis() as f64 / 1000.0),
    )
}

pub(super) fn print(json_output: bool, value: &Value, text: &str) {
    if json_output {
        outln!("{value}");
    } else {
        outln!("{text}");
    }
}

/// Runs `baton describe`.
pub async fn describe(args: DescribeArgs) -> Result<u8, Failure> {
    let channel = connect(&args.client).await?;
    let addr = &args.client.addr;
    match args.kind {
        DescribeKind::Lock => {
            let state = LockServiceClient::new(channel)
                .describe(request(
                    LockServiceDescribeRequest {
                        name: args.name.clone(),
                    },
                    &args.client,
                ))
                .await
                .map_err(|s| Failure::from_status(&s, addr))?
                .into_inner();
            let mode = match state.mode() {
                LockMode::Exclusive => "exclusive",
                LockMode::Shared => "shared",
                LockMode::Unspecified => "",
            };
            let remaining = std_duration(state.remaining_ttl.as_ref());
            let earliest = state.earliest_shared_holder.as_ref().map(|h| {
                json!({
                    "owner": h.owner,
                    "hold_count": h.hold_count,
                    "remaining_ttl": secs(std_duration(h.remaining_ttl.as_ref())),
                    "fencing_token": h.fencing_token,
                })
            });
            let value = json!({
                "name": args.name,
                "held": state.held,
                "mode": mode,
                "owner": state.owner,
                "remaining_ttl": secs(remaining),
                "hold_count": state.hold_count,
                "fencing_token": state.fencing_token,
                "waiters": state.waiters,
                "queued": state.queued,
                "shared_holders": state.shared_holders,
                "earliest_shared_holder": earliest,
            });
            let text = if !state.held {
                format!(
                    "lock {:?}: free (latest fencing token {}, {} waiting)",
                    args.name, state.fencing_token, state.waiters
                )
            } else if state.mode() == LockMode::Shared {
                format!(
                    "lock {:?}: held shared by {} holders, {} left, latest fencing token {}, {} waiting",
                    args.name,
                    state.shared_holders,
                    human(remaining),
                    state.fencing_token,
                    state.waiters
                )
            } else {
                let owner = if state.owner.is_empty() {
                    "an anonymous holder".to_owned()
                } else {
                    format!("{:?}", state.owner)
                };
                format!(
                    "lock {:?}: held exclusive by {owner} ({} holds), {} left, fencing token {}, {} waiting",
                    args.name,
                    state.hold_count,
                    human(remaining),
                    state.fencing_token,
                    state.waiters
                )
            };
            print(args.json, &value, &text);
        }
        DescribeKind::Semaphore => {
            let state = SemaphoreServiceClient::new(channel)
                .describe(request(
                    SemaphoreServiceDescribeRequest {
                        name: args.name.clone(),
                    },
                    &args.client,
                ))
                .await
                .map_err(|s| Failure::from_status(&s, addr))?
                .into_inner();
            let holders: Vec<Value> = state
                .holders
                .iter()
                .map(|h| {
                    json!({
                        "owner": h.owner,
                        "permits": h.permits,
                        "limit": h.limit,
                        "remaining_ttl": secs(std_duration(h.remaining_ttl.as_ref())),
                        "fencing_token": h.fencing_token,
                    })
                })
                .collect();
            let value = json!({
                "name": args.name,
                "limit": state.limit,
                "permits_in_use": state.permits_in_use,
                "holder_count": state.holder_count,
                "holders": holders,
                "waiters": state.waiters,
                "fencing_token": state.fencing_token,
            });
            let mut text = format!(
                "semaphore {:?}: {} of {} permits in use by {} holders, {} waiting, latest fencing token {}",
                args.name,
                state.permits_in_use,
                state.limit,
                state.holder_count,
                state.waiters,
                state.fencing_token
            );
            for h in &state.holders {
                let owner = if h.owner.is_empty() { "-" } else { &h.owner };
                text.push_str(&format!(
                    "\n  {owner}: {} permits, {} left, fencing token {}",
                    h.permits,
                    human(std_duration(h.remaining_ttl.as_ref())),
                    h.fencing_token
                ));
            }
            print(args.json, &value, &text);
        }
    }
    Ok(0)
}

/// Runs `baton ratelimit check`: exit 0 when allowed, 1 when denied.
pub async fn ratelimit_check(args: RateLimitCheckArgs) -> Result<u8, Failure> {
    let channel = connect(&args.client).await?;
    let algorithm = match args.algorithm {
        Algorithm::Gcra => RateLimitAlgorithm::Gcra,
        Algorithm::FixedWindow => RateLimitAlgorithm::FixedWindow,
        Algorithm::SlidingWindow => RateLimitAlgorithm::SlidingWindow,
    };
    let answer = RateLimitServiceClient::new(channel)
        .check(request(
            RateLimitServiceCheckRequest {
                key: args.key.clone(),
                limit: args.limit,
                period: Some(proto_duration(args.period)),
                cost: args.cost,
                algorithm: algorithm.into(),
                burst: args.burst,
            },
            &args.client,
        ))
        .await
        .map_err(|s| Failure::from_status(&s, &args.client.addr))?
        .into_inner();
    let decided_by = match answer.decided_by() {
        RateLimitDecidedBy::Redis | RateLimitDecidedBy::Unspecified => "redis",
        RateLimitDecidedBy::FailOpen => "fail_open",
        RateLimitDecidedBy::FailClosed => "fail_closed",
    };
    let retry_after = std_duration(answer.retry_after.as_ref());
    let reset_after = std_duration(answer.reset_after.as_ref());
    let value = json!({
        "key": args.key,
        "allowed": answer.allowed,
        "limit": answer.limit,
        "remaining": answer.remaining,
        "retry_after": secs(retry_after),
        "reset_after": secs(reset_after),
        "decided_by": decided_by,
    });
    let text = if answer.allowed {
        format!(
            "allowed: {} of {} left, full again in {} (decided by {decided_by})",
            answer.remaining,
            answer.limit,
            human(reset_after)
        )
    } else {
        format!(
            "denied: retry after {}, {} of {} left (decided by {decided_by})",
            human(retry_after),
            answer.remaining,
            answer.limit
        )
    };
    print(args.json, &value, &text);
    Ok(if answer.allowed { 0 } else { EXIT_NO })
}

/// A display text on one line of a terminal: control characters (C0, DEL, C1) and the Unicode
/// line and paragraph separators escaped, as `\n`, `\r`, `\t`, `\x1b`, `\u{85}`,
/// `\u{2028}`, so that each suggestion is one line and none can drive the terminal. Other text,
/// backslashes included, is printed as it is (`--json` gives the exact text).
pub(super) fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    let escaped = |c: char| c.is_control() || c == '\u{2028}' || c == '\u{2029}';
    if !text.chars().any(escaped) {
        return text.into();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if escaped(c) && u32::from(c) < 0x80 => {
                out.push_str(&format!("\\x{:02x}", u32::from(c)));
            }
            c if escaped(c) => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.into()
}

/// Runs `baton complete`: one suggestion per line (control characters escaped).
pub async fn complete(args: CompleteArgs) -> Result<u8, Failure> {
    let channel = connect(&args.client).await?;
    let mode = match args.mode {
        MatchMode::Prefix => AutocompleteMatchMode::Prefix,
        MatchMode::WordPrefix => AutocompleteMatchMode::WordPrefix,
        MatchMode::Suffix => AutocompleteMatchMode::Suffix,
        MatchMode::Contains => AutocompleteMatchMode::Contains,
        MatchMode::Automatic => AutocompleteMatchMode::Automatic,
        MatchMode::Fuzzy => AutocompleteMatchMode::Fuzzy,
    };
    let order = if args.by_score {
        AutocompleteOrder::Score
    } else {
        AutocompleteOrder::Lexicographic
    };
    let page = AutocompleteServiceClient::new(channel)
        .complete(request(
            AutocompleteServiceCompleteRequest {
                dictionary: args.dictionary.clone(),
                query: args.query.clone(),
                limit: args.limit,
                mode: mode.into(),
                order: order.into(),
                page_token: args.page_token.clone(),
                max_edits: args.max_edits,
            },
            &args.client,
        ))
        .await
        .map_err(|s| Failure::from_status(&s, &args.client.addr))?
        .into_inner();
    let kind = |k: AutocompleteMatchKind| {
        k.as_str_name()
            .trim_start_matches("AUTOCOMPLETE_MATCH_KIND_")
            .to_lowercase()
    };
    let suggestions: Vec<Value> = page
        .suggestions
        .iter()
        .map(|s| {
            json!({
                "display": s.display,
                "score": s.score,
                "match": kind(s.match_kind()),
                "edit_distance": s.edit_distance,
            })
        })
        .collect();
    let value = json!({
        "suggestions": suggestions,
        "next_page_token": page.next_page_token,
        "incomplete": page.incomplete,
    });
    let text = page
        .suggestions
        .iter()
        .map(|s| escape_controls(&s.display))
        .collect::<Vec<_>>()
        .join("\n");
    if args.json {
        outln!("{value}");
    } else {
        if !text.is_empty() {
            outln!("{text}");
        }
        // Standard output holds the suggestions alone; what else a shell user needs goes aside.
        if !page.next_page_token.is_empty() {
            noteln!("next page: --page-token={}", page.next_page_token);
        }
        if page.incomplete {
            noteln!("incomplete: Baton stopped at its work budget; more matches may exist");
        }
    }
    Ok(0)
}

/// Runs `baton health`: exit 0 when SERVING, 1 otherwise.
pub async fn health(args: HealthArgs) -> Result<u8, Failure> {
    let channel = connect(&args.client).await?;
    let answer = HealthClient::new(channel)
        .check(request(
            HealthCheckRequest {
                service: args.service.clone(),
            },
            &args.client,
        ))
        .await;
    let status = match answer {
        Ok(answer) => answer.into_inner().status().as_str_name(),
        // A service Baton does not serve is a "no", like one that is not serving.
        Err(s) if s.code() == Code::NotFound => "SERVICE_UNKNOWN",
        Err(s) => return Err(Failure::from_status(&s, &args.client.addr)),
    };
    let value = json!({"service": args.service, "status": status});
    print(args.json, &value, &format!("{}: {status}", args.service));
    Ok(if status == "SERVING" { 0 } else { EXIT_NO })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Control characters are escaped, so that a suggestion is one line that cannot drive the
    /// terminal; other text is left alone.
    #[test]
    fn controls_are_escaped() {
        assert_eq!(escape_controls("Zoë \\ x"), "Zoë \\ x");
        assert_eq!(
            escape_controls("a\nb\r\tc\u{1b}[31m\u{7f}\u{85}\u{9b}\u{2028}"),
            "a\\nb\\r\\tc\\x1b[31m\\x7f\\u{85}\\u{9b}\\u{2028}"
        );
    }
}
