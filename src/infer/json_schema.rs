//! Structured output: generation constrained to JSON that validates against a JSON Schema
//! (OpenAI's `response_format: {"type": "json_schema", ...}`), in the subset OpenAI's strict
//! mode takes: objects whose properties are all required, arrays of one item schema,
//! strings (or an `enum` of strings), numbers, integers, booleans and null.
//!
//! `Schema::compile` turns a schema into a flat tree of nodes, refusing with a message what
//! it does not support. `SchemaMachine` runs beside the JSON byte automaton (`JsonMachine`,
//! which keeps the text JSON) and refuses the bytes the schema rules out: a key other than the
//! next one due, a value of another type, a close before every key is written, a fraction in
//! an integer, a string outside its enum, whitespace between tokens (the text is compact
//! JSON). Keys come in the order of `properties` sorted by name. `to_close` counts the fewest
//! bytes that finish a valid document from here, so the budget mask (`JsonConstraint::mask`)
//! always leaves room to close it.

use super::json::{ws, At, JsonMachine, MAX_DEPTH};
use serde_json::Value;

/// Enum values a string node takes at most (a bit each in the machine's state).
pub const MAX_ENUM: usize = 64;
/// Nodes a schema compiles to at most.
pub const MAX_NODES: usize = 4096;

#[derive(Clone, Debug, PartialEq)]
enum Node {
    /// keys (each JSON-encoded with its quotes) and their value nodes, in order
    Object(Vec<(Vec<u8>, usize)>),
    Array(usize),
    String,
    /// the JSON encodings of the allowed strings, with their quotes
    Enum(Vec<Vec<u8>>),
    Number,
    Integer,
    Boolean,
    Null,
}

/// A compiled schema: its nodes (the root first) and each node's shortest valid text.
#[derive(Clone, Debug, PartialEq)]
pub struct Schema {
    nodes: Vec<Node>,
    shortest: Vec<usize>,
}

/// Keywords that say nothing the constraint must enforce.
const IGNORED: &[&str] = &[
    "title",
    "description",
    "$schema",
    "additionalProperties",
    "examples",
];

impl Schema {
    /// Compiles `schema` (a JSON Schema whose root is an object); the error names the first
    /// feature not supported.
    pub fn compile(schema: &Value) -> Result<Schema, String> {
        let mut s = Schema {
            nodes: Vec::new(),
            shortest: Vec::new(),
        };
        s.node(schema, "schema", 0)?;
        if !matches!(s.nodes[0], Node::Object(_)) {
            return Err("the schema's root must be {\"type\": \"object\", ...}".into());
        }
        Ok(s)
    }

    /// The length of the shortest valid text.
    pub fn shortest(&self) -> usize {
        self.shortest[0]
    }

