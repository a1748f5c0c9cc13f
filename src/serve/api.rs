//! The OpenAI request fields the server reads, checked one by one, and its error objects
//! `{"error": {"message", "type", "param", "code"}}`.

use crate::infer::json_schema::Schema;
use crate::infer::{Penalties, Sampling};
use serde_json::{json, Value};

/// An error answer: HTTP status and the OpenAI error object's fields.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn bad(param: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param),
            code: None,
        }
    }
    pub fn new(
        status: u16,
        kind: &'static str,
        code: &'static str,
        message: impl Into<String>,
    ) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: Some(code),
        }
    }
    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

pub type ApiResult<T> = std::result::Result<T, ApiError>;

/// A prompt as sent: text, or token ids.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

/// What a completion or chat request asks for, the prompt aside.
#[derive(Clone, Debug)]
pub struct Settings {
    pub max_tokens: usize,
    pub sampling: Sampling,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub echo: bool,
    /// log-probabilities with this many alternatives per token
    pub logprobs: Option<usize>,
    /// choices per prompt, each drawn with its own seed
    pub n: usize,
    /// (token id, bias) added to the logits before each token is drawn and scored
    pub logit_bias: Vec<(u32, f32)>,
    /// `response_format` `json_object` or `json_schema`: every choice is one JSON object
    pub json: Option<JsonFormat>,
}

/// What `response_format` asks for beyond text.
#[derive(Clone, Debug)]
pub enum JsonFormat {
    /// `{"type": "json_object"}`: any JSON object
    Object,
    /// `{"type": "json_schema", "json_schema": {"schema": ...}}`: JSON valid under it
    Schema(std::sync::Arc<Schema>),
}

impl JsonFormat {
    /// The fewest bytes a text of this format takes.
    fn shortest(&self) -> usize {
        match self {
            JsonFormat::Object => 2,
            JsonFormat::Schema(s) => s.shortest(),
        }
    }
}

/// The most choices a request may ask for per prompt (`n`), as OpenAI's API allows.
pub const MAX_N: usize = 128;

/// The `model` field, when given, must name the served model.
pub fn check_model(req: &Value, served: &str) -> ApiResult<()> {
    match req.get("model") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(m)) if m == served => Ok(()),
        Some(m) => Err(ApiError {
            status: 404,
            message: format!("model {m} does not exist: this server serves \"{served}\""),
            kind: "invalid_request_error",
            param: Some("model"),
            code: Some("model_not_found"),
        }),
    }
}

/// The request body as a JSON object.
pub fn parse_body(body: &[u8]) -> ApiResult<Value> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad("body", format!("the body is not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad("body", "the body must be a JSON object"));
    }
    Ok(v)
}

/// `prompt`: a string, a list of strings, a list of token ids, or a list of such lists.
pub fn prompts(req: &Value) -> ApiResult<Vec<Prompt>> {
    texts_at(req, "prompt")
}

/// The texts of field `key` (`prompt`, or `input` for embeddings): a string, a list of
/// strings, a list of token ids or a list of lists of token ids.
pub fn texts_at(req: &Value, key: &'static str) -> ApiResult<Vec<Prompt>> {
    let bad = || {
        ApiError::bad(
            key,
            format!("{key} must be a string, a list of strings, a list of token ids or a list of lists of token ids"),
        )
    };
    let ids = |a: &[Value]| -> ApiResult<Vec<u32>> {
        a.iter()
            .map(|x| {
                x.as_u64()
                    .filter(|&i| i <= u32::MAX as u64)
                    .map(|i| i as u32)
            })
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(bad)
    };
    let out = match req.get(key) {
        Some(Value::String(s)) => vec![Prompt::Text(s.clone())],
        Some(Value::Array(a)) if !a.is_empty() => match &a[0] {
            Value::String(_) => a
                .iter()
                .map(|x| {
                    x.as_str()
                        .map(|s| Prompt::Text(s.to_string()))
                        .ok_or_else(bad)
                })
                .collect::<ApiResult<_>>()?,
            Value::Number(_) => vec![Prompt::Ids(ids(a)?)],
            Value::Array(_) => a
                .iter()
                .map(|x| {
                    x.as_array()
                        .ok_or_else(bad)
                        .and_then(|l| ids(l))
                        .map(Prompt::Ids)
                })
                .collect::<ApiResult<_>>()?,
            _ => return Err(bad()),
        },
        None => return Err(ApiError::bad(key, format!("{key} is required"))),
        _ => return Err(bad()),
    };
    Ok(out)
}

