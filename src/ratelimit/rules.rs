//! The rules of Envoy's rate limit API: domains of nested descriptors with limits, read from YAML
//! in envoyproxy/ratelimit's format, plus window lengths of any size (`period`), the algorithm per
//! rule (`algorithm`, `burst`), and `shadow_mode`.
//!
//! A request's descriptor (a list of key/value entries) matches a rule by walking the tree one
//! entry at a time: at each level an entry matches a rule with the same key and value first, then
//! one with the same key whose value has `*` wildcards matching the entry's value (each `*` any
//! run of characters, none included; the first such rule in file order), then one with the same
//! key and no value (every value gets its own limit). The limit applies only when the
//! descriptor's last entry lands on a rule that has one, as in envoyproxy/ratelimit.
//!
//! The files are untrusted input: they are read by a bounded YAML reader that stops at the first
//! syntax error, and every problem is reported as `FILE:LINE:COLUMN: domain "…": setting: reason`.
//! Files, documents, nodes, nesting and rules are all bounded (the `MAX_*` constants).

use std::{
    collections::{HashMap, HashSet},
    fmt::{self, Write as _},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use super::{
    Algorithm, Rate, RateField,
    yaml::{self, Node, Pos, Value},
};
use crate::files::FileError;

/// Longest domain, in bytes.
pub const MAX_DOMAIN_BYTES: usize = 256;
/// Longest descriptor key or value, in bytes.
pub const MAX_ENTRY_BYTES: usize = 1024;
/// Largest `requests_per_unit` and `burst` of a rule: Envoy's `requests_per_unit` and
/// `limit_remaining` are 32-bit (envoyproxy/ratelimit refuses more too); this value as
/// `limit_remaining` is also what unlimited rules report.
pub const MAX_RULE_UNITS: u64 = u32::MAX as u64;
/// Most entries in one descriptor (and deepest nesting of rules).
pub const MAX_ENTRIES: usize = 16;
/// Most descriptors in one request.
pub const MAX_DESCRIPTORS: usize = 64;
/// Largest rules file, in bytes.
pub const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;
/// Most rules files read from one directory.
pub const MAX_FILES: usize = 256;
/// Largest total size of the rules files read at once, in bytes.
pub const MAX_TOTAL_BYTES: u64 = 16 * 1024 * 1024;
/// Most domains (YAML documents) in one file.
pub const MAX_DOCUMENTS: usize = 1024;
/// Most rules (descriptor entries, at every level) in all the files together.
pub const MAX_RULES: usize = 100_000;
/// Most names one rule `replaces`.
pub const MAX_REPLACES: usize = 64;
/// How much YAML one file may hold: nesting well beyond [`MAX_ENTRIES`] levels of rules, and
/// nodes and text (aliases counted as the copies they are) within a few times the largest file.
const YAML_LIMITS: yaml::Limits = yaml::Limits {
    documents: MAX_DOCUMENTS,
    depth: 64,
    nodes: 500_000,
    bytes: 2 * MAX_FILE_BYTES as usize,
};
/// Most problems reported at once; the others are counted.
const MAX_PROBLEMS: usize = 50;

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

/// One level of a domain's rule tree: the rules for the next entry of a descriptor.
#[derive(Debug, Default)]
struct Level {
    rule: Option<Arc<Rule>>,
    exact: HashMap<String, HashMap<String, Level>>,
    wildcards: Vec<(String, Pattern, Level)>,
    any: HashMap<String, Level>,
}

/// A rule value with `*` in it: each `*` stands for any run of characters, none included
/// (`/api/*/action`, `*.png`, `v1*`), as envoyproxy/ratelimit matches it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pattern {
    /// The value split at each `*`: at least two parts, the first and last anchored at the ends.
    parts: Vec<String>,
    /// The total length of the parts: the shortest value that can match.
    fixed: usize,
}

