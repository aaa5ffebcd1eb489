//! A bounded YAML reader for the rules files: the documents of a text as trees of scalars,
//! sequences and mappings, each node with its line and column.
//!
//! It stops at the first syntax error, and refuses a text beyond its [`Limits`] (documents,
//! nesting, nodes, scalar bytes) instead of growing with it. Aliases are copies of their anchor's
//! node and are counted as such, so a small text of nested aliases cannot expand into a large
//! tree. Tags are refused: a rules file has no use for them.

use std::{collections::HashMap, fmt};

use saphyr_parser::{Event, Marker, Parser, ScalarStyle};

/// A place in the text: line and column, both counted from 1 (columns in characters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pos {
    /// The line, from 1.
    pub line: usize,
    /// The column, from 1, in characters.
    pub column: usize,
}

impl Pos {
    fn of(mark: &Marker) -> Self {
        Self {
            line: mark.line(),
            column: mark.col() + 1,
        }
    }
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// What a node holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A scalar: its text, and whether it was written plain (unquoted, not a block scalar), the
    /// only form whose text can mean a number, a boolean or null.
    Scalar {
        /// The scalar's text.
        text: String,
        /// Written without quotes or a block indicator.
        plain: bool,
    },
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping, its entries in text order (keys may repeat; the reader of the mapping decides).
    Map(Vec<(Node, Node)>),
}

/// One node of a document and where it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// What it holds.
    pub value: Value,
    /// Where it starts.
    pub pos: Pos,
    /// Nodes in this subtree, itself included.
    nodes: usize,
    /// Bytes of scalar text in this subtree.
    bytes: usize,
}

impl Node {
    /// Whether this is a plain `null`, `~` or nothing at all, which YAML reads as null.
    pub fn is_null(&self) -> bool {
        matches!(&self.value, Value::Scalar { text, plain: true }
            if matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL"))
    }

    /// What kind of node this is, for error messages.
    pub fn kind(&self) -> &'static str {
        match &self.value {
            Value::Scalar { .. } if self.is_null() => "nothing (null)",
            Value::Scalar { .. } => "a scalar",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }
}

/// How much of a text the reader accepts.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Documents in the text.
    pub documents: usize,
    /// Sequences and mappings nested in one another.
    pub depth: usize,
    /// Nodes in all documents, aliases counted as the copies they are.
    pub nodes: usize,
    /// Bytes of scalar text in all documents, aliases counted as the copies they are.
    pub bytes: usize,
}

/// Why a text was refused, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// Where the problem was found.
    pub pos: Pos,
    /// What it is.
    pub message: String,
}

impl Error {
    fn new(pos: Pos, message: impl Into<String>) -> Self {
        Self {
            pos,
            message: message.into(),
        }
    }
}

/// A sequence or mapping still being read.
struct Open {
    pos: Pos,
    anchor: usize,
    items: Vec<Node>,
    map: bool,
}

/// The nodes and bytes still allowed.
struct Budget {
    nodes: usize,
    bytes: usize,
}

impl Budget {
    fn spend(
        &mut self,
        pos: Pos,
        nodes: usize,
        bytes: usize,
        limits: &Limits,
    ) -> Result<(), Error> {
        self.nodes = self.nodes.checked_sub(nodes).ok_or_else(|| {
            Error::new(
                pos,
                format!(
                    "more than {} YAML nodes (aliases count as copies)",
                    limits.nodes
                ),
            )
        })?;
        self.bytes = self.bytes.checked_sub(bytes).ok_or_else(|| {
            Error::new(
                pos,
                format!(
                    "more than {} bytes of YAML text (aliases count as copies)",
                    limits.bytes
                ),
            )
        })?;
        Ok(())
    }
}