/// A /v1/completions request: its settings (16 tokens unless `max_tokens` says) and prompts.
pub fn completion_request(req: &Value) -> ApiResult<(Settings, Vec<Prompt>)> {
    Ok((settings(req, &["max_tokens"], 16)?, prompts(req)?))
}

/// A /v1/chat/completions request: its messages and settings (`max_tokens` `usize::MAX` when
/// no limit is given: the caller answers up to the end of the context).
pub fn chat_request(req: &Value) -> ApiResult<(&[Value], Settings)> {
    let Some(Value::Array(messages)) = req.get("messages") else {
        return Err(ApiError::bad(
            "messages",
            "messages must be a list of {role, content} objects",
        ));
    };
    let set = settings(req, &["max_tokens", "max_completion_tokens"], usize::MAX)?;
    Ok((messages, set))
}

/// What /tokenize turns into tokens.
pub enum ToTokenize<'a> {
    Text(&'a str),
    Messages(&'a [Value]),
}

/// A /tokenize request: `{"prompt": text}` or `{"messages": [...]}`.
pub fn tokenize_request(req: &Value) -> ApiResult<ToTokenize<'_>> {
    match (req.get("prompt"), req.get("messages")) {
        (Some(Value::String(s)), _) => Ok(ToTokenize::Text(s)),
        (_, Some(Value::Array(m))) => Ok(ToTokenize::Messages(m)),
        _ => Err(ApiError::bad(
            "prompt",
            "give \"prompt\" (a string) or \"messages\"",
        )),
    }
}

/// A /detokenize request: `{"tokens": [ids]}`, each id inside a vocabulary of `vocab`.
pub fn detokenize_request(req: &Value, vocab: usize) -> ApiResult<Vec<u32>> {
    let Ok(Prompt::Ids(ids)) =
        prompts(&json!({"prompt": req.get("tokens")})).map(|mut p| p.remove(0))
    else {
        return Err(ApiError::bad(
            "tokens",
            "tokens must be a list of token ids",
        ));
    };
    check_ids(&ids, vocab, "tokens")?;
    Ok(ids)
}

/// Refuses a token id outside a vocabulary of `vocab`, naming the field `param`.
pub fn check_ids(ids: &[u32], vocab: usize, param: &'static str) -> ApiResult<()> {
    match ids.iter().find(|&&t| t as usize >= vocab) {
        None => Ok(()),
        Some(bad) => Err(ApiError::bad(
            param,
            format!("token id {bad} is outside the vocabulary of {vocab} tokens"),
        )),
    }
}

fn number(req: &Value, key: &'static str) -> ApiResult<Option<f64>> {
    match req.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| ApiError::bad(key, format!("{key} must be a number, got {v}"))),
    }
}

fn flag(req: &Value, key: &'static str) -> ApiResult<bool> {
    match req.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(ApiError::bad(
            key,
            format!("{key} must be true or false, got {v}"),
        )),
    }
}

fn whole(req: &Value, key: &'static str) -> ApiResult<Option<i64>> {
    match number(req, key)? {
        Some(x) if x.fract() != 0.0 || x.abs() > 1e15 => Err(ApiError::bad(
            key,
            format!("{key} must be a whole number, got {x}"),
        )),
        x => Ok(x.map(|x| x as i64)),
    }
}