impl Pattern {
    /// The pattern of `value`, or `None` when it has no `*` (an exact value).
    fn of(value: &str) -> Option<Self> {
        if !value.contains('*') {
            return None;
        }
        let parts: Vec<String> = value.split('*').map(str::to_owned).collect();
        let fixed = parts.iter().map(String::len).sum();
        Some(Self { parts, fixed })
    }

    fn matches(&self, value: &str) -> bool {
        let [first, middle @ .., last] = self.parts.as_slice() else {
            return false;
        };
        if value.len() < self.fixed {
            return false;
        }
        let Some(rest) = value
            .strip_prefix(first.as_str())
            .and_then(|rest| rest.strip_suffix(last.as_str()))
        else {
            return false;
        };
        // Each middle part at its first place after the previous one: if any placement fits,
        // the leftmost one does.
        let mut rest = rest;
        for part in middle {
            match rest.find(part.as_str()) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        true
    }
}

impl Level {
    fn has_children(&self) -> bool {
        !self.exact.is_empty() || !self.wildcards.is_empty() || !self.any.is_empty()
    }

    fn next(&self, key: &str, value: &str) -> Option<&Level> {
        self.exact
            .get(key)
            .and_then(|values| values.get(value))
            .or_else(|| {
                self.wildcards
                    .iter()
                    .find(|(k, pattern, _)| k == key && pattern.matches(value))
                    .map(|(_, _, level)| level)
            })
            .or_else(|| self.any.get(key))
    }
}

/// Every domain's rules. Cheap to share behind an `Arc`.
#[derive(Debug, Default)]
pub struct Rules {
    domains: HashMap<String, Level>,
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
    /// directory whose `*.yaml` and `*.yml` files are read in name order. Returns the problems
    /// found, one line each, starting with `FILE:LINE:COLUMN:` where the problem has a place, and
    /// naming the domain and the setting.
    pub fn load(path: &Path) -> Result<Self, Vec<String>> {
        Self::from_files(path, &read_all(path)?)
    }

    /// Rules from the files [`read_all`] returned for `path`.
    pub fn from_files(path: &Path, files: &[(PathBuf, String)]) -> Result<Self, Vec<String>> {
        let mut loader = Loader::default();
        for (file, text) in files {
            loader.add_text(&file.display().to_string(), text);
            loader.rules.sources.push(file.clone());
        }
        if loader.rules.domains.is_empty() && loader.problems.is_empty() {
            loader
                .problems
                .push(format!("{}: no domain is configured", path.display()));
        }
        loader.finish()
    }

    /// Rules from YAML text, as [`Rules::load`] reads a file named `origin`. Every problem of the
    /// text itself starts with `origin:LINE:COLUMN:`.
    pub fn from_yaml(origin: &str, text: &str) -> Result<Self, Vec<String>> {
        let mut loader = Loader::default();
        loader.add_text(origin, text);
        loader.finish()
    }
}

/// The rules read so far and the problems found.
#[derive(Default)]
struct Loader {
    rules: Rules,
    rule_count: usize,
    problems: Problems,
}

/// Problem lines, at most [`MAX_PROBLEMS`] of them kept.
#[derive(Default)]
struct Problems {
    lines: Vec<String>,
    more: usize,
}

impl Problems {
    fn push(&mut self, line: String) {
        if self.lines.len() < MAX_PROBLEMS {
            self.lines.push(line);
        } else {
            self.more += 1;
        }
    }

    fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    fn into_lines(mut self) -> Vec<String> {
        if self.more > 0 {
            self.lines
                .push(format!("... and {} more problems", self.more));
        }
        self.lines
    }
}

/// Whose problem it is: the file and, once known, the domain.
struct At<'a> {
    origin: &'a str,
    domain: Option<&'a str>,
}

impl Loader {
    fn finish(self) -> Result<Rules, Vec<String>> {
        if self.problems.is_empty() {
            Ok(self.rules)
        } else {
            Err(self.problems.into_lines())
        }
    }

