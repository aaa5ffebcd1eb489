//! What a run writes: one JSON document ([`Run`]) per `loadgen run`, with every measured window
//! as a [`Record`] of named figures. The report ([`crate::report`]) reads nothing else.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The version of the JSON layout; `report` refuses others.
pub const FORMAT: u32 = 1;

/// Everything one `loadgen run` measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Run {
    /// [`FORMAT`].
    pub format: u32,
    /// The command line, as given.
    pub command: String,
    /// When the run started (UTC, RFC 3339).
    pub started: String,
    /// How long it took, in seconds.
    pub seconds: f64,
    /// Cores, CPU model, memory, kernel, Redis and rustc versions.
    pub machine: String,
    /// The commit of the load generator's checkout (with `+` when it had uncommitted changes).
    pub commit: String,
    /// The Baton binaries measured, each in every repeat.
    pub builds: Vec<Build>,
    /// The options every scenario ran with.
    pub options: BTreeMap<String, String>,
    /// One entry per repeat and build: the machine's load and Baton's memory around it.
    pub repeats: Vec<Repeat>,
    /// Every measured window.
    pub records: Vec<Record>,
}

/// A Baton binary.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Build {
    /// Its name in the records (`""` when the run measured one build).
    pub name: String,
    /// The binary.
    pub path: String,
    /// The commit of the checkout it was built in (`+`: with uncommitted changes).
    pub commit: String,
}

/// One repeat of one build.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Repeat {
    /// The repeat's number, from 0.
    pub repeat: usize,
    /// The build's name.
    pub build: String,
    /// Load average (1, 5, 15 min) before the repeat.
    pub load_before: [f64; 3],
    /// Load average after it.
    pub load_after: [f64; 3],
}

/// One measured window of one scenario on one side.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Record {
    /// The scenario (`lock`, `lock-fair`, `leases`, `leader-failover`, `autocomplete`, ...).
    pub scenario: String,
    /// What in the scenario (`""`, a query kind, a Sentinel timing, ...).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub case: String,
    /// Concurrent clients (0 where it does not apply).
    pub clients: usize,
    /// Who did the work: `direct`, `polling`, `baton-tcp`, `baton-uds`, `evalsha`, `fcall`, ...
    pub side: String,
    /// The build's name (`""` when the run measured one build).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub build: String,
    /// The repeat's number.
    pub repeat: usize,
    /// The figures, by name ([`crate::names`]).
    pub values: BTreeMap<String, f64>,
    /// Redis's `INFO commandstats` over the window: calls and microseconds per command.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub commands: BTreeMap<String, CommandStat>,
    /// The first error a client met, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
}

/// One command's line of `INFO commandstats`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct CommandStat {
    /// Successful and failed calls.
    pub calls: u64,
    /// Microseconds Redis spent in them (scripts: with the commands they ran).
    pub usec: u64,
}

impl Run {
    /// The run as JSON: indented, each record on a line of its own (diffs read by record).
    pub fn to_json(&self) -> String {
        let head = Run {
            records: Vec::new(),
            ..self.clone()
        };
        let head = serde_json::to_string_pretty(&head).expect("a run serializes");
        let records: Vec<String> = self
            .records
            .iter()
            .map(|r| {
                format!(
                    "    {}",
                    serde_json::to_string(r).expect("a record serializes")
                )
            })
            .collect();
        let body = if records.is_empty() {
            "[]".to_owned()
        } else {
            format!("[\n{}\n  ]", records.join(",\n"))
        };
        head.replacen("\"records\": []", &format!("\"records\": {body}"), 1) + "\n"
    }
}

impl Record {
    /// The figure `name`, if measured.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.values.get(name).copied()
    }

    /// Sets the figure `name`.
    pub fn set(&mut self, name: &str, value: f64) {
        self.values.insert(name.to_owned(), value);
    }

    /// Calls of `command` (lowercase) in the window.
    pub fn calls(&self, command: &str) -> u64 {
        self.commands.get(command).map_or(0, |c| c.calls)
    }

    /// EVALSHA + EVAL + FCALL: the script calls clients sent.
    pub fn script_calls(&self) -> u64 {
        self.calls("evalsha") + self.calls("eval") + self.calls("fcall")
    }
}