/// The sampling and output fields shared by completions and chat. `max_key` names the field
/// holding the token limit (chat also reads `max_completion_tokens`).
/// `response_format`: None for none or `{"type": "text"}`; `{"type": "json_object"}`; or
/// `{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}` with a schema in
/// the subset `Schema::compile` takes (a 400 names what it does not).
fn response_format(req: &Value) -> ApiResult<Option<JsonFormat>> {
    let Some(f) = req.get("response_format").filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(JsonFormat::Object)),
        Some("json_schema") => {
            let schema = f
                .get("json_schema")
                .and_then(|j| j.get("schema"))
                .ok_or_else(|| ApiError::bad("response_format", "response_format json_schema needs {\"json_schema\": {\"name\": ..., \"schema\": {...}}}"))?;
            Schema::compile(schema)
                .map(|s| Some(JsonFormat::Schema(std::sync::Arc::new(s))))
                .map_err(|e| ApiError::bad("response_format", format!("response_format json_schema: {e}")))
        }
        _ => Err(ApiError::bad(
            "response_format",
            format!("response_format must be {{\"type\": \"text\"}}, {{\"type\": \"json_object\"}} or {{\"type\": \"json_schema\", ...}}, got {f}"),
        )),
    }
}

pub fn settings(req: &Value, max_keys: &[&'static str], default_max: usize) -> ApiResult<Settings> {
    let mut max_tokens = default_max;
    for &k in max_keys {
        if let Some(m) = whole(req, k)? {
            if m < 0 {
                return Err(ApiError::bad(k, format!("{k} must be 0 or more, got {m}")));
            }
            max_tokens = m as usize;
        }
    }
    let temperature = number(req, "temperature")?.unwrap_or(1.0);
    if temperature.is_nan() || temperature < 0.0 {
        return Err(ApiError::bad(
            "temperature",
            format!("temperature must be 0 (greedy) or more, got {temperature}"),
        ));
    }
    let top_p = number(req, "top_p")?;
    if let Some(p) = top_p {
        if !(p > 0.0 && p <= 1.0) {
            return Err(ApiError::bad(
                "top_p",
                format!("top_p must be in (0, 1], got {p}"),
            ));
        }
    }
    // top_k ≤ 0 (vLLM's -1) means no limit
    let top_k = whole(req, "top_k")?.filter(|&k| k > 0).map(|k| k as usize);
    let seed = whole(req, "seed")?.map(|s| s as u64);
    let n = whole(req, "n")?.unwrap_or(1);
    if !(1..=MAX_N as i64).contains(&n) {
        return Err(ApiError::bad(
            "n",
            format!("n must be in 1..={MAX_N}, got {n}"),
        ));
    }
    let stop = match req.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ApiError::bad("stop", "stop must be a string or a list of strings"))?,
        Some(_) => {
            return Err(ApiError::bad(
                "stop",
                "stop must be a string or a list of strings",
            ))
        }
    };
    let json = response_format(req)?;
    if let Some(need) = json
        .as_ref()
        .map(JsonFormat::shortest)
        .filter(|&n| max_tokens < n)
    {
        return Err(ApiError::bad(
            "max_tokens",
            format!("the shortest JSON of this response_format takes {need} tokens at one byte each; max_tokens is {max_tokens}"),
        ));
    }
    let include_usage = match req.get("stream_options") {
        Some(o @ Value::Object(_)) => flag(o, "include_usage")?,
        _ => false,
    };
    let logprobs = match req.get("logprobs") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => None,
        // chat: `logprobs: true` with `top_logprobs`
        Some(Value::Bool(true)) => Some(whole(req, "top_logprobs")?.unwrap_or(0)),
        Some(_) => whole(req, "logprobs")?,
    };
    if let Some(k) = logprobs {
        if !(0..=20).contains(&k) {
            return Err(ApiError::bad(
                "logprobs",
                format!("logprobs must be in 0..=20, got {k}"),
            ));
        }
    }
    // a field left out is no penalty
    let none = Penalties::NONE;
    let or =
        |k: &'static str, none: f32| Ok::<_, ApiError>(number(req, k)?.map_or(none, |v| v as f32));
    let penalties = Penalties {
        presence: or("presence_penalty", none.presence)?,
        frequency: or("frequency_penalty", none.frequency)?,
        repetition: or("repetition_penalty", none.repetition)?,
    };
    let fields = [
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
    ];
    penalties
        .check(fields)
        .map_err(|(k, m)| ApiError::bad(k, m))?;
    Ok(Settings {
        max_tokens,
        sampling: Sampling {
            temperature: temperature as f32,
            top_k,
            top_p: top_p.map(|p| p as f32).filter(|&p| p < 1.0),
            penalties,
        },
        seed,
        stop: stop.into_iter().filter(|s| !s.is_empty()).collect(),
        stream: flag(req, "stream")?,
        include_usage,
        echo: flag(req, "echo")?,
        logprobs: logprobs.map(|k| k as usize),
        n: n as usize,
        logit_bias: logit_bias(req)?,
        json,
    })
}