    fn problem(&mut self, at: &At<'_>, pos: Pos, what: impl fmt::Display) {
        let line = match at.domain {
            Some(domain) => format!("{}:{pos}: domain {domain:?}: {what}", at.origin),
            None => format!("{}:{pos}: {what}", at.origin),
        };
        self.problems.push(line);
    }

    fn add_text(&mut self, origin: &str, text: &str) {
        let at = At {
            origin,
            domain: None,
        };
        let documents = match yaml::documents(text, &YAML_LIMITS) {
            Ok(documents) => documents,
            Err(e) => {
                self.problem(&at, e.pos, e.message);
                return;
            }
        };
        for (n, document) in documents.iter().enumerate() {
            // An empty document (a lone `---`, or only comments) configures nothing.
            if !document.is_null() {
                self.add_document(origin, n + 1, document);
            }
        }
    }

    fn add_document(&mut self, origin: &str, n: usize, document: &Node) {
        let at = At {
            origin,
            domain: None,
        };
        let Some(fields) = self.fields(
            &at,
            document,
            &format!("document {n}"),
            &["domain", "descriptors"],
        ) else {
            return;
        };
        let domain = match fields.get("domain") {
            None => {
                self.problem(&at, document.pos, format!("document {n}: domain: required"));
                return;
            }
            Some(node) => match text(node) {
                Ok(domain) => domain.unwrap_or_default(),
                Err(e) => {
                    self.problem(&at, node.pos, format!("document {n}: domain: {e}"));
                    return;
                }
            },
        };
        let domain_pos = fields.get("domain").map_or(document.pos, |n| n.pos);
        let at = At {
            origin,
            domain: Some(&domain),
        };
        if domain.is_empty() || domain.len() > MAX_DOMAIN_BYTES {
            self.problem(
                &at,
                domain_pos,
                format!("domain must be 1 to {MAX_DOMAIN_BYTES} bytes"),
            );
            return;
        }
        if self.rules.domains.contains_key(&domain) {
            self.problem(&at, domain_pos, "the domain is configured twice");
            return;
        }
        let mut level = Level::default();
        if let Some(node) = fields.get("descriptors") {
            self.add_descriptors(&at, &mut level, node, "descriptors", &domain, 1);
        }
        self.rules.domains.insert(domain.clone(), level);
    }

