//! The rules of Envoy's rate limit API: domains of nested descriptors with limits, read from YAML
//! in envoyproxy/ratelimit's format, plus window lengths of any size (`period`), the algorithm per
//! rule (`algorithm`, `burst`), and `shadow_mode`.
//!
//! A request's descriptor (a list of key/value entries) matches a rule by walking the tree one
//! entry at a time: at each level an entry matches a rule with the same key and value first, then
//! one whose value ends in `*` and is a prefix of the entry's value (first in file order), then
//! one with the same key and no value (every value gets its own limit). The limit applies only
//! when the descriptor's last entry lands on a rule that has one, as in envoyproxy/ratelimit.

use std::{
    collections::{HashMap, HashSet},
    fmt::Write as _,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use serde::Deserialize;

use super::{Algorithm, MAX_LIMIT, Rate, RateField};

/// Longest domain, in bytes.
pub const MAX_DOMAIN_BYTES: usize = 256;
/// Longest descriptor key or value, in bytes.
pub const MAX_ENTRY_BYTES: usize = 1024;
/// Most entries in one descriptor (and deepest nesting of rules).
pub const MAX_ENTRIES: usize = 16;
/// Most descriptors in one request.
pub const MAX_DESCRIPTORS: usize = 64;
/// Largest rules file.
const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// The time unit of a limit, as Envoy's API names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// One second.
    Second,
    /// 60 seconds.
    Minute,
    /// 3600 seconds.
    Hour,
    /// 86400 seconds.
    Day,
    /// 7 days.
    Week,
    /// 30 days.
    Month,
    /// 365 days.
    Year,
    /// A period that is none of the above (set with `period`).
    Other,
}

impl Unit {
    /// The unit named in a rules file (case-insensitive), as envoyproxy/ratelimit accepts them.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name.to_ascii_lowercase().as_str() {
            "second" => Self::Second,
            "minute" => Self::Minute,
            "hour" => Self::Hour,
            "day" => Self::Day,
            "week" => Self::Week,
            "month" => Self::Month,
            "year" => Self::Year,
            _ => return None,
        })
    }

    /// The unit's length; `None` for [`Unit::Other`].
    pub fn period(self) -> Option<Duration> {
        let secs = match self {
            Self::Second => 1,
            Self::Minute => 60,
            Self::Hour => 3600,
            Self::Day => 86_400,
            Self::Week => 7 * 86_400,
            Self::Month => 30 * 86_400,
            Self::Year => 365 * 86_400,
            Self::Other => return None,
        };
        Some(Duration::from_secs(secs))
    }

    /// The unit whose length is exactly `period`, or [`Unit::Other`].
    pub fn of(period: Duration) -> Self {
        [
            Self::Second,
            Self::Minute,
            Self::Hour,
            Self::Day,
            Self::Week,
            Self::Month,
            Self::Year,
        ]
        .into_iter()
        .find(|u| u.period() == Some(period))
        .unwrap_or(Self::Other)
    }
}

/// What a rule allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Quota {
    /// Never limited (`unlimited: true`).
    Unlimited,
    /// Nothing at all (`requests_per_unit: 0`): every request is over the limit.
    Blocked {
        /// The unit the rule was written with.
        unit: Unit,
    },
    /// A limit enforced in Redis.
    Limited {
        /// The limit.
        rate: Rate,
        /// The unit the rule was written with (or the unit equal to its period).
        unit: Unit,
    },
}

/// One rule: the limit of a descriptor path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// What it allows.
    pub quota: Quota,
    /// Its `rate_limit.name`, possibly empty; reported as the limit's name.
    pub name: String,
    /// Names of the limits this one replaces when both match one request.
    pub replaces: Vec<String>,
    /// Over the limit is reported (in the response's dynamic metadata) but allowed.
    pub shadow: bool,
    /// Where the rule was written, for logs (`domain.key_value.key`).
    pub path: String,
}

