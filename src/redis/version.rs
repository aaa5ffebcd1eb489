//! The oldest Redis Baton works with, checked on every connection it opens for commands.
//!
//! Baton needs Redis 7.0: its Cluster wake-ups use sharded pub/sub (`SPUBLISH`, `SSUBSCRIBE`)
//! and its read-only scripts declare `#!lua flags=no-writes`, both new in 7.0. An older server
//! would fail some calls with errors that name neither, so it is refused up front.

/// The oldest Redis version Baton works with: (major, minor).
pub const REQUIRED: (u32, u32) = (7, 0);

/// The `redis_version` an `INFO server` reply reports: (major, minor, patch), missing parts 0.
/// `None` when the field is absent or not a version.
pub fn reported(info: &str) -> Option<(u32, u32, u32)> {
    let text = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))?
        .trim();
    let mut parts = text.split('.').map(|p| {
        // Tolerate suffixes such as "7.2.4-rc1".
        let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<u32>().ok()
    });
    let major = parts.next()??;
    let minor = parts.next().flatten().unwrap_or(0);
    let patch = parts.next().flatten().unwrap_or(0);
    Some((major, minor, patch))
}

/// Why the server that answered `info` (an `INFO server` reply) at `addr` cannot be used, or
/// `None` when it is recent enough. A reply without a readable version is accepted: Redis
/// derivatives and proxies may leave the field out, and the calls themselves then tell.
pub fn refusal(info: &str, addr: &str) -> Option<String> {
    let (major, minor, patch) = reported(info)?;
    if (major, minor) >= REQUIRED {
        return None;
    }
    Some(format!(
        "Redis {major}.{minor}.{patch} at {addr} is too old: Baton needs Redis {}.{} or later \
         (sharded pub/sub and script flags)",
        REQUIRED.0, REQUIRED.1
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The version is read from the `redis_version` line, whatever surrounds it.
    #[test]
    fn reads_redis_version() {
        let info = "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\n";
        assert_eq!(reported(info), Some((7, 0, 15)));
        assert_eq!(reported("redis_version:8.2\n"), Some((8, 2, 0)));
        assert_eq!(reported("redis_version:7.2.4-rc1\n"), Some((7, 2, 4)));
        assert_eq!(reported("redis_mode:standalone\n"), None);
        assert_eq!(reported("redis_version:unknown\n"), None);
    }

    /// 7.0 and later are accepted; 6.x and older are refused with a message naming the version,
    /// the server and what is needed; a reply without a version is accepted.
    #[test]
    fn refuses_servers_older_than_7_0() {
        assert_eq!(refusal("redis_version:7.0.0\r\n", "h:1"), None);
        assert_eq!(refusal("redis_version:7.4.2\r\n", "h:1"), None);
        assert_eq!(refusal("redis_version:10.0.0\r\n", "h:1"), None);
        assert_eq!(refusal("no version here\r\n", "h:1"), None);
        let refused = refusal("redis_version:6.2.14\r\n", "10.0.0.1:6379").expect("refused");
        assert!(refused.contains("6.2.14"), "{refused}");
        assert!(refused.contains("10.0.0.1:6379"), "{refused}");
        assert!(refused.contains("7.0 or later"), "{refused}");
        assert!(refusal("redis_version:5.0.7\r\n", "h:1").is_some());
    }
}
