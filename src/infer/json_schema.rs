//! Structured output: generation constrained to JSON that validates against a JSON Schema
//! (OpenAI's `response_format: {"type": "json_schema", ...}`), in the subset OpenAI's strict
//! mode takes: objects whose properties are all required, arrays of one item schema,
//! strings (or an `enum` or `const` of strings), numbers, integers, booleans and null;
//! alternatives (`anyOf`, or a list of types such as `["string", "null"]`) of different JSON
//! types; references (`$ref`) into `$defs` or `definitions`, recursive ones too: what the
//! `openai` client sends for a Pydantic model.
//!
//! `Schema::compile` turns a schema into a graph of nodes (a reference is its definition's
//! node, compiled once), refusing with a message what it does not support. `SchemaMachine`
//! runs beside the JSON byte automaton (`JsonMachine`, which keeps the text JSON) and refuses
//! the bytes the schema rules out: a key other than the next one due, a value of another type,
//! a close before every key is written, a fraction in an integer, a string outside its enum,
//! whitespace between tokens (the text is compact JSON). Keys come in the order of
//! `properties` sorted by name; an alternative is chosen by its value's first byte. `to_close`
//! counts the fewest bytes that finish a valid document from here, so the budget mask
//! (`JsonConstraint::mask`) always leaves room to close it.

use super::json::{ws, At, JsonMachine, MAX_DEPTH};
use serde_json::Value;
use std::collections::HashMap;

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
    /// alternatives of different JSON types, told apart by a value's first byte
    AnyOf(Vec<usize>),
}

/// A compiled schema: its nodes (the root first), each node's shortest valid text and the
/// fewest containers such a text opens, one inside the other.
#[derive(Clone, Debug, PartialEq)]
pub struct Schema {
    nodes: Vec<Node>,
    shortest: Vec<usize>,
    nesting: Vec<usize>,
}

/// Keywords that say nothing the constraint must enforce (`$defs` and `definitions` are read
/// where a `$ref` points into them).
const IGNORED: &[&str] = &[
    "title",
    "description",
    "$schema",
    "additionalProperties",
    "examples",
    "default",
    "$defs",
    "definitions",
];

/// The keywords a node may have.
const KNOWN: &[&str] = &[
    "type",
    "properties",
    "required",
    "items",
    "enum",
    "const",
    "anyOf",
    "$ref",
];

/// A length no text reaches: a node not (yet) known to have a finite text.
const FAR: usize = usize::MAX / 4;

/// The JSON types, a bit each: what a value's first byte tells apart.
const JSON_TYPES: [&str; 6] = ["object", "array", "string", "number", "boolean", "null"];

impl Schema {
    /// Compiles `schema` (a JSON Schema whose root is an object); the error names the first
    /// feature not supported.
    pub fn compile(schema: &Value) -> Result<Schema, String> {
        // 1. The nodes, each reference compiled once (the root is "#")
        let mut c = Compiler {
            s: Schema {
                nodes: Vec::new(),
                shortest: Vec::new(),
                nesting: Vec::new(),
            },
            root: schema,
            refs: HashMap::from([("#".to_string(), 0)]),
        };
        c.node(schema, "schema", 0)?;
        let mut s = c.s;
        if !matches!(s.nodes[0], Node::Object(_)) {
            return Err("the schema's root must be {\"type\": \"object\", ...}".into());
        }
        // 2. Each node's shortest text and nesting, to their fixed point (references may cycle)
        s.settle();
        if s.shortest[0] >= FAR {
            return Err(
                "the schema has no finite document (an object that must always contain itself)"
                    .into(),
            );
        }
        if s.nesting[0] > MAX_DEPTH {
            return Err(format!(
                "the schema's shortest document nests deeper than {MAX_DEPTH} containers"
            ));
        }
        // 3. Alternatives told apart by their first byte
        for (i, n) in s.nodes.iter().enumerate() {
            if let Node::AnyOf(alts) = n {
                let mut seen = 0u8;
                for &a in alts {
                    let t = s.types(a, 0);
                    if t & seen != 0 || t == 0 {
                        let name = JSON_TYPES[(t & seen).max(t).trailing_zeros().min(5) as usize];
                        return Err(format!("anyOf (node {i}): two alternatives are both of type {name}; alternatives must be of different JSON types (object, array, string, number, boolean, null)"));
                    }
                    seen |= t;
                }
            }
        }
        Ok(s)
    }