/// `logit_bias`: `{"token id": bias}`, each bias in [-100, 100] as OpenAI takes it (the ids
/// are checked against the vocabulary where it is known, `check_ids`).
fn logit_bias(req: &Value) -> ApiResult<Vec<(u32, f32)>> {
    let bad = |m: String| ApiError::bad("logit_bias", m);
    match req.get("logit_bias") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| {
                let id = k
                    .parse::<u32>()
                    .map_err(|_| bad(format!("logit_bias keys are token ids, got {k:?}")))?;
                match v.as_f64() {
                    Some(b) if (-100.0..=100.0).contains(&b) => Ok((id, b as f32)),
                    _ => Err(bad(format!(
                        "logit_bias of token {id} must be a number in [-100, 100], got {v}"
                    ))),
                }
            })
            .collect(),
        Some(v) => Err(bad(format!(
            "logit_bias must be an object of token ids to biases, got {v}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_take_every_openai_shape() {
        let p = |v: Value| prompts(&json!({ "prompt": v }));
        assert_eq!(p(json!("hi")).unwrap(), vec![Prompt::Text("hi".into())]);
        assert_eq!(p(json!(["a", "b"])).unwrap().len(), 2);
        assert_eq!(p(json!([1, 2])).unwrap(), vec![Prompt::Ids(vec![1, 2])]);
        assert_eq!(p(json!([[1], [2, 3]])).unwrap()[1], Prompt::Ids(vec![2, 3]));
        for bad in [json!([]), json!(3), json!([1, "a"]), json!([-1]), json!({})] {
            assert_eq!(p(bad).unwrap_err().param, Some("prompt"));
        }
    }

    #[test]
    fn settings_refuse_out_of_range_fields() {
        let s = |v: Value| settings(&v, &["max_tokens"], 16);
        assert_eq!(s(json!({})).unwrap().max_tokens, 16);
        assert_eq!(
            s(json!({"max_tokens": -1})).unwrap_err().param,
            Some("max_tokens")
        );
        assert_eq!(
            s(json!({"temperature": -0.1})).unwrap_err().param,
            Some("temperature")
        );
        assert_eq!(s(json!({"top_p": 0})).unwrap_err().param, Some("top_p"));
        assert_eq!(s(json!({"top_p": 1.5})).unwrap_err().param, Some("top_p"));
        assert_eq!(
            s(json!({"stream": "yes"})).unwrap_err().param,
            Some("stream")
        );
        assert_eq!(
            s(json!({"logprobs": 21})).unwrap_err().param,
            Some("logprobs")
        );
        let ok = s(json!({"stop": "\n", "logprobs": 2, "echo": true, "top_k": -1})).unwrap();
        assert_eq!(
            (ok.stop, ok.logprobs, ok.echo),
            (vec!["\n".to_string()], Some(2), true)
        );
        assert_eq!(ok.sampling.top_k, None);
    }
}