    /// The settings of a mapping by name, or `None` (a problem reported) when `node` is not a
    /// mapping. Unknown and repeated names are reported; the known ones are still returned.
    fn fields<'n>(
        &mut self,
        at: &At<'_>,
        node: &'n Node,
        path: &str,
        known: &[&str],
    ) -> Option<HashMap<&'n str, &'n Node>> {
        let Value::Map(entries) = &node.value else {
            self.problem(
                at,
                node.pos,
                format!("{path}: expected a mapping, found {}", node.kind()),
            );
            return None;
        };
        let mut fields = HashMap::new();
        for (key, value) in entries {
            let Value::Scalar { text: name, .. } = &key.value else {
                self.problem(
                    at,
                    key.pos,
                    format!("{path}: a setting's name must be text"),
                );
                continue;
            };
            if !known.contains(&name.as_str()) {
                self.problem(
                    at,
                    key.pos,
                    format!(
                        "{path}: unknown field `{name}`, expected one of: {}",
                        known.join(", ")
                    ),
                );
            } else if fields.insert(name.as_str(), value).is_some() {
                self.problem(at, key.pos, format!("{path}.{name}: set twice"));
            }
        }
        Some(fields)
    }

    fn add_descriptors(
        &mut self,
        at: &At<'_>,
        level: &mut Level,
        node: &Node,
        path: &str,
        parent_rule: &str,
        depth: usize,
    ) {
        let descriptors = match list(node) {
            Ok(descriptors) => descriptors,
            Err(e) => {
                self.problem(at, node.pos, format!("{path}: {e}"));
                return;
            }
        };
        if depth > MAX_ENTRIES && !descriptors.is_empty() {
            self.problem(
                at,
                node.pos,
                format!("{path}: rules nest deeper than {MAX_ENTRIES} levels"),
            );
            return;
        }
        for (i, d) in descriptors.iter().enumerate() {
            let path = format!("{path}[{i}]");
            if self.rule_count == MAX_RULES {
                self.problem(at, d.pos, format!("{path}: more than {MAX_RULES} rules"));
                return;
            }
            self.rule_count += 1;
            self.add_descriptor(at, level, d, &path, parent_rule, depth);
        }
    }

    fn add_descriptor(
        &mut self,
        at: &At<'_>,
        level: &mut Level,
        d: &Node,
        path: &str,
        parent_rule: &str,
        depth: usize,
    ) {
        const KNOWN: &[&str] = &[
            "key",
            "value",
            "rate_limit",
            "descriptors",
            "shadow_mode",
            "detailed_metric",
            "value_to_metric",
        ];
        let Some(fields) = self.fields(at, d, path, KNOWN) else {
            return;
        };
        let mut failed = false;
        for flag in ["shadow_mode", "detailed_metric", "value_to_metric"] {
            if let Some(node) = fields.get(flag)
                && let Err(e) = flag_of(node)
            {
                self.problem(at, node.pos, format!("{path}.{flag}: {e}"));
                failed = true;
            }
        }
        let key = match fields.get("key").map(|n| (n, text(n))) {
            None => {
                self.problem(at, d.pos, format!("{path}.key: required"));
                return;
            }
            Some((n, Err(e))) => {
                self.problem(at, n.pos, format!("{path}.key: {e}"));
                return;
            }
            Some((n, Ok(key))) => {
                let key = key.unwrap_or_default();
                if key.is_empty() || key.len() > MAX_ENTRY_BYTES {
                    self.problem(
                        at,
                        n.pos,
                        format!("{path}.key: must be 1 to {MAX_ENTRY_BYTES} bytes"),
                    );
                    return;
                }
                if key.contains('*') {
                    self.problem(
                        at,
                        n.pos,
                        format!("{path}.key: {key:?}: a wildcard `*` belongs in the value"),
                    );
                    return;
                }
                key
            }
        };
        let value = match fields.get("value").map(|n| (n, text(n))) {
            None => String::new(),
            Some((n, Err(e))) => {
                self.problem(at, n.pos, format!("{path}.value: {e}"));
                return;
            }
            Some((n, Ok(value))) => {
                let value = value.unwrap_or_default();
                if value.len() > MAX_ENTRY_BYTES {
                    self.problem(
                        at,
                        n.pos,
                        format!("{path}.value: is longer than {MAX_ENTRY_BYTES} bytes"),
                    );
                    return;
                }
                value
            }
        };
        if failed {
            return;
        }
        let shadow = fields
            .get("shadow_mode")
            .is_some_and(|n| flag_of(n).unwrap_or(false));
        let mut rule_path = format!("{parent_rule}.{key}");
        if !value.is_empty() {
            let _ = write!(rule_path, "_{value}");
        }
        let mut child = Level::default();
        match fields.get("rate_limit").filter(|n| !n.is_null()) {
            Some(node) => {
                if let Some(spec) = self.spec(at, node, &format!("{path}.rate_limit")) {
                    match rule(&spec, shadow, &rule_path) {
                        Ok(r) => child.rule = Some(Arc::new(r)),
                        Err((pos, e)) => {
                            self.problem(at, pos, format!("{path}.rate_limit.{e}"));
                        }
                    }
                }
            }
            None if shadow => {
                self.problem(
                    at,
                    fields.get("shadow_mode").map_or(d.pos, |n| n.pos),
                    format!("{path}.shadow_mode: applies only to a rule with a rate_limit"),
                );
            }
            None => {}
        }
        if let Some(node) = fields.get("descriptors") {
            self.add_descriptors(
                at,
                &mut child,
                node,
                &format!("{path}.descriptors"),
                &rule_path,
                depth + 1,
            );
        }
        let duplicate = format!("{path}: duplicate rule for key {key:?} value {value:?}");
        if value.is_empty() {
            if level.any.insert(key, child).is_some() {
                self.problem(at, d.pos, duplicate);
            }
        } else if let Some(pattern) = Pattern::of(&value) {
            if level
                .wildcards
                .iter()
                .any(|(k, p, _)| *k == key && *p == pattern)
            {
                self.problem(at, d.pos, duplicate);
            } else {
                level.wildcards.push((key, pattern, child));
            }
        } else if level
            .exact
            .entry(key)
            .or_default()
            .insert(value, child)
            .is_some()
        {
            self.problem(at, d.pos, duplicate);
        }
    }

    /// The settings of one `rate_limit` block, or `None` with its problems reported.
    fn spec(&mut self, at: &At<'_>, node: &Node, path: &str) -> Option<Spec> {
        const KNOWN: &[&str] = &[
            "requests_per_unit",
            "unit",
            "period",
            "unlimited",
            "name",
            "replaces",
            "algorithm",
            "burst",
        ];
        let fields = self.fields(at, node, path, KNOWN)?;
        let mut spec = Spec {
            pos: node.pos,
            ..Spec::default()
        };
        let mut ok = true;
        for &name in KNOWN {
            let Some(&n) = fields.get(name) else {
                continue;
            };
            let at_n = |v: Option<String>| v.map(|v| (v, n.pos));
            let problem = match name {
                "requests_per_unit" => count(n)
                    .map(|v| spec.requests_per_unit = v.map(|v| (v, n.pos)))
                    .err(),
                "burst" => count(n).map(|v| spec.burst = v.map(|v| (v, n.pos))).err(),
                "unit" => text(n).map(|v| spec.unit = at_n(v)).err(),
                "period" => text(n).map(|v| spec.period = at_n(v)).err(),
                "algorithm" => text(n).map(|v| spec.algorithm = at_n(v)).err(),
                "name" => text(n).map(|v| spec.name = v.unwrap_or_default()).err(),
                "unlimited" => flag_of(n)
                    .map(|v| spec.unlimited = v.then_some(n.pos))
                    .err(),
                _ => {
                    match self.replaces(at, n, &format!("{path}.replaces")) {
                        Some(names) => spec.replaces = names,
                        None => ok = false,
                    }
                    None
                }
            };
            if let Some(e) = problem {
                self.problem(at, n.pos, format!("{path}.{name}: {e}"));
                ok = false;
            }
        }
        ok.then_some(spec)
    }

    /// The names of a `replaces` list, or `None` with its problems reported.
    fn replaces(&mut self, at: &At<'_>, node: &Node, path: &str) -> Option<Vec<(String, Pos)>> {
        let items = match list(node) {
            Ok(items) => items,
            Err(e) => {
                self.problem(at, node.pos, format!("{path}: {e}"));
                return None;
            }
        };
        if items.len() > MAX_REPLACES {
            self.problem(
                at,
                node.pos,
                format!("{path}: more than {MAX_REPLACES} names"),
            );
            return None;
        }
        let mut names = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let path = format!("{path}[{i}]");
            let fields = self.fields(at, item, &path, &["name"])?;
            match fields.get("name").map(|n| (n, text(n))) {
                None => names.push((String::new(), item.pos)),
                Some((n, Ok(name))) => names.push((name.unwrap_or_default(), n.pos)),
                Some((n, Err(e))) => {
                    self.problem(at, n.pos, format!("{path}.name: {e}"));
                    return None;
                }
            }
        }
        Some(names)
    }
}