    /// The length of the shortest valid text.
    pub fn shortest(&self) -> usize {
        self.shortest[0]
    }

    /// Every node's shortest text and nesting, lowered from FAR until nothing changes (each
    /// round settles one more level of the cheapest texts, so at most a round a node).
    fn settle(&mut self) {
        self.shortest = vec![FAR; self.nodes.len()];
        self.nesting = vec![FAR; self.nodes.len()];
        for _ in 0..=self.nodes.len() {
            let mut changed = false;
            for i in 0..self.nodes.len() {
                let (l, d) = (
                    self.shortest_of(&self.nodes[i]),
                    self.nesting_of(&self.nodes[i]),
                );
                changed |= l < self.shortest[i] || d < self.nesting[i];
                self.shortest[i] = self.shortest[i].min(l);
                self.nesting[i] = self.nesting[i].min(d);
            }
            if !changed {
                break;
            }
        }
    }

    /// The length of the shortest text of `n`, from its children's (FAR where one is FAR).
    fn shortest_of(&self, n: &Node) -> usize {
        let len = match n {
            Node::Object(keys) => keys.iter().fold(1 + keys.len(), |n, (k, c)| {
                n.saturating_add(k.len() + 1)
                    .saturating_add(self.shortest[*c])
            }),
            Node::Array(_) | Node::String => 2,
            Node::Enum(vals) => vals.iter().map(Vec::len).min().unwrap_or(2),
            Node::Number | Node::Integer => 1,
            Node::Boolean | Node::Null => 4,
            Node::AnyOf(alts) => alts.iter().map(|&a| self.shortest[a]).min().unwrap_or(FAR),
        };
        len.min(FAR)
    }

    /// The fewest containers a text of `n` opens one inside another.
    fn nesting_of(&self, n: &Node) -> usize {
        let d = match n {
            Node::Object(keys) => {
                1 + keys
                    .iter()
                    .map(|(_, c)| self.nesting[*c])
                    .max()
                    .unwrap_or(0)
            }
            Node::Array(_) => 1,
            Node::AnyOf(alts) => alts.iter().map(|&a| self.nesting[a]).min().unwrap_or(FAR),
            _ => 0,
        };
        d.min(FAR)
    }

    /// The JSON types (bits of `JSON_TYPES`) a text of node `i` may have.
    fn types(&self, i: usize, depth: usize) -> u8 {
        match &self.nodes[i] {
            Node::Object(_) => 1,
            Node::Array(_) => 2,
            Node::String | Node::Enum(_) => 4,
            Node::Number | Node::Integer => 8,
            Node::Boolean => 16,
            Node::Null => 32,
            // (an alternative that is itself alternatives; a cycle of them has no text)
            Node::AnyOf(alts) if depth < self.nodes.len() => {
                alts.iter().fold(0, |t, &a| t | self.types(a, depth + 1))
            }
            Node::AnyOf(_) => 0,
        }
    }
}

/// What `Schema::compile` keeps while it walks a schema: the schema so far, the document (for
/// references) and each reference's node.
struct Compiler<'a> {
    s: Schema,
    root: &'a Value,
    refs: HashMap<String, usize>,
}