#[derive(Debug, Default)]
struct Node {
    rule: Option<Arc<Rule>>,
    exact: HashMap<String, HashMap<String, Node>>,
    prefixes: Vec<(String, String, Node)>,
    any: HashMap<String, Node>,
}

impl Node {
    fn has_children(&self) -> bool {
        !self.exact.is_empty() || !self.prefixes.is_empty() || !self.any.is_empty()
    }

    fn next(&self, key: &str, value: &str) -> Option<&Node> {
        self.exact
            .get(key)
            .and_then(|values| values.get(value))
            .or_else(|| {
                self.prefixes
                    .iter()
                    .find(|(k, prefix, _)| k == key && value.starts_with(prefix.as_str()))
                    .map(|(_, _, node)| node)
            })
            .or_else(|| self.any.get(key))
    }
}

/// Every domain's rules. Cheap to share behind an `Arc`.
#[derive(Debug, Default)]
pub struct Rules {
    domains: HashMap<String, Node>,
    sources: Vec<PathBuf>,
}

impl Rules {
    /// Whether `domain` has rules.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The domains configured, sorted.
    pub fn domains(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.domains.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// The files the rules were read from.
    pub fn sources(&self) -> &[PathBuf] {
        &self.sources
    }

    /// The rule whose limit applies to a descriptor with `entries` in `domain`, if any.
    pub fn find<'a>(
        &self,
        domain: &str,
        entries: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
    ) -> Option<Arc<Rule>> {
        let mut level = self.domains.get(domain)?;
        let last = entries.len().checked_sub(1)?;
        for (i, (key, value)) in entries.enumerate() {
            let next = level.next(key, value)?;
            if i == last {
                return next.rule.clone();
            }
            if !next.has_children() {
                return None;
            }
            level = next;
        }
        None
    }

    /// Reads the rules in `path`: a YAML file (one domain per document, `---` between them), or a
    /// directory whose `*.yaml` and `*.yml` files are read in name order. Returns every problem
    /// found, one line each, naming the file, the domain and the setting.
    pub fn load(path: &Path) -> Result<Self, Vec<String>> {
        Self::from_files(path, &read_all(path)?)
    }

    /// Rules from the files [`read_all`] returned for `path`.
    pub fn from_files(path: &Path, files: &[(PathBuf, String)]) -> Result<Self, Vec<String>> {
        let mut errors = Vec::new();
        let mut rules = Self::default();
        for (file, text) in files {
            rules.add_text(&file.display().to_string(), text, &mut errors);
            rules.sources.push(file.clone());
        }
        if rules.domains.is_empty() && errors.is_empty() {
            errors.push(format!("{}: no domain is configured", path.display()));
        }
        if errors.is_empty() {
            Ok(rules)
        } else {
            Err(errors)
        }
    }

    /// Rules from YAML text, as [`Rules::load`] reads a file named `origin`.
    pub fn from_yaml(origin: &str, text: &str) -> Result<Self, Vec<String>> {
        let mut errors = Vec::new();
        let mut rules = Self::default();
        rules.add_text(origin, text, &mut errors);
        if errors.is_empty() {
            Ok(rules)
        } else {
            Err(errors)
        }
    }

    fn add_text(&mut self, origin: &str, text: &str, errors: &mut Vec<String>) {
        for (n, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
            let root = match YamlRoot::deserialize(document) {
                Ok(root) => root,
                Err(e) => {
                    errors.push(format!("{origin}: document {}: {e}", n + 1));
                    continue;
                }
            };
            let domain = root.domain.clone();
            let at = format!("{origin}: domain {domain:?}");
            if domain.is_empty() || domain.len() > MAX_DOMAIN_BYTES {
                errors.push(format!(
                    "{at}: domain must be 1 to {MAX_DOMAIN_BYTES} bytes"
                ));
                continue;
            }
            if self.domains.contains_key(&domain) {
                errors.push(format!("{at}: the domain is configured twice"));
                continue;
            }
            let mut node = Node::default();
            let mut problems = Vec::new();
            add_descriptors(
                &mut node,
                &root.descriptors,
                "descriptors",
                &domain,
                1,
                &mut problems,
            );
            errors.extend(problems.into_iter().map(|p| format!("{at}: {p}")));
            self.domains.insert(domain, node);
        }
    }
}

