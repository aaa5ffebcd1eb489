//! The layouts of a dictionary's lex index measured beside the bare sorted set
//! (`autocomplete-layouts`): what each takes in Redis, to weigh a more compact index.

use std::fmt::Write as _;

use super::{cell, distinct, get, grouped, select, values};
use crate::{names, record::Run};

/// What a layout (a record's side) is.
fn label(side: &str) -> Option<&'static str> {
    Some(match side {
        "zadd" => "one sorted set of lex members (matching form, `\\0`, display text)",
        "chunks" => "the same members in byte order, cut into sorted sets of 100",
        "short" => "one sorted set of short members (matching form, `\\0`, a 4-byte reference)",
        "short-chunks" => "the short members in sorted sets of 100",
        _ => return None,
    })
}

/// The table: one row per layout the run measured.
pub fn table(run: &Run) -> String {
    let mut md = String::from(
        "| layout | keys | listpack-encoded keys | load time, s | bytes per term (`used_memory` growth) |\n\
         |---|---:|---:|---:|---:|\n",
    );
    let records = select(run, |r| {
        r.scenario == "autocomplete"
            && (r.case == "layout" || (r.case == "baseline" && r.side == "zadd"))
    });
    for side in distinct(&records, |r| r.side.clone()) {
        let Some(what) = label(&side) else { continue };
        let r: Vec<_> = records.iter().copied().filter(|r| r.side == side).collect();
        // The bare set is one key of a million members: a skip list, never a listpack.
        let (keys, listpack) = if side == "zadd" {
            ("1".to_owned(), "0".to_owned())
        } else {
            (
                cell(&values(&r, get(names::KEYS)), grouped),
                cell(&values(&r, get(names::LISTPACK_KEYS)), grouped),
            )
        };
        let _ = writeln!(
            md,
            "| {what} | {keys} | {listpack} | {} | {} |",
            cell(&values(&r, get(names::TOOK)), |v| format!("{v:.1}")),
            cell(
                &values(&r, |x| get(names::MEMORY)(x)
                    / get(names::TERMS)(x).max(1.0)),
                grouped
            ),
        );
    }
    md
}