/// The text of a scalar (`None` for null). A value written `200` means the text "200", as it
/// does in envoyproxy/ratelimit.
fn text(node: &Node) -> Result<Option<String>, String> {
    match &node.value {
        _ if node.is_null() => Ok(None),
        Value::Scalar { text, .. } => Ok(Some(text.clone())),
        _ => Err(format!("expected text, found {}", node.kind())),
    }
}

/// A boolean written plain (`true`, `false`, in YAML's spellings); null is false.
fn flag_of(node: &Node) -> Result<bool, String> {
    match &node.value {
        _ if node.is_null() => Ok(false),
        Value::Scalar { text, plain: true } => match text.as_str() {
            "true" | "True" | "TRUE" => Ok(true),
            "false" | "False" | "FALSE" => Ok(false),
            _ => Err(format!("{text:?} is not true or false")),
        },
        Value::Scalar { text, .. } => Err(format!("{text:?} is quoted text, not true or false")),
        _ => Err(format!("expected true or false, found {}", node.kind())),
    }
}

/// A whole number written plain in decimal (`None` for null).
fn count(node: &Node) -> Result<Option<u64>, String> {
    match &node.value {
        _ if node.is_null() => Ok(None),
        Value::Scalar { text, plain: true } if text.bytes().all(|b| b.is_ascii_digit()) => text
            .parse()
            .map(Some)
            .map_err(|_| format!("{text} is too large")),
        Value::Scalar { text, .. } => Err(format!("{text:?} is not a whole number")),
        _ => Err(format!("expected a whole number, found {}", node.kind())),
    }
}