/// The path and text of every rules file at `path` (a file, or a directory's `*.yaml` and `*.yml`
/// files in name order).
pub fn read_all(path: &Path) -> Result<Vec<(PathBuf, String)>, Vec<String>> {
    let files = files(path).map_err(|e| vec![e])?;
    let mut errors = Vec::new();
    let mut texts = Vec::new();
    for file in files {
        match read(&file) {
            Ok(text) => texts.push((file, text)),
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        Ok(texts)
    } else {
        Err(errors)
    }
}

fn files(path: &Path) -> Result<Vec<PathBuf>, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let entries = std::fs::read_dir(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: {e}", path.display()))?;
        let file = entry.path();
        let yaml = file
            .extension()
            .is_some_and(|ext| ext == "yaml" || ext == "yml");
        if yaml && file.is_file() {
            files.push(file);
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(format!(
            "{}: the directory has no .yaml or .yml file",
            path.display()
        ));
    }
    Ok(files)
}

fn read(file: &Path) -> Result<String, String> {
    let size = std::fs::metadata(file)
        .map_err(|e| format!("{}: {e}", file.display()))?
        .len();
    if size > MAX_FILE_BYTES {
        return Err(format!(
            "{}: {size} bytes is larger than {MAX_FILE_BYTES}",
            file.display()
        ));
    }
    std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))
}

fn add_descriptors(
    node: &mut Node,
    descriptors: &[YamlDescriptor],
    at: &str,
    parent_path: &str,
    depth: usize,
    errors: &mut Vec<String>,
) {
    if depth > MAX_ENTRIES && !descriptors.is_empty() {
        errors.push(format!("{at}: rules nest deeper than {MAX_ENTRIES} levels"));
        return;
    }
    for (i, d) in descriptors.iter().enumerate() {
        let at = format!("{at}[{i}]");
        let value = d.value.as_ref().map(Scalar::text).unwrap_or_default();
        if d.key.is_empty() || d.key.len() > MAX_ENTRY_BYTES {
            errors.push(format!("{at}.key: must be 1 to {MAX_ENTRY_BYTES} bytes"));
            continue;
        }
        if value.len() > MAX_ENTRY_BYTES {
            errors.push(format!(
                "{at}.value: is longer than {MAX_ENTRY_BYTES} bytes"
            ));
            continue;
        }
        let mut path = format!("{parent_path}.{}", d.key);
        if !value.is_empty() {
            let _ = write!(path, "_{value}");
        }
        let mut child = Node::default();
        if let Some(limit) = &d.rate_limit {
            match rule(limit, d.shadow_mode, &path) {
                Ok(r) => child.rule = Some(Arc::new(r)),
                Err(e) => errors.push(format!("{at}.rate_limit.{e}")),
            }
        } else if d.shadow_mode {
            errors.push(format!(
                "{at}.shadow_mode: applies only to a rule with a rate_limit"
            ));
        }
        add_descriptors(
            &mut child,
            &d.descriptors,
            &format!("{at}.descriptors"),
            &path,
            depth + 1,
            errors,
        );
        let duplicate = || format!("{at}: duplicate rule for key {:?} value {value:?}", d.key);
        if value.is_empty() {
            if node.any.insert(d.key.clone(), child).is_some() {
                errors.push(duplicate());
            }
        } else if let Some(prefix) = value.strip_suffix('*') {
            if node
                .prefixes
                .iter()
                .any(|(k, p, _)| *k == d.key && p == prefix)
            {
                errors.push(duplicate());
            } else {
                node.prefixes
                    .push((d.key.clone(), prefix.to_owned(), child));
            }
        } else if node
            .exact
            .entry(d.key.clone())
            .or_default()
            .insert(value.clone(), child)
            .is_some()
        {
            errors.push(duplicate());
        }
    }
}

