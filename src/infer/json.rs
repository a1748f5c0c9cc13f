//! JSON mode: generation constrained at the token level so that the text is one JSON object
//! (OpenAI's `response_format: {"type": "json_object"}`). A byte automaton (`JsonMachine`)
//! follows JSON's grammar (RFC 8259: objects, arrays, strings with escapes and UTF-8, numbers,
//! literals, whitespace); before each token every token of the vocabulary whose bytes would
//! leave the grammar is masked (`constrain::JsonConstraint::mask`). Near the end of the token budget only
//! tokens that bring the object closer to its end are kept, so that it always closes in time.

/// Containers open at most: deeper nesting is masked.
pub const MAX_DEPTH: usize = 32;

/// Where the automaton is inside the text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum At {
    /// the start: whitespace, then `{`
    Start,
    /// a value is due (after `:`, or `,` in an array); `close`: `]` may come instead (after `[`)
    Value { close: bool },
    /// a key is due (after `,` in an object); `close`: `}` may come instead (after `{`)
    Key { close: bool },
    /// inside a string; `key`: it is a key; `utf8`: continuation bytes still due, the next
    /// one in `lo..=hi` (UTF-8 without overlong forms or surrogates)
    Str { key: bool, utf8: u8, lo: u8, hi: u8 },
    /// after a backslash in a string
    Escape { key: bool },
    /// inside `\uXXXX`, `left` hex digits to go; `d`: the first was d (then the second is
    /// 0–7: no surrogate, which JSON parsers refuse alone)
    Unicode { key: bool, left: u8, d: bool },
    /// after a key: `:` is due
    Colon,
    /// inside a number: what may follow (`Number`)
    Num(Number),
    /// inside `true`, `false` or `null`: the bytes still due
    Literal(&'static [u8]),
    /// after a value: `,` or the container's close
    After,
    /// the top-level object is closed
    Done,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Number {
    /// after `-`: a digit is due
    Minus,
    /// after a leading `0`
    Zero,
    /// in the integer's digits
    Int,
    /// after `.`: a digit is due
    Dot,
    /// in the fraction's digits
    Frac,
    /// after `e`: a sign or digit is due
    Exp,
    /// after the exponent's sign: a digit is due
    ExpSign,
    /// in the exponent's digits
    ExpDigits,
}

impl Number {
    /// Whether the number may end here.
    pub(crate) fn complete(self) -> bool {
        matches!(
            self,
            Number::Zero | Number::Int | Number::Frac | Number::ExpDigits
        )
    }
}

/// The automaton: where it is and the containers open (`b'{'` or `b'['`), a small copyable
/// state.
#[derive(Clone, Copy, Debug)]
pub struct JsonMachine {
    pub(crate) at: At,
    stack: [u8; MAX_DEPTH],
    pub(crate) depth: usize,
}

impl Default for JsonMachine {
    fn default() -> Self {
        JsonMachine {
            at: At::Start,
            stack: [0; MAX_DEPTH],
            depth: 0,
        }
    }
}

/// A string's start (a key's, or a value's).
fn str(key: bool) -> At {
    At::Str {
        key,
        utf8: 0,
        lo: 0x80,
        hi: 0xbf,
    }
}

pub(crate) fn ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

impl JsonMachine {
    /// Whether the top-level object has closed.
    pub fn done(&self) -> bool {
        self.at == At::Done
    }

    /// Takes `bytes` in order; false (and the machine left partway) where one leaves JSON.
    pub fn feed(&mut self, bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| self.step(b))
    }

    /// Takes one byte; false where it leaves the grammar.
    pub fn step(&mut self, b: u8) -> bool {
        use At::*;
        let next = match self.at {
            Done => return false,
            Start if ws(b) => Start,
            Start => return b == b'{' && self.open(b),
            Value { .. } | Key { .. } | After | Colon if ws(b) => self.at,
            Value { close: true } if b == b']' => return self.close(b),
            Value { .. } => return self.value(b),
            Key { close: true } if b == b'}' => return self.close(b),
            Key { .. } if b == b'"' => str(true),
            Colon if b == b':' => Value { close: false },
            After if b == b',' => match self.stack[self.depth - 1] {
                b'{' => Key { close: false },
                _ => Value { close: false },
            },
            After if b == b'}' || b == b']' => return self.close(b),
            Str { key, utf8: 0, .. } => match b {
                b'"' if key => Colon,
                b'"' => After,
                b'\\' => Escape { key },
                0..0x20 => return false,
                0x20..0x80 => self.at,
                0xc2..=0xdf => Str {
                    key,
                    utf8: 1,
                    lo: 0x80,
                    hi: 0xbf,
                },
                0xe0 => Str {
                    key,
                    utf8: 2,
                    lo: 0xa0,
                    hi: 0xbf,
                },
                0xed => Str {
                    key,
                    utf8: 2,
                    lo: 0x80,
                    hi: 0x9f,
                },
                0xe1..=0xef => Str {
                    key,
                    utf8: 2,
                    lo: 0x80,
                    hi: 0xbf,
                },
                0xf0 => Str {
                    key,
                    utf8: 3,
                    lo: 0x90,
                    hi: 0xbf,
                },
                0xf4 => Str {
                    key,
                    utf8: 3,
                    lo: 0x80,
                    hi: 0x8f,
                },
                0xf1..=0xf3 => Str {
                    key,
                    utf8: 3,
                    lo: 0x80,
                    hi: 0xbf,
                },
                _ => return false,
            },
            Str { key, utf8, lo, hi } if (lo..=hi).contains(&b) => Str {
                key,
                utf8: utf8 - 1,
                lo: 0x80,
                hi: 0xbf,
            },
            Escape { key } => match b {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => str(key),
                b'u' => Unicode {
                    key,
                    left: 4,
                    d: false,
                },
                _ => return false,
            },
            Unicode {
                left: 3, d: true, ..
            } if !(b'0'..=b'7').contains(&b) => return false,
            Unicode { key, left, .. } if b.is_ascii_hexdigit() => match left {
                1 => str(key),
                _ => Unicode {
                    key,
                    left: left - 1,
                    d: left == 4 && (b == b'd' || b == b'D'),
                },
            },
            Num(n) => return self.number(n, b),
            Literal(rest) if rest[0] == b => match rest.len() {
                1 => After,
                _ => Literal(&rest[1..]),
            },
            _ => return false,
        };
        self.at = next;
        true
    }

    /// The first byte of a value.
    fn value(&mut self, b: u8) -> bool {
        self.at = match b {
            b'{' | b'[' => return self.open(b),
            b'"' => str(false),
            b'-' => At::Num(Number::Minus),
            b'0' => At::Num(Number::Zero),
            b'1'..=b'9' => At::Num(Number::Int),
            b't' => At::Literal(b"rue"),
            b'f' => At::Literal(b"alse"),
            b'n' => At::Literal(b"ull"),
            _ => return false,
        };
        true
    }

    /// A byte inside a number: more of it, or (where it may end) the byte after it.
    fn number(&mut self, n: Number, b: u8) -> bool {
        use Number::*;
        let digit = b.is_ascii_digit();
        let next = match (n, b) {
            (Minus, b'0') => Zero,
            (Minus, _) if digit => Int,
            (Int, _) if digit => Int,
            (Zero | Int, b'.') => Dot,
            (Dot | Frac, _) if digit => Frac,
            (Zero | Int | Frac, b'e' | b'E') => Exp,
            (Exp, b'+' | b'-') => ExpSign,
            (Exp | ExpSign | ExpDigits, _) if digit => ExpDigits,
            _ if n.complete() => {
                self.at = At::After;
                return self.step(b);
            }
            _ => return false,
        };
        self.at = At::Num(next);
        true
    }

    fn open(&mut self, b: u8) -> bool {
        if self.depth == MAX_DEPTH {
            return false;
        }
        self.stack[self.depth] = b;
        self.depth += 1;
        self.at = match b {
            b'{' => At::Key { close: true },
            _ => At::Value { close: true },
        };
        true
    }

    fn close(&mut self, b: u8) -> bool {
        let want = if b == b'}' { b'{' } else { b'[' };
        if self.depth == 0 || self.stack[self.depth - 1] != want {
            return false;
        }
        self.depth -= 1;
        self.at = if self.depth == 0 { At::Done } else { At::After };
        true
    }

    /// The fewest bytes that close the object from here (a string's quote, a key's `:0`, a
    /// due digit, a literal's rest, then one close per open container).
    pub fn to_close(&self) -> usize {
        match self.at {
            At::Start => 2,
            At::Done => 0,
            _ => self.here() + self.depth,
        }
    }

    /// The fewest bytes that end the token in progress (a string's quote, a key's `:0`, a due
    /// digit, a literal's rest), with no container closed.
    pub(crate) fn here(&self) -> usize {
        use At::*;
        match self.at {
            Start | Done => 0,
            Value { close: true } | Key { close: true } | After => 0,
            Value { close: false } => 1,
            Key { close: false } => 4,
            Colon => 2,
            Str { key, utf8, .. } => 1 + utf8 as usize + 2 * key as usize,
            Escape { key } => 2 + 2 * key as usize,
            Unicode { key, left, .. } => 1 + left as usize + 2 * key as usize,
            Num(n) if n.complete() => 0,
            Num(_) => 1,
            Literal(rest) => rest.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepts(text: &str) -> bool {
        let mut m = JsonMachine::default();
        m.feed(text.as_bytes()) && m.done()
    }

    #[test]
    fn the_machine_takes_json_objects_and_refuses_the_rest() {
        for good in [
            "{}",
            " {\"a\": 1}",
            "{\"a\":[1,-2.5e+3,0,true,false,null,\"x\\n\\u00e9\"],\"b\":{\"c\":[]}}",
            "{\"é\": \"日本\"}",
            "{\"a\" :\t[ { } , [ ] ] }",
        ] {
            assert!(accepts(good), "{good}");
            assert!(
                serde_json::from_str::<serde_json::Value>(good).is_ok(),
                "{good}"
            );
        }
        for bad in [
            "[]",
            "1",
            "{a:1}",
            "{\"a\" 1}",
            "{\"a\":01}",
            "{\"a\":1,}",
            "{\"a\":[1,]}",
            "{\"a\":tru}",
            "{\"a\":\"\u{1}\"}",
            "{\"a\":1.}",
            "{\"a\":\"\\x\"}",
            "{]",
            "{}}",
            "{\"a\":-}",
            "{\"a\":1e}",
        ] {
            assert!(!accepts(bad), "{bad}");
        }
        // a lone surrogate escape and ill-formed UTF-8 (overlong, surrogate, past U+10FFFF)
        assert!(!accepts("{\"a\":\"\\udb00\"}") && accepts("{\"a\":\"\\ud7ff\"}"));
        for bytes in [
            &b"\xe0\x80\x80"[..],
            b"\xed\xa0\x80",
            b"\xf4\x90\x80\x80",
            b"\xc0\x80",
        ] {
            let mut m = JsonMachine::default();
            assert!(
                !m.feed(&[b"{\"a\":\"", bytes, b"\"}"].concat()),
                "{bytes:?}"
            );
        }
        // nesting past MAX_DEPTH is refused
        let deep = format!("{{\"a\":{}", "[".repeat(MAX_DEPTH));
        assert!(!JsonMachine::default().feed(deep.as_bytes()));
    }

    /// `to_close` is exact: the shortest closing bytes, found by trying, have its length.
    #[test]
    fn to_close_counts_the_bytes_that_close_the_object() {
        let closers: &[u8] = b"{\"}]:0eul";
        for prefix in [
            "",
            "{",
            "{\"a",
            "{\"a\"",
            "{\"a\":",
            "{\"a\":[",
            "{\"a\":[1",
            "{\"a\":[1,",
            "{\"a\":tr",
            "{\"a\":\"\\u00",
            "{\"a\":1,",
            "{\"a\":-",
            "{\"a\":\"\\",
        ] {
            let mut m = JsonMachine::default();
            assert!(m.feed(prefix.as_bytes()), "{prefix}");
            // breadth-first over the closing bytes and the literals' letters
            let mut level = vec![m];
            let mut steps = 0;
            while !level.iter().any(JsonMachine::done) {
                level = level
                    .iter()
                    .flat_map(|m| {
                        closers.iter().filter_map(move |&b| {
                            let mut n = *m;
                            n.step(b).then_some(n)
                        })
                    })
                    .collect();
                steps += 1;
                assert!(steps < 12, "{prefix}");
            }
            assert_eq!(m.to_close(), steps, "{prefix}");
        }
    }
}