/// The items of a list (none for null).
fn list(node: &Node) -> Result<&[Node], String> {
    match &node.value {
        _ if node.is_null() => Ok(&[]),
        Value::Seq(items) => Ok(items),
        _ => Err(format!("expected a list, found {}", node.kind())),
    }
}

/// The path and text of every rules file at `path` (a file, or a directory's `*.yaml` and `*.yml`
/// files in name order), each at most [`MAX_FILE_BYTES`] and [`MAX_TOTAL_BYTES`] together.
pub fn read_all(path: &Path) -> Result<Vec<(PathBuf, String)>, Vec<String>> {
    let files = files(path).map_err(|e| vec![e])?;
    let mut errors = Vec::new();
    let mut texts = Vec::new();
    let mut total = 0u64;
    for file in files {
        match read(&file) {
            Ok(text) => {
                total += text.len() as u64;
                if total > MAX_TOTAL_BYTES {
                    return Err(vec![format!(
                        "{}: the rules files are larger than {MAX_TOTAL_BYTES} bytes together",
                        path.display()
                    )]);
                }
                texts.push((file, text));
            }
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
        // Whatever it is: one that is not a regular file (a dangling link, a directory, a pipe)
        // is refused when read, rather than skipped with its domains' rules.
        if yaml {
            if files.len() == MAX_FILES {
                return Err(format!(
                    "{}: more than {MAX_FILES} .yaml and .yml files",
                    path.display()
                ));
            }
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

/// The text of one rules file: a regular file of at most [`MAX_FILE_BYTES`] of UTF-8.
fn read(file: &Path) -> Result<String, String> {
    let fail = |e: &dyn fmt::Display| format!("{}: {e}", file.display());
    // A pipe or a device would be read without end (or block): refused once opened, without
    // blocking, so that a path swapped to one after a check cannot hang a reload.
    let bytes = crate::files::read_regular(file, MAX_FILE_BYTES).map_err(|e| match e {
        FileError::Io(e) => fail(&e),
        FileError::NotRegular => fail(&"not a regular file"),
        FileError::TooLarge(max) => fail(&format_args!("larger than {max} bytes")),
    })?;
    String::from_utf8(bytes).map_err(|e| {
        let valid = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        // Valid up to there, so this decodes.
        let before = String::from_utf8_lossy(valid);
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        format!("{}:{line}:{column}: not UTF-8 text", file.display())
    })
}

/// The settings of one `rate_limit` block, each with where it was written.
#[derive(Debug, Default)]
struct Spec {
    pos: Pos,
    requests_per_unit: Option<(u64, Pos)>,
    unit: Option<(String, Pos)>,
    period: Option<(String, Pos)>,
    unlimited: Option<Pos>,
    name: String,
    replaces: Vec<(String, Pos)>,
    algorithm: Option<(String, Pos)>,
    burst: Option<(u64, Pos)>,
}

/// Compiles one `rate_limit` block; an error has its place and starts with the setting's name.
fn rule(spec: &Spec, shadow: bool, path: &str) -> Result<Rule, (Pos, String)> {
    for (name, pos) in &spec.replaces {
        if name.is_empty() {
            return Err((*pos, "replaces: a name must not be empty".to_owned()));
        }
        if *name == spec.name {
            return Err((*pos, format!("replaces: {name:?} is this rule's own name")));
        }
    }
    let replaces = spec.replaces.iter().map(|(r, _)| r.clone()).collect();
    let base = |quota| Rule {
        quota,
        name: spec.name.clone(),
        replaces,
        shadow,
        path: path.to_owned(),
    };
    if let Some(pos) = spec.unlimited {
        if spec.unit.is_some()
            || spec.period.is_some()
            || spec.requests_per_unit.is_some()
            || spec.algorithm.is_some()
            || spec.burst.is_some()
        {
            return Err((
                pos,
                "unlimited: an unlimited rule takes no unit, period, requests_per_unit, algorithm or burst"
                    .to_owned(),
            ));
        }
        return Ok(base(Quota::Unlimited));
    }
    let (unit, period) = match (&spec.unit, &spec.period) {
        (Some(_), Some((_, pos))) => {
            return Err((*pos, "period: give either unit or period, not both".into()));
        }
        (None, None) => return Err((spec.pos, "unit: required (or period)".to_owned())),
        (Some((name, pos)), None) => {
            let unit = Unit::parse(name).ok_or_else(|| {
                (
                    *pos,
                    format!("unit: {name:?} is not second, minute, hour, day, week, month or year"),
                )
            })?;
            (unit, unit.period().unwrap_or(Duration::from_secs(1)))
        }
        (None, Some((text, pos))) => {
            let period = humantime::parse_duration(text).map_err(|e| {
                (
                    *pos,
                    format!("period: {text:?} is not a duration like 1500ms: {e}"),
                )
            })?;
            (Unit::of(period), period)
        }
    };
    let algorithm = match &spec.algorithm {
        None => Algorithm::AlignedWindow,
        Some((name, pos)) => match name.as_str() {
            "fixed_window" => Algorithm::AlignedWindow,
            "gcra" => Algorithm::Gcra,
            "sliding_window" => Algorithm::SlidingWindow,
            other => {
                return Err((
                    *pos,
                    format!("algorithm: {other:?} is not fixed_window, gcra or sliding_window"),
                ));
            }
        },
    };
    let Some((requests, requests_pos)) = spec.requests_per_unit else {
        return Err((spec.pos, "requests_per_unit: required".to_owned()));
    };
    if requests > MAX_RULE_UNITS {
        return Err((
            requests_pos,
            format!(
                "requests_per_unit: {requests} is more than {MAX_RULE_UNITS}, the largest Envoy's API can report"
            ),
        ));
    }
    if let Some((burst, pos)) = spec.burst
        && burst > MAX_RULE_UNITS
    {
        return Err((
            pos,
            format!(
                "burst: {burst} is more than {MAX_RULE_UNITS}, the largest Envoy's API can report"
            ),
        ));
    }
    let burst = spec.burst.map(|(b, _)| b);
    if requests == 0 {
        // Validate the period and burst anyway, with a limit of 1.
        Rate::new(algorithm, 1, period, burst).map_err(|e| describe(e, spec))?;
        return Ok(base(Quota::Blocked { unit }));
    }
    let rate = Rate::new(algorithm, requests, period, burst).map_err(|e| describe(e, spec))?;
    Ok(base(Quota::Limited { rate, unit }))
}

/// A [`Rate`] error as the rules file names it, at the setting that caused it.
fn describe((field, reason): (RateField, String), spec: &Spec) -> (Pos, String) {
    let (name, pos) = match field {
        RateField::Limit => ("requests_per_unit", spec.requests_per_unit.map(|(_, p)| p)),
        RateField::Period if spec.period.is_some() => {
            ("period", spec.period.as_ref().map(|(_, p)| *p))
        }
        RateField::Period => ("unit", spec.unit.as_ref().map(|(_, p)| *p)),
        RateField::Burst => ("burst", spec.burst.map(|(_, p)| p)),
    };
    (pos.unwrap_or(spec.pos), format!("{name}: {reason}"))
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
  - key: path
    value: /v2/*/*/avatar*.png
    rate_limit: {unit: second, requests_per_unit: 1, name: avatars}
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
        let r = find(&rules, &[("path", "/v2/users/7/avatar.png")]).expect("wildcards");
        assert_eq!(r.name, "avatars");
        assert!(find(&rules, &[("path", "/v2/users/7/avatar.jpg")]).is_none());
        assert!(find(&rules, &[("path", "/v2/avatar.png")]).is_none());
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
  - key: i*
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: j
    rate_limit: {unit: second, requests_per_unit: 4294967296}
  - key: k
    rate_limit: {unit: second, requests_per_unit: 4294967295, algorithm: gcra, burst: 4294967296}
  - key: l
    rate_limit: {unit: second, requests_per_unit: 4294967295, algorithm: gcra, burst: 4294967295}
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
            "descriptors[9].key: \"i*\": a wildcard",
            "descriptors[10].rate_limit.requests_per_unit: 4294967296 is more than 4294967295",
            "descriptors[11].rate_limit.burst: 4294967296 is more than 4294967295",
            "the domain is configured twice",
            "unknown field `rate_lmit`",
        ];
        assert_eq!(errors.len(), expect.len(), "{errors:#?}");
        for (e, want) in errors.iter().zip(expect) {
            let place = e.strip_prefix("bad.yaml:").and_then(|rest| {
                let mut parts = rest.splitn(3, ':');
                let line: usize = parts.next()?.parse().ok()?;
                let column: usize = parts.next()?.parse().ok()?;
                Some((line, column))
            });
            assert!(
                place.is_some(),
                "{e} should start with bad.yaml:LINE:COLUMN:"
            );
            assert!(e.contains(want), "{e:?} should contain {want:?}");
        }
    }

    /// Each `*` of a value matches any run of characters, none included, with the literal parts
    /// in order and the first and last anchored at the ends; the literal parts never overlap.
    #[test]
    fn wildcards_match_any_run() {
        let cases: &[(&str, &[&str], &[&str])] = &[
            ("v1*", &["v1", "v1/x"], &["v", "xv1"]),
            ("*.png", &[".png", "a.png"], &["a.pngx", "png"]),
            (
                "bar*b",
                &["barb", "barab", "bar123b"],
                &["bara", "xbarb", "bar"],
            ),
            (
                "foo*bar*baz",
                &["foobarbaz", "foo1bar2baz"],
                &["foo123baz", "bar1baz", "foobazbar"],
            ),
            ("aa*aa", &["aaaa", "aaxaa"], &["aaa", "aa"]),
            ("*", &["", "anything"], &[]),
            ("a**b", &["ab", "axb"], &["ba"]),
            ("*x*", &["x", "axb"], &["ab"]),
        ];
        for (pattern, good, bad) in cases {
            let p = Pattern::of(pattern).expect("a pattern");
            for v in *good {
                assert!(p.matches(v), "{pattern} should match {v:?}");
            }
            for v in *bad {
                assert!(!p.matches(v), "{pattern} should not match {v:?}");
            }
        }
        assert!(Pattern::of("plain").is_none());
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