/// Compiles one `rate_limit` block; an error starts with the setting's name.
fn rule(limit: &YamlRateLimit, shadow: bool, path: &str) -> Result<Rule, String> {
    for r in &limit.replaces {
        if r.name.is_empty() {
            return Err("replaces: a name must not be empty".to_owned());
        }
        if r.name == limit.name {
            return Err(format!("replaces: {:?} is this rule's own name", r.name));
        }
    }
    let replaces = limit.replaces.iter().map(|r| r.name.clone()).collect();
    let base = |quota| Rule {
        quota,
        name: limit.name.clone(),
        replaces,
        shadow,
        path: path.to_owned(),
    };
    if limit.unlimited {
        if limit.unit.is_some()
            || limit.period.is_some()
            || limit.requests_per_unit.is_some()
            || limit.algorithm.is_some()
            || limit.burst.is_some()
        {
            return Err(
                "unlimited: an unlimited rule takes no unit, period, requests_per_unit, algorithm or burst"
                    .to_owned(),
            );
        }
        return Ok(base(Quota::Unlimited));
    }
    let (unit, period) = match (&limit.unit, &limit.period) {
        (Some(_), Some(_)) => return Err("period: give either unit or period, not both".into()),
        (None, None) => return Err("unit: required (or period)".to_owned()),
        (Some(name), None) => {
            let unit = Unit::parse(name).ok_or_else(|| {
                format!("unit: {name:?} is not second, minute, hour, day, week, month or year")
            })?;
            (unit, unit.period().unwrap_or(Duration::from_secs(1)))
        }
        (None, Some(text)) => {
            let period = humantime::parse_duration(text)
                .map_err(|e| format!("period: {text:?} is not a duration like 1500ms: {e}"))?;
            (Unit::of(period), period)
        }
    };
    let algorithm = match limit.algorithm.as_deref() {
        None | Some("fixed_window") => Algorithm::AlignedWindow,
        Some("gcra") => Algorithm::Gcra,
        Some("sliding_window") => Algorithm::SlidingWindow,
        Some(other) => {
            return Err(format!(
                "algorithm: {other:?} is not fixed_window, gcra or sliding_window"
            ));
        }
    };
    let Some(requests) = limit.requests_per_unit else {
        return Err("requests_per_unit: required".to_owned());
    };
    if requests > MAX_LIMIT {
        return Err(format!(
            "requests_per_unit: {requests} is more than {MAX_LIMIT}"
        ));
    }
    if requests == 0 {
        // Validate the period and burst anyway, with a limit of 1.
        Rate::new(algorithm, 1, period, limit.burst).map_err(|e| describe(e, limit))?;
        return Ok(base(Quota::Blocked { unit }));
    }
    let rate =
        Rate::new(algorithm, requests, period, limit.burst).map_err(|e| describe(e, limit))?;
    Ok(base(Quota::Limited { rate, unit }))
}

fn describe((field, reason): (RateField, String), limit: &YamlRateLimit) -> String {
    let name = match field {
        RateField::Limit => "requests_per_unit",
        RateField::Period if limit.period.is_some() => "period",
        RateField::Period => "unit",
        RateField::Burst => "burst",
    };
    format!("{name}: {reason}")
}