/// The documents of `text`, or the first problem: a syntax error, a tag, an alias of an anchor
/// not (yet) complete, or a limit passed.
pub fn documents(text: &str, limits: &Limits) -> Result<Vec<Node>, Error> {
    let mut parser = Parser::new_from_str(text);
    let mut documents = Vec::new();
    let mut open: Vec<Open> = Vec::new();
    let mut anchors: HashMap<usize, Node> = HashMap::new();
    let mut budget = Budget {
        nodes: limits.nodes,
        bytes: limits.bytes,
    };
    while let Some(next) = parser.next_event() {
        let (event, span) = next.map_err(|e| Error::new(Pos::of(e.marker()), e.info()))?;
        let pos = Pos::of(&span.start);
        let (node, anchor) = match event {
            Event::StreamEnd => break,
            Event::Nothing | Event::StreamStart => continue,
            Event::DocumentStart(_) => {
                if documents.len() == limits.documents {
                    return Err(Error::new(
                        pos,
                        format!("more than {} YAML documents", limits.documents),
                    ));
                }
                continue;
            }
            Event::DocumentEnd => {
                // Anchors belong to their document.
                anchors.clear();
                continue;
            }
            Event::Scalar(_, _, _, Some(tag))
            | Event::SequenceStart(_, Some(tag))
            | Event::MappingStart(_, Some(tag)) => {
                return Err(Error::new(
                    pos,
                    format!("YAML tags such as {tag} are not supported here"),
                ));
            }
            Event::SequenceStart(anchor, None) | Event::MappingStart(anchor, None) => {
                if open.len() >= limits.depth {
                    return Err(Error::new(
                        pos,
                        format!("lists and mappings nest deeper than {}", limits.depth),
                    ));
                }
                budget.spend(pos, 1, 0, limits)?;
                open.push(Open {
                    pos,
                    anchor,
                    items: Vec::new(),
                    map: matches!(event, Event::MappingStart(..)),
                });
                continue;
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let Some(done) = open.pop() else {
                    return Err(Error::new(
                        pos,
                        "the end of a list or mapping that never began",
                    ));
                };
                let anchor = done.anchor;
                (collection(done), anchor)
            }
            Event::Scalar(text, style, anchor, None) => {
                budget.spend(pos, 1, text.len(), limits)?;
                (
                    Node {
                        nodes: 1,
                        bytes: text.len(),
                        value: Value::Scalar {
                            text: text.into_owned(),
                            plain: style == ScalarStyle::Plain,
                        },
                        pos,
                    },
                    anchor,
                )
            }
            Event::Alias(id) => {
                let Some(target) = anchors.get(&id) else {
                    return Err(Error::new(
                        pos,
                        "an alias of an anchor that is not defined before it (or that contains it)",
                    ));
                };
                budget.spend(pos, target.nodes, target.bytes, limits)?;
                (target.clone(), 0)
            }
        };
        if anchor != 0 {
            // The copy kept for aliases is paid for like any other.
            budget.spend(node.pos, node.nodes, node.bytes, limits)?;
            anchors.insert(anchor, node.clone());
        }
        match open.last_mut() {
            Some(parent) => parent.items.push(node),
            None => documents.push(node),
        }
    }
    Ok(documents)
}

/// The node of a closed sequence or mapping.
fn collection(done: Open) -> Node {
    let nodes = 1 + done.items.iter().map(|n| n.nodes).sum::<usize>();
    let bytes = done.items.iter().map(|n| n.bytes).sum();
    let value = if done.map {
        let mut entries = Vec::with_capacity(done.items.len() / 2);
        let mut items = done.items.into_iter();
        while let Some(key) = items.next() {
            // The parser always gives a mapping's value (an empty scalar when it is missing).
            let value = items.next().unwrap_or_else(|| Node {
                value: Value::Scalar {
                    text: String::new(),
                    plain: true,
                },
                pos: key.pos,
                nodes: 1,
                bytes: 0,
            });
            entries.push((key, value));
        }
        Value::Map(entries)
    } else {
        Value::Seq(done.items)
    };
    Node {
        value,
        pos: done.pos,
        nodes,
        bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        documents: 4,
        depth: 8,
        nodes: 1000,
        bytes: 10_000,
    };

    fn scalar(node: &Node) -> &str {
        match &node.value {
            Value::Scalar { text, .. } => text,
            other => panic!("not a scalar: {other:?}"),
        }
    }

    /// Documents, mappings, lists and scalars are read with their positions.
    #[test]
    fn reads_documents_with_positions() {
        let docs = documents("a: 1\nb: [x, 'y']\n---\n- &k {c: d}\n- *k\n", &LIMITS).unwrap();
        assert_eq!(docs.len(), 2);
        let Value::Map(entries) = &docs[0].value else {
            panic!("{:?}", docs[0])
        };
        assert_eq!(scalar(&entries[0].0), "a");
        assert_eq!(entries[1].1.pos, Pos { line: 2, column: 4 });
        let Value::Seq(items) = &entries[1].1.value else {
            panic!()
        };
        assert!(matches!(
            &items[1].value,
            Value::Scalar { plain: false, .. }
        ));
        let Value::Seq(items) = &docs[1].value else {
            panic!()
        };
        assert_eq!(items[0].value, items[1].value, "an alias is a copy");
    }

    /// A syntax error stops the reader with its position.
    #[test]
    fn syntax_errors_stop_with_a_position() {
        for (text, line, column) in [
            ("domain: x\ndescriptors: [\n  - key: a\n", 3, 3),
            ("domain: \"x\ndescriptors:\n  - key: a\n", 1, 9),
        ] {
            let e = documents(text, &LIMITS).expect_err(text);
            assert_eq!(e.pos, Pos { line, column }, "{e:?}");
        }
    }

    /// Nesting, nodes, documents, alias expansion and tags are refused past their limits.
    #[test]
    fn limits_are_enforced() {
        let deep = format!("{}{}", "[".repeat(9), "]".repeat(9));
        assert!(
            documents(&deep, &LIMITS)
                .unwrap_err()
                .message
                .contains("nest deeper")
        );
        let wide = format!("[{}]", "a,".repeat(1000));
        assert!(
            documents(&wide, &LIMITS)
                .unwrap_err()
                .message
                .contains("nodes")
        );
        let many = "---\na\n".repeat(5);
        assert!(
            documents(&many, &LIMITS)
                .unwrap_err()
                .message
                .contains("documents")
        );
        let laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n";
        assert!(
            documents(laughs, &LIMITS)
                .unwrap_err()
                .message
                .contains("aliases")
        );
        let tagged = documents("a: !!str 1\n", &LIMITS).unwrap_err();
        assert_eq!(tagged.pos, Pos { line: 1, column: 4 });
        assert!(documents("a: &x [*x]\n", &LIMITS).is_err());
    }
}