    /// Adds the node of `v` (at `path`, `depth` containers deep) and its children; its index.
    fn node(&mut self, v: &Value, path: &str, depth: usize) -> Result<usize, String> {
        // 1. The keywords: known ones only
        let o = v
            .as_object()
            .ok_or_else(|| format!("{path} must be a JSON object, got {v}"))?;
        let known = ["type", "properties", "required", "items", "enum"];
        if let Some(k) = o
            .keys()
            .find(|k| !known.contains(&k.as_str()) && !IGNORED.contains(&k.as_str()))
        {
            return Err(format!("{path}: the keyword `{k}` is not supported (supported: type, properties, required, items, enum; ignored: {})", IGNORED.join(", ")));
        }
        if depth >= MAX_DEPTH || self.nodes.len() >= MAX_NODES {
            return Err(format!("{path}: the schema nests deeper than {MAX_DEPTH} or has more than {MAX_NODES} parts"));
        }
        let at = self.nodes.len();
        self.nodes.push(Node::Null);
        self.shortest.push(0);
        // 2. The node by its type (an enum of strings may leave the type out)
        let ty = match o.get("type") {
            None if o.contains_key("enum") => "string",
            None => return Err(format!("{path}: give a `type`")),
            Some(Value::String(t)) => t.as_str(),
            Some(t) => {
                return Err(format!(
                "{path}: `type` must be one type name, got {t} (a list of types is not supported)"
            ))
            }
        };
        if o.contains_key("enum") && ty != "string" {
            return Err(format!("{path}: `enum` is supported on strings only"));
        }
        let node = match ty {
            "object" => self.object(o, path, depth)?,
            "array" => {
                let items = o
                    .get("items")
                    .ok_or_else(|| format!("{path}: an array needs `items`"))?;
                Node::Array(self.node(items, &format!("{path}.items"), depth + 1)?)
            }
            "string" => match o.get("enum") {
                None => Node::String,
                Some(Value::Array(vals)) if !vals.is_empty() && vals.len() <= MAX_ENUM => {
                    let enc = vals
                        .iter()
                        .map(|x| match x {
                            Value::String(_) => Ok(x.to_string().into_bytes()),
                            _ => Err(format!("{path}.enum: only strings are supported, got {x}")),
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    Node::Enum(enc)
                }
                Some(e) => {
                    return Err(format!(
                        "{path}.enum must be a list of 1 to {MAX_ENUM} strings, got {e}"
                    ))
                }
            },
            "number" => Node::Number,
            "integer" => Node::Integer,
            "boolean" => Node::Boolean,
            "null" => Node::Null,
            t => return Err(format!("{path}: unknown type `{t}`")),
        };
        self.shortest[at] = self.shortest_of(&node);
        self.nodes[at] = node;
        Ok(at)
    }

    /// An object's keys in order, each required.
    fn object(
        &mut self,
        o: &serde_json::Map<String, Value>,
        path: &str,
        depth: usize,
    ) -> Result<Node, String> {
        let props = match o.get("properties") {
            Some(Value::Object(p)) if !p.is_empty() => p,
            _ => {
                return Err(format!(
                    "{path}: an object needs `properties`, a non-empty object"
                ))
            }
        };
        let required: Vec<&str> = match o.get("required") {
            Some(Value::Array(r)) => r.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        if let Some(k) = props.keys().find(|k| !required.contains(&k.as_str())) {
            return Err(format!("{path}: every property must be in `required` (as OpenAI's strict mode asks); `{k}` is not"));
        }
        let mut keys = Vec::with_capacity(props.len());
        for (k, v) in props {
            let child = self.node(v, &format!("{path}.properties.{k}"), depth + 1)?;
            keys.push((Value::String(k.clone()).to_string().into_bytes(), child));
        }
        Ok(Node::Object(keys))
    }

    /// The length of the shortest text of `n` (its children are compiled).
    fn shortest_of(&self, n: &Node) -> usize {
        match n {
            Node::Object(keys) => {
                let fields: usize = keys
                    .iter()
                    .map(|(k, c)| k.len() + 1 + self.shortest[*c])
                    .sum();
                2 + fields + keys.len().saturating_sub(1)
            }
            Node::Array(_) | Node::String => 2,
            Node::Enum(vals) => vals.iter().map(Vec::len).min().unwrap_or(2),
            Node::Number | Node::Integer => 1,
            Node::Boolean | Node::Null => 4,
        }
    }
}

/// An open container: its node and, for an object, the keys begun so far and the bytes of
/// the last one's key matched.
#[derive(Clone, Copy, Debug, Default)]
struct Frame {
    node: u16,
    started: u16,
    key_pos: u16,
}

/// A string value of an enum in progress: the values still possible and the bytes matched.
#[derive(Clone, Copy, Debug)]
struct EnumAt {
    node: u16,
    maybe: u64,
    pos: u16,
}

/// The schema's automaton over the bytes of the text, beside the JSON one: a small copyable
/// state; every method takes the schema it was made for.
#[derive(Clone, Copy, Debug)]
pub struct SchemaMachine {
    json: JsonMachine,
    frames: [Frame; MAX_DEPTH],
    depth: usize,
    enum_at: Option<EnumAt>,
    /// inside a number of an integer node
    integer: bool,
}

impl Default for SchemaMachine {
    fn default() -> Self {
        SchemaMachine {
            json: JsonMachine::default(),
            frames: [Frame::default(); MAX_DEPTH],
            depth: 0,
            enum_at: None,
            integer: false,
        }
    }
}

impl SchemaMachine {
    /// Whether the document is complete.
    pub fn done(&self) -> bool {
        self.json.done()
    }

    /// Takes `bytes` in order; false where one leaves the schema.
    pub fn feed(&mut self, s: &Schema, bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| self.step(s, b))
    }

    /// Takes one byte; false (and the machine left as it was) where it leaves the schema.
    pub fn step(&mut self, s: &Schema, b: u8) -> bool {
        let mut next = *self;
        if !next.json.step(b) {
            return false;
        }
        let (before, after) = (self.json.at, next.json.at);
        let ok = match before {
            At::Str { key, .. } | At::Escape { key } | At::Unicode { key, .. } => {
                next.in_string(s, key, b, after)
            }
            At::Num(_) if matches!(after, At::Num(_)) => {
                !(next.integer && matches!(b, b'.' | b'e' | b'E'))
            }
            At::Literal(_) => true,
            // a number ended by this byte, or a byte between tokens
            _ => {
                next.integer = false;
                !ws(b) && next.structural(s, b, before)
            }
        };
        if ok {
            *self = next;
        }
        ok
    }

    /// A byte inside a key (matched against the key due) or a string value (against its
    /// enum's values, when it has one).
    fn in_string(&mut self, s: &Schema, key: bool, b: u8, after: At) -> bool {
        if key {
            let f = &mut self.frames[self.depth - 1];
            let Node::Object(keys) = &s.nodes[f.node as usize] else {
                return false;
            };
            let want = &keys[f.started as usize - 1].0;
            if want.get(f.key_pos as usize) != Some(&b) {
                return false;
            }
            f.key_pos += 1;
            return after != At::Colon || f.key_pos as usize == want.len();
        }
        let Some(e) = self.enum_at.as_mut() else {
            return true;
        };
        let Node::Enum(vals) = &s.nodes[e.node as usize] else {
            return false;
        };
        let pos = e.pos as usize;
        for (i, v) in vals.iter().enumerate() {
            let ends = pos + 1 == v.len();
            let fits = v.get(pos) == Some(&b) && (after != At::After || ends);
            if !fits {
                e.maybe &= !(1u64 << i);
            }
        }
        e.pos += 1;
        let alive = e.maybe != 0;
        if after == At::After {
            self.enum_at = None;
        }
        alive
    }

    /// A byte between tokens: a value's first byte, a key's quote, `:`, `,` or a close.
    fn structural(&mut self, s: &Schema, b: u8, before: At) -> bool {
        let top = self.depth.checked_sub(1).map(|i| self.frames[i]);
        let node = |f: Frame| &s.nodes[f.node as usize];
        match (before, b) {
            (At::Start, _) => self.value(s, 0, b),
            (_, b'}') => match top.map(|f| (f, node(f))) {
                Some((f, Node::Object(keys))) if f.started as usize == keys.len() => {
                    self.depth -= 1;
                    true
                }
                _ => false,
            },
            (_, b']') => {
                self.depth -= 1;
                true
            }
            (At::Value { .. }, _) => match top.map(|f| (f, node(f))) {
                Some((f, Node::Object(keys))) => self.value(s, keys[f.started as usize - 1].1, b),
                Some((_, Node::Array(items))) => self.value(s, *items, b),
                _ => false,
            },
            (At::Key { .. }, b'"') => {
                let f = &mut self.frames[self.depth - 1];
                match &s.nodes[f.node as usize] {
                    Node::Object(keys) if (f.started as usize) < keys.len() => {
                        f.started += 1;
                        f.key_pos = 1;
                        true
                    }
                    _ => false,
                }
            }
            (_, b',') => match top.map(|f| (f, node(f))) {
                Some((f, Node::Object(keys))) => (f.started as usize) < keys.len(),
                _ => true,
            },
            (_, b':') => true,
            _ => false,
        }
    }

    /// The first byte of a value of `node`.
    fn value(&mut self, s: &Schema, node: usize, b: u8) -> bool {
        match &s.nodes[node] {
            Node::Object(_) | Node::Array(_) => {
                let open = match s.nodes[node] {
                    Node::Object(_) => b'{',
                    _ => b'[',
                };
                self.frames[self.depth] = Frame {
                    node: node as u16,
                    ..Frame::default()
                };
                self.depth += 1;
                b == open
            }
            Node::String => b == b'"',
            Node::Enum(vals) => {
                self.enum_at = Some(EnumAt {
                    node: node as u16,
                    maybe: if vals.len() == 64 {
                        u64::MAX
                    } else {
                        (1u64 << vals.len()) - 1
                    },
                    pos: 1,
                });
                b == b'"'
            }
            Node::Number => b == b'-' || b.is_ascii_digit(),
            Node::Integer => {
                self.integer = true;
                b == b'-' || b.is_ascii_digit()
            }
            Node::Boolean => b == b't' || b == b'f',
            Node::Null => b == b'n',
        }
    }

    /// The fewest bytes that finish a document valid under the schema from here.
    pub fn to_close(&self, s: &Schema) -> usize {
        // 1. The token in progress, and whether the innermost object's next key needs a comma
        let top = self.depth.checked_sub(1).map(|i| self.frames[i]);
        let key_node = |f: Frame| match &s.nodes[f.node as usize] {
            Node::Object(keys) => Some(&keys[f.started as usize - 1]),
            _ => None,
        };
        let (mut n, mut comma) = (0, true);
        match self.json.at {
            At::Start => return s.shortest[0],
            At::Done => return 0,
            At::Str { key: true, .. }
            | At::Escape { key: true }
            | At::Unicode { key: true, .. } => {
                let f = top.expect("a key is in an object");
                let (k, c) = key_node(f).expect("a key is in an object");
                n += k.len() - f.key_pos as usize + 1 + s.shortest[*c];
            }
            At::Str { .. } | At::Escape { .. } | At::Unicode { .. } => {
                n += match (self.enum_at, self.json.here()) {
                    (Some(e), _) => match &s.nodes[e.node as usize] {
                        Node::Enum(vals) => (0..vals.len())
                            .filter(|i| e.maybe >> i & 1 == 1)
                            .map(|i| vals[i].len() - e.pos as usize)
                            .min()
                            .unwrap_or(0),
                        _ => 0,
                    },
                    (None, here) => here,
                };
            }
            At::Colon => {
                let (_, c) = key_node(top.expect("a colon is in an object")).expect("an object");
                n += 1 + s.shortest[*c];
            }
            At::Value { close: false } => {
                let f = top.expect("a value after a colon or comma is in a container");
                n += match &s.nodes[f.node as usize] {
                    Node::Object(keys) => s.shortest[keys[f.started as usize - 1].1],
                    Node::Array(items) => s.shortest[*items],
                    _ => 0,
                };
            }
            At::Key { .. } => comma = false,
            _ => n += self.json.here(),
        }
        // 2. Each open container, innermost first: the keys still due, then its close
        for f in self.frames[..self.depth].iter().rev() {
            if let Node::Object(keys) = &s.nodes[f.node as usize] {
                for (i, (k, c)) in keys[f.started as usize..].iter().enumerate() {
                    n += usize::from(comma || i > 0) + k.len() + 1 + s.shortest[*c];
                }
            }
            n += 1;
            comma = true;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Schema {
        Schema::compile(&json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer"},
                "mood": {"enum": ["calm", "cross"]},
                "tags": {"type": "array", "items": {"type": "number"}},
                "pet": {"type": "object", "properties": {"ok": {"type": "boolean"}, "none": {"type": "null"}}, "required": ["ok", "none"]}
            },
            "required": ["name", "age", "mood", "tags", "pet"],
            "additionalProperties": false
        }))
        .unwrap()
    }

    fn accepts(s: &Schema, text: &str) -> bool {
        let mut m = SchemaMachine::default();
        m.feed(s, text.as_bytes()) && m.done()
    }

    #[test]
    fn the_machine_takes_what_the_schema_allows_and_refuses_the_rest() {
        let s = schema();
        // keys in the order of the properties sorted by name
        let good = r#"{"age":-3,"mood":"cross","name":"A \"b\" é","pet":{"none":null,"ok":true},"tags":[1.5,-2e3,0]}"#;
        assert!(accepts(&s, good));
        assert!(accepts(
            &s,
            r#"{"age":0,"mood":"calm","name":"","pet":{"none":null,"ok":false},"tags":[]}"#
        ));
        for bad in [
            // a key missing, out of order, extra or misspelt
            r#"{"age":1,"mood":"calm","name":"x","pet":{"none":null,"ok":true}}"#,
            r#"{"mood":"calm","age":1,"name":"x","pet":{"none":null,"ok":true},"tags":[]}"#,
            r#"{"age":1,"mood":"calm","name":"x","pet":{"none":null,"ok":true},"tags":[],"x":1}"#,
            r#"{"agf":1,"mood":"calm","name":"x","pet":{"none":null,"ok":true},"tags":[]}"#,
            r#"{"ag":1,"mood":"calm","name":"x","pet":{"none":null,"ok":true},"tags":[]}"#,
            // a value of another type, a fraction in an integer, a string outside the enum
            r#"{"age":"1","mood":"calm","name":"x","pet":{"none":null,"ok":true},"tags":[]}"#,
            r#"{"age":1.5,"mood":"calm","name":"x","pet":{"none":null,"ok":true},"tags":[]}"#,
            r#"{"age":1e3,"mood":"calm","name":"x","pet":{"none":null,"ok":true},"tags":[]}"#,
            r#"{"age":1,"mood":"cal","name":"x","pet":{"none":null,"ok":true},"tags":[]}"#,
            r#"{"age":1,"mood":"calmer","name":"x","pet":{"none":null,"ok":true},"tags":[]}"#,
            r#"{"age":1,"mood":"calm","name":"x","pet":{"none":null,"ok":1},"tags":[]}"#,
            r#"{"age":1,"mood":"calm","name":"x","pet":{"none":null,"ok":true},"tags":["1"]}"#,
            // whitespace between tokens
            r#"{ "age":1,"mood":"calm","name":"x","pet":{"none":null,"ok":true},"tags":[]}"#,
        ] {
            assert!(!accepts(&s, bad), "{bad}");
            // and every text it takes is valid JSON of the schema's shape
            assert!(serde_json::from_str::<Value>(bad).is_ok());
        }
    }

    #[test]
    fn unsupported_schemas_are_named() {
        for (schema, says) in [
            (json!({"type": "string"}), "root must be"),
            (
                json!({"type": "object", "properties": {"a": {"type": "string"}}}),
                "every property must be in `required`",
            ),
            (
                json!({"type": "object", "properties": {"a": {"anyOf": []}}, "required": ["a"]}),
                "`anyOf` is not supported",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": ["string", "null"]}}, "required": ["a"]}),
                "a list of types",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}, "required": ["a"]}),
                "`pattern`",
            ),
            (
                json!({"type": "object", "properties": {"a": {"enum": [1, 2]}}, "required": ["a"]}),
                "only strings",
            ),
            (json!({"type": "object"}), "needs `properties`"),
        ] {
            let e = Schema::compile(&schema).unwrap_err();
            assert!(e.contains(says), "{schema}: {e}");
        }
    }

    /// `to_close` is exact: a breadth-first search over every byte finds the same length.
    #[test]
    fn to_close_counts_the_bytes_that_finish_a_valid_document() {
        let s = schema();
        let full =
            r#"{"age":-3,"mood":"cross","name":"A","pet":{"none":null,"ok":true},"tags":[1.5,0]}"#;
        for cut in 0..full.len() {
            let mut m = SchemaMachine::default();
            assert!(m.feed(&s, &full.as_bytes()[..cut]), "{cut}");
            let mut level = vec![m];
            let mut steps = 0;
            while !level.iter().any(SchemaMachine::done) {
                let mut next: Vec<SchemaMachine> = Vec::new();
                for m in &level {
                    for b in 0x20..0x7fu8 {
                        let mut n = *m;
                        if n.step(&s, b) {
                            next.push(n);
                        }
                    }
                }
                // states are many; keep those closest to the end
                next.sort_by_key(|m| m.to_close(&s));
                next.truncate(64);
                level = next;
                steps += 1;
                assert!(steps <= 80, "cut {cut}");
            }
            assert_eq!(m.to_close(&s), steps, "after {:?}", &full[..cut]);
        }
    }
}