/// One YAML document: a domain and its rules.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlRoot {
    domain: String,
    #[serde(default)]
    descriptors: Vec<YamlDescriptor>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlDescriptor {
    key: String,
    #[serde(default)]
    value: Option<Scalar>,
    #[serde(default)]
    rate_limit: Option<YamlRateLimit>,
    #[serde(default)]
    descriptors: Vec<YamlDescriptor>,
    #[serde(default)]
    shadow_mode: bool,
    /// Accepted for compatibility; Baton has no per-value metrics.
    #[serde(default)]
    #[allow(dead_code)]
    detailed_metric: bool,
    /// Accepted for compatibility; Baton has no per-value metrics.
    #[serde(default)]
    #[allow(dead_code)]
    value_to_metric: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlRateLimit {
    #[serde(default)]
    requests_per_unit: Option<u64>,
    #[serde(default)]
    unit: Option<String>,
    /// Baton's extension: any window length instead of `unit`.
    #[serde(default)]
    period: Option<String>,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    name: String,
    #[serde(default)]
    replaces: Vec<YamlReplaces>,
    /// Baton's extension: `fixed_window` (default), `gcra` or `sliding_window`.
    #[serde(default)]
    algorithm: Option<String>,
    /// Baton's extension: GCRA's burst (default: requests_per_unit).
    #[serde(default)]
    burst: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlReplaces {
    name: String,
}

/// A YAML scalar used as a descriptor value: `value: 200` means the string "200".
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Scalar {
    Text(String),
    Integer(i64),
    Float(f64),
    Bool(bool),
}

impl Scalar {
    fn text(&self) -> String {
        match self {
            Self::Text(s) => s.clone(),
            Self::Integer(n) => n.to_string(),
            Self::Float(x) => x.to_string(),
            Self::Bool(b) => b.to_string(),
        }
    }
}

/// Plans which limits apply to the descriptors of one request, dropping the limits that another
/// matched limit `replaces`.
pub fn replaced(matched: &[Option<Arc<Rule>>]) -> Vec<bool> {
    let names: HashSet<&str> = matched
        .iter()
        .flatten()
        .flat_map(|r| r.replaces.iter().map(String::as_str))
        .collect();
    matched
        .iter()
        .map(|m| {
            m.as_ref()
                .is_some_and(|r| !r.name.is_empty() && names.contains(r.name.as_str()))
        })
        .collect()
}

/// The name of the limiter of a descriptor in `domain`: every part length-prefixed, so that no
/// two descriptors share a limiter by accident.
pub fn limiter_name<'a>(domain: &str, entries: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let mut name = format!("{}:{domain}", domain.len());
    for (key, value) in entries {
        let _ = write!(name, "/{}:{key}={}:{value}", key.len(), value.len());
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    const YAML: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: path
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 3, name: login}
  - key: path
    value: /api/*
    rate_limit: {period: 1500ms, requests_per_unit: 7, algorithm: gcra, burst: 2}
  - key: tenant
    descriptors:
      - key: plan
        value: free
        rate_limit: {unit: hour, requests_per_unit: 100, name: free, replaces: [{name: login}]}
        shadow_mode: true
      - key: plan
        value: gold
        rate_limit: {unlimited: true}
  - key: blocked
    value: 1
    rate_limit: {unit: day, requests_per_unit: 0}
---
domain: other
"#;

    fn find(rules: &Rules, entries: &[(&str, &str)]) -> Option<Arc<Rule>> {
        rules.find("edge", entries.iter().copied())
    }

    /// Exact, prefix-wildcard and key-only rules match as envoyproxy/ratelimit matches them.
    #[test]
    fn matching() {
        let rules = Rules::from_yaml("test.yaml", YAML).expect("valid rules");
        assert_eq!(rules.domains(), vec!["edge", "other"]);
        let r = find(&rules, &[("remote_address", "10.0.0.1")]).expect("key-only rule");
        assert!(matches!(
            r.quota,
            Quota::Limited {
                unit: Unit::Second,
                ..
            }
        ));
        let r = find(&rules, &[("path", "/login")]).expect("exact rule");
        assert_eq!(r.name, "login");
        let r = find(&rules, &[("path", "/api/users")]).expect("prefix rule");
        match r.quota {
            Quota::Limited { rate, unit } => {
                assert_eq!(unit, Unit::Other);
                assert_eq!(rate.algorithm, Algorithm::Gcra);
                assert_eq!(rate.period, Duration::from_millis(1500));
                assert_eq!(rate.burst, 2);
            }
            ref q => panic!("{q:?}"),
        }
        assert!(find(&rules, &[("path", "/other")]).is_none());
        // The tenant level has no limit of its own; the nested one applies at full depth only.
        assert!(find(&rules, &[("tenant", "a")]).is_none());
        let r = find(&rules, &[("tenant", "a"), ("plan", "free")]).expect("nested rule");
        assert!(r.shadow);
        assert_eq!(r.replaces, vec!["login".to_owned()]);
        assert_eq!(
            find(&rules, &[("tenant", "a"), ("plan", "gold")])
                .unwrap()
                .quota,
            Quota::Unlimited
        );
        // More entries than the rules nest: no limit.
        assert!(find(&rules, &[("remote_address", "1"), ("x", "y")]).is_none());
        assert!(matches!(
            find(&rules, &[("blocked", "1")]).unwrap().quota,
            Quota::Blocked { unit: Unit::Day }
        ));
        assert!(rules.find("nope", [("a", "b")].into_iter()).is_none());
        assert!(rules.find("edge", std::iter::empty()).is_none());
    }

    /// Every mistake is reported with its file, domain and setting.
    #[test]
    fn errors_are_located() {
        let bad = r#"
domain: d
descriptors:
  - key: a
    rate_limit: {unit: fortnight, requests_per_unit: 1}
  - key: b
    rate_limit: {unit: second}
  - key: c
    rate_limit: {period: 1s, unit: second, requests_per_unit: 1}
  - key: d
    rate_limit: {unit: second, requests_per_unit: 20000, algorithm: sliding_window}
  - key: e
    rate_limit: {unit: second, requests_per_unit: 2, burst: 3}
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: f
    rate_limit: {unlimited: true, unit: second}
  - key: g
    shadow_mode: true
  - key: h
    rate_limit: {period: 0.5ms, requests_per_unit: 1}
---
domain: d
---
domain: x
descriptors:
  - key: a
    rate_lmit: {}
"#;
        let errors = Rules::from_yaml("bad.yaml", bad).expect_err("invalid rules");
        let expect = [
            "descriptors[0].rate_limit.unit: \"fortnight\"",
            "descriptors[1].rate_limit.requests_per_unit: required",
            "descriptors[2].rate_limit.period: give either",
            "descriptors[3].rate_limit.requests_per_unit: 20000 is outside 1 to 10000",
            "descriptors[4].rate_limit.burst: applies to GCRA only",
            "descriptors[5]: duplicate rule",
            "descriptors[6].rate_limit.unlimited",
            "descriptors[7].shadow_mode",
            "descriptors[8].rate_limit.period",
            "the domain is configured twice",
            "unknown field `rate_lmit`",
        ];
        assert_eq!(errors.len(), expect.len(), "{errors:#?}");
        for (e, want) in errors.iter().zip(expect) {
            assert!(e.starts_with("bad.yaml: "), "{e}");
            assert!(e.contains(want), "{e:?} should contain {want:?}");
        }
    }

    /// A limit named in another matched rule's `replaces` is dropped.
    #[test]
    fn replaces() {
        let rules = Rules::from_yaml("test.yaml", YAML).expect("valid rules");
        let matched = vec![
            find(&rules, &[("path", "/login")]),
            find(&rules, &[("tenant", "t"), ("plan", "free")]),
            None,
        ];
        assert_eq!(replaced(&matched), vec![true, false, false]);
    }

    /// Limiter names cannot collide by moving characters between parts.
    #[test]
    fn limiter_names_are_unambiguous() {
        let a = limiter_name("d", [("a=b", "c")].into_iter());
        let b = limiter_name("d", [("a", "b=c")].into_iter());
        assert_ne!(a, b);
        let c = limiter_name("d/1:x=0:", std::iter::empty());
        let d = limiter_name("d", [("x", "")].into_iter());
        assert_ne!(c, d);
    }
}