impl Compiler<'_> {
    /// The node of `v` (at `path`, `depth` containers deep), added with its children; its index.
    fn node(&mut self, v: &Value, path: &str, depth: usize) -> Result<usize, String> {
        // 1. The keywords: known ones only, and not too deep
        let o = v
            .as_object()
            .ok_or_else(|| format!("{path} must be a JSON object, got {v}"))?;
        if let Some(k) = o
            .keys()
            .find(|k| !KNOWN.contains(&k.as_str()) && !IGNORED.contains(&k.as_str()))
        {
            return Err(format!(
                "{path}: the keyword `{k}` is not supported (supported: {}; ignored: {})",
                KNOWN.join(", "),
                IGNORED.join(", ")
            ));
        }
        if depth >= MAX_DEPTH || self.s.nodes.len() >= MAX_NODES {
            return Err(format!("{path}: the schema nests deeper than {MAX_DEPTH} or has more than {MAX_NODES} parts"));
        }
        let alone = |k: &str| -> Result<(), String> {
            match o
                .keys()
                .find(|x| x.as_str() != k && KNOWN.contains(&x.as_str()))
            {
                Some(x) => Err(format!(
                    "{path}: `{k}` with `{x}` beside it is not supported"
                )),
                None => Ok(()),
            }
        };
        // 2. A reference: its definition's node, compiled the first time
        if let Some(r) = o.get("$ref") {
            alone("$ref")?;
            let r = r
                .as_str()
                .ok_or_else(|| format!("{path}.$ref must be a string"))?;
            if let Some(&at) = self.refs.get(r) {
                return Ok(at);
            }
            let target = r
                .strip_prefix('#')
                .and_then(|p| self.root.pointer(p))
                .ok_or_else(|| format!("{path}: `$ref` {r:?} names nothing in the schema (only references inside it, \"#/$defs/Name\", are supported)"))?;
            let at = self.add();
            self.refs.insert(r.to_string(), at);
            return self.fill(at, target, r, depth + 1);
        }
        let at = self.add();
        self.fill(at, v, path, depth)
    }

    /// A placeholder node, filled by `fill`.
    fn add(&mut self) -> usize {
        self.s.nodes.push(Node::Null);
        self.s.nodes.len() - 1
    }

    /// Node `at` made the node of `v`, a schema without `$ref`; `at`.
    fn fill(&mut self, at: usize, v: &Value, path: &str, depth: usize) -> Result<usize, String> {
        let o = v
            .as_object()
            .ok_or_else(|| format!("{path} must be a JSON object, got {v}"))?;
        if o.contains_key("$ref") {
            // (a definition that is only a reference to another)
            let to = self.node(v, path, depth)?;
            self.s.nodes[at] = Node::AnyOf(vec![to]);
            return Ok(at);
        }
        // 1. Alternatives: `anyOf`, or a list of types (each the node with that one type)
        let alts: Option<Vec<Value>> = match (o.get("anyOf"), o.get("type")) {
            (Some(Value::Array(alts)), _) if !alts.is_empty() => {
                if let Some(x) = o
                    .keys()
                    .find(|x| x.as_str() != "anyOf" && KNOWN.contains(&x.as_str()))
                {
                    return Err(format!(
                        "{path}: `anyOf` with `{x}` beside it is not supported"
                    ));
                }
                Some(alts.clone())
            }
            (Some(a), _) => {
                return Err(format!(
                    "{path}.anyOf must be a non-empty list of schemas, got {a}"
                ))
            }
            (None, Some(Value::Array(types))) if !types.is_empty() => Some(
                types
                    .iter()
                    .map(|t| {
                        let mut one = o.clone();
                        one.insert("type".into(), t.clone());
                        Value::Object(one)
                    })
                    .collect(),
            ),
            _ => None,
        };
        if let Some(alts) = alts {
            let mut nodes = Vec::with_capacity(alts.len());
            for (i, a) in alts.iter().enumerate() {
                nodes.push(self.node(a, &format!("{path}.anyOf[{i}]"), depth)?);
            }
            self.s.nodes[at] = Node::AnyOf(nodes);
            return Ok(at);
        }
        // 2. The node by its type (an enum or const of strings may leave the type out)
        let strings = o.contains_key("enum") || o.contains_key("const");
        let ty = match o.get("type") {
            None if strings => "string",
            None => return Err(format!("{path}: give a `type`")),
            Some(Value::String(t)) => t.as_str(),
            Some(t) => {
                return Err(format!(
                    "{path}: `type` must be a type name or a list of them, got {t}"
                ))
            }
        };
        if strings && ty != "string" {
            return Err(format!(
                "{path}: `enum` and `const` are supported on strings only"
            ));
        }
        let node = match ty {
            "object" => self.object(o, path, depth)?,
            "array" => {
                let items = o
                    .get("items")
                    .ok_or_else(|| format!("{path}: an array needs `items`"))?;
                Node::Array(self.node(items, &format!("{path}.items"), depth + 1)?)
            }
            "string" => match (o.get("enum"), o.get("const")) {
                (None, None) => Node::String,
                (Some(_), Some(_)) => {
                    return Err(format!("{path}: give `enum` or `const`, not both"))
                }
                (None, Some(c)) => Node::Enum(vec![string_literal(c, &format!("{path}.const"))?]),
                (Some(Value::Array(vals)), None) if !vals.is_empty() && vals.len() <= MAX_ENUM => {
                    let path = format!("{path}.enum");
                    Node::Enum(
                        vals.iter()
                            .map(|x| string_literal(x, &path))
                            .collect::<Result<_, _>>()?,
                    )
                }
                (Some(e), None) => {
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
        self.s.nodes[at] = node;
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
            return Err(format!("{path}: every property must be in `required` (as OpenAI's strict mode asks; an optional one is written as required with {{\"anyOf\": [..., {{\"type\": \"null\"}}]}}); `{k}` is not"));
        }
        let mut keys = Vec::with_capacity(props.len());
        for (k, v) in props {
            let child = self.node(v, &format!("{path}.properties.{k}"), depth + 1)?;
            keys.push((Value::String(k.clone()).to_string().into_bytes(), child));
        }
        Ok(Node::Object(keys))
    }
}

/// A string of an `enum` or `const`, JSON-encoded with its quotes.
fn string_literal(x: &Value, path: &str) -> Result<Vec<u8>, String> {
    match x {
        Value::String(_) => Ok(x.to_string().into_bytes()),
        _ => Err(format!("{path}: only strings are supported, got {x}")),
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
            // the one alternative this byte can begin (their JSON types differ)
            Node::AnyOf(alts) => alts.iter().any(|&a| {
                let mut m = *self;
                let ok = m.value(s, a, b);
                if ok {
                    *self = m;
                }
                ok
            }),
            // (a container whose shortest text would nest past the limit is not begun)
            Node::Object(_) | Node::Array(_) if self.depth + s.nesting[node] > MAX_DEPTH => false,
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
                "non-empty list",
            ),
            (
                json!({"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}, {"enum": ["x"]}]}}, "required": ["a"]}),
                "both of type string",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": ["number", "integer"]}}, "required": ["a"]}),
                "both of type number",
            ),
            (
                json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/B"}}, "required": ["a"]}),
                "names nothing",
            ),
            (
                json!({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}),
                "no finite document",
            ),
            (
                json!({"type": "object", "properties": {"a": {"const": 3}}, "required": ["a"]}),
                "only strings",
            ),
            (
                json!({"type": "object", "properties": {"a": {"anyOf": [{"type": "null"}], "type": "string"}}, "required": ["a"]}),
                "beside it",
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

    /// A schema as the `openai` client sends it for Pydantic models (`client.beta.chat.
    /// completions.parse(response_format=Person)`, strict mode): definitions in `$defs` used
    /// through `$ref`, `Optional` fields as `anyOf` with null, titles, a recursive `Person`.
    fn pydantic() -> Schema {
        Schema::compile(&json!({
            "$defs": {
                "Pet": {
                    "properties": {
                        "kind": {"enum": ["cat", "dog"], "title": "Kind", "type": "string"},
                        "name": {"title": "Name", "type": "string"}
                    },
                    "required": ["kind", "name"], "title": "Pet", "type": "object",
                    "additionalProperties": false
                }
            },
            "properties": {
                "age": {"anyOf": [{"type": "integer"}, {"type": "null"}], "title": "Age"},
                "name": {"title": "Name", "type": "string"},
                "pet": {"anyOf": [{"$ref": "#/$defs/Pet"}, {"type": "null"}]},
                "pets": {"items": {"$ref": "#/$defs/Pet"}, "title": "Pets", "type": "array"},
                "boss": {"anyOf": [{"$ref": "#"}, {"type": "null"}]},
                "role": {"const": "admin"},
                "tag": {"type": ["string", "null"]}
            },
            "required": ["age", "name", "pet", "pets", "boss", "role", "tag"],
            "title": "Person", "type": "object", "additionalProperties": false
        }))
        .unwrap()
    }

    #[test]
    fn alternatives_and_references_validate_as_the_schema_says() {
        let s = pydantic();
        let cat = r#"{"kind":"cat","name":"Tom"}"#;
        let me = |age: &str, pet: &str, boss: &str, tag: &str| {
            format!(
                r#"{{"age":{age},"boss":{boss},"name":"A","pet":{pet},"pets":[{cat},{cat}],"role":"admin","tag":{tag}}}"#
            )
        };
        let boss = me("40", "null", "null", "null");
        for good in [
            me("3", cat, "null", "null"),
            me("null", "null", &boss, r#""vip""#),
            me("-1", cat, &me("null", cat, &boss, "null"), "null"),
        ] {
            assert!(accepts(&s, &good), "{good}");
        }
        for bad in [
            me("3.5", cat, "null", "null"),
            me(r#""3""#, cat, "null", "null"),
            me("3", r#"{"kind":"cow","name":"Tom"}"#, "null", "null"),
            me("3", r#"{"name":"Tom","kind":"cat"}"#, "null", "null"),
            me("3", "[]", "null", "null"),
            me("3", cat, "{}", "null"),
            me("3", cat, "null", "false"),
            me("3", cat, "null", "null").replace("admin", "admit"),
        ] {
            assert!(!accepts(&s, &bad), "{bad}");
            assert!(serde_json::from_str::<Value>(&bad).is_ok(), "{bad}");
        }
        // the shortest document: no pets, the shortest of each alternative
        let short =
            r#"{"age":0,"boss":null,"name":"","pet":null,"pets":[],"role":"admin","tag":""}"#;
        assert!(accepts(&s, short));
        assert_eq!(s.shortest(), short.len());
    }

    /// A recursive schema nests as deep as the JSON machine allows, and there the machine
    /// takes only the alternative that closes (null), so a document can always end.
    #[test]
    fn a_recursive_schema_stops_nesting_at_the_depth_limit() {
        let s = Schema::compile(&json!({
            "type": "object", "required": ["next"],
            "properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}
        }))
        .unwrap();
        let mut m = SchemaMachine::default();
        for d in 0..MAX_DEPTH {
            assert!(m.feed(&s, b"{\"next\":"), "{d}");
        }
        assert!(!{ m }.step(&s, b'{'), "a container past the limit");
        assert!(m.feed(&s, b"null"));
        assert!(m.feed(&s, &[b'}'; MAX_DEPTH]) && m.done());
    }

    fn closes_exactly(s: &Schema, full: &str) {
        for cut in 0..full.len() {
            let mut m = SchemaMachine::default();
            assert!(m.feed(s, &full.as_bytes()[..cut]), "{cut}");
            let mut level = vec![m];
            let mut steps = 0;
            while !level.iter().any(SchemaMachine::done) {
                let mut next: Vec<SchemaMachine> = Vec::new();
                for m in &level {
                    for b in 0x20..0x7fu8 {
                        let mut n = *m;
                        if n.step(s, b) {
                            next.push(n);
                        }
                    }
                }
                // states are many; keep those closest to the end
                next.sort_by_key(|m| m.to_close(s));
                next.truncate(64);
                level = next;
                steps += 1;
                assert!(steps <= 200, "cut {cut}");
            }
            assert_eq!(m.to_close(s), steps, "after {:?}", &full[..cut]);
        }
    }

    /// `to_close` is exact: a breadth-first search over every byte finds the same length.
    #[test]
    fn to_close_counts_the_bytes_that_finish_a_valid_document() {
        closes_exactly(
            &schema(),
            r#"{"age":-3,"mood":"cross","name":"A","pet":{"none":null,"ok":true},"tags":[1.5,0]}"#,
        );
        closes_exactly(
            &pydantic(),
            r#"{"age":null,"boss":{"age":1,"boss":null,"name":"B","pet":null,"pets":[],"role":"admin","tag":"v"},"name":"A","pet":{"kind":"dog","name":"R"},"pets":[],"role":"admin","tag":null}"#,
        );
    }
}
