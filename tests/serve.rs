//! `difftx serve` over real HTTP: the built binary on a free port with a tiny model made by
//! `difftx init`, asked by a plain HTTP client.

#![cfg(feature = "serve")]

mod common;
use common::{bin, difftx, fails_at_the_end_with, fails_with, ok};
use reqwest::blocking::{Client, Response};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A tiny diff_v1 model (context 128, byte-level tokenizer) in `dir`.
fn tiny_model(dir: &Path) -> PathBuf {
    let out = dir.join("tiny");
    let s = bin()
        .args(["init", "--preset", "tiny", "--seed", "3", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    ok(&s);
    out
}

struct Server {
    child: Child,
    base: String,
    model: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the server with `extra` flags on a port the system picks; returns once /health is 200.
fn start(extra: &[&str]) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let mut child = bin()
        .args(["--threads", "2", "serve", "--port", "0", "--model"])
        .arg(&model)
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // the stderr reader runs on so that the pipe never fills
    let (tx, rx) = mpsc::channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("listening on ").nth(1) {
                let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_string());
            }
        }
    });
    let base = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the server says where it listens");
    let t0 = Instant::now();
    while !client()
        .get(format!("{base}/health"))
        .send()
        .is_ok_and(|r| r.status() == reqwest::StatusCode::OK)
    {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the server never became ready"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Server {
        child,
        base,
        model,
        _dir: dir,
    }
}

fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}

impl Server {
    fn post(&self, path: &str, body: &str) -> Response {
        client()
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .unwrap()
    }
    /// (status, JSON body)
    fn call(&self, path: &str, body: Value) -> (u16, Value) {
        let r = self.post(path, &body.to_string());
        (r.status().as_u16(), r.json_value())
    }
    fn get(&self, path: &str) -> (u16, String) {
        let r = client().get(format!("{}{path}", self.base)).send().unwrap();
        (r.status().as_u16(), r.text().unwrap())
    }
    /// Each body posted to /v1/completions at once, one client thread each: the answers in
    /// order.
    fn complete_at_once(&self, bodies: Vec<Value>) -> Vec<Value> {
        std::thread::scope(|sc| {
            let hs: Vec<_> = bodies
                .into_iter()
                .map(|b| {
                    sc.spawn(move || self.post("/v1/completions", &b.to_string()).json_value())
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }
    fn complete(&self, body: Value) -> Value {
        let (s, v) = self.call("/v1/completions", body);
        assert_eq!(s, 200, "{v}");
        v
    }
}

trait JsonBody {
    fn json_value(self) -> Value;
}
impl JsonBody for Response {
    fn json_value(self) -> Value {
        let t = self.text().unwrap();
        serde_json::from_str(&t).unwrap_or_else(|_| panic!("not JSON: {t}"))
    }
}

/// The `data:` payloads of a server-sent event stream, up to and without `[DONE]`.
fn sse(r: Response) -> Vec<Value> {
    assert_eq!(r.status().as_u16(), 200);
    let mut out = Vec::new();
    let mut done = false;
    for line in BufReader::new(r).lines() {
        let line = line.unwrap();
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            done = true;
            break;
        }
        out.push(serde_json::from_str(data).unwrap());
    }
    assert!(done, "the stream ends with data: [DONE]");
    out
}

fn text(v: &Value) -> String {
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

#[test]
fn every_endpoint_answers_in_the_openai_shapes() {
    let s = start(&[]);
    assert_eq!(s.get("/health"), (200, r#"{"status":"ok"}"#.into()));
    let (st, models) = s.get("/v1/models");
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!((st, models["data"][0]["id"].as_str()), (200, Some("tiny")));
    // tokenize and detokenize round-trip (byte-level: one id per byte)
    let (st, t) = s.call(
        "/tokenize",
        json!({"prompt": "Hi!", "add_special_tokens": false}),
    );
    assert_eq!((st, &t["tokens"]), (200, &json!([72, 105, 33])));
    let (_, d) = s.call("/detokenize", json!({"tokens": [72, 105, 33]}));
    assert_eq!(d["prompt"], "Hi!");
    let (st, info) = s.get("/tokenizer_info");
    let info: Value = serde_json::from_str(&info).unwrap();
    assert_eq!(st, 200);
    assert!(
        info.as_object().unwrap().contains_key("eos_token"),
        "{info}"
    );
    assert_eq!(info["model_max_length"], 128);
    // completions: every prompt shape gives one choice per prompt
    for prompt in [
        json!("Hi"),
        json!(["Hi", "Ho"]),
        json!([72, 105]),
        json!([[72], [72, 111]]),
    ] {
        let v = s.complete(
            json!({"model": "tiny", "prompt": prompt, "max_tokens": 3, "temperature": 0}),
        );
        let n = if prompt.as_array().is_some_and(|a| !a[0].is_number()) {
            2
        } else {
            1
        };
        assert_eq!(v["choices"].as_array().unwrap().len(), n, "{v}");
        assert_eq!(v["usage"]["completion_tokens"], 3 * n);
    }
    // a token-id prompt continues as its text does
    let by_text = s.complete(json!({"prompt": "Hi", "max_tokens": 6, "temperature": 0}));
    let by_ids = s.complete(json!({"prompt": [72, 105], "max_tokens": 6, "temperature": 0}));
    assert_eq!(text(&by_text), text(&by_ids));
    // chat: the plain template, whole and streamed alike
    let msgs = json!([{"role": "user", "content": "Hello"}]);
    let (st, c) = s.call(
        "/v1/chat/completions",
        json!({"messages": msgs, "max_tokens": 8, "temperature": 0}),
    );
    assert_eq!(st, 200, "{c}");
    let whole = c["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let body = json!({"messages": msgs, "max_tokens": 8, "temperature": 0, "stream": true});
    let chunks = sse(s.post("/v1/chat/completions", &body.to_string()));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, whole);
    // stop strings cut the text and finish with "stop"
    let free = text(&s.complete(json!({"prompt": "Hello", "max_tokens": 20, "temperature": 0})));
    let stop: String = free.chars().skip(3).take(2).collect();
    let cut =
        s.complete(json!({"prompt": "Hello", "max_tokens": 20, "temperature": 0, "stop": [stop]}));
    assert_eq!(text(&cut), free[..free.find(&stop).unwrap()]);
    assert_eq!(cut["choices"][0]["finish_reason"], "stop");
    // seeded sampling repeats; metrics count what happened
    let sampled = json!({"prompt": "Hi", "max_tokens": 10, "temperature": 1.0, "top_k": 40, "top_p": 0.9, "seed": 7});
    assert_eq!(
        text(&s.complete(sampled.clone())),
        text(&s.complete(sampled))
    );
    let (st, m) = s.get("/metrics");
    assert_eq!(st, 200);
    for needle in [
        "difftx_requests_total{status=\"200\"}",
        "difftx_generated_tokens_total",
        "difftx_queue_depth 0",
        "difftx_running_sequences",
        "difftx_time_to_first_token_seconds_bucket",
    ] {
        assert!(m.contains(needle), "{needle} missing from\n{m}");
    }
}

#[test]
fn streamed_completions_equal_whole_ones() {
    let s = start(&[]);
    for extra in [
        json!({}),
        json!({"stop": ["e"]}),
        json!({"echo": true, "logprobs": 2}),
    ] {
        let mut body = json!({"prompt": "The cat sat", "max_tokens": 24, "temperature": 0});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let whole = s.complete(body.clone());
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let chunks = sse(s.post("/v1/completions", &body.to_string()));
        let streamed: String = chunks
            .iter()
            .filter_map(|c| c["choices"].get(0)?["text"].as_str())
            .collect();
        assert_eq!(streamed, text(&whole), "{body}");
        let last = chunks.last().unwrap();
        assert_eq!(last["usage"], whole["usage"], "the usage chunk comes last");
        let finish: Vec<&Value> = chunks
            .iter()
            .filter_map(|c| c["choices"].get(0))
            .map(|c| &c["finish_reason"])
            .filter(|f| !f.is_null())
            .collect();
        assert_eq!(finish, vec![&whole["choices"][0]["finish_reason"]]);
        if body.get("logprobs").is_some() {
            let lps: Vec<Value> = chunks
                .iter()
                .filter_map(|c| {
                    c["choices"].get(0)?["logprobs"]["token_logprobs"]
                        .as_array()
                        .cloned()
                })
                .flatten()
                .collect();
            assert_eq!(
                Value::Array(lps),
                whole["choices"][0]["logprobs"]["token_logprobs"]
            );
        }
    }
}

/// Chat log-probabilities (`logprobs: true`, `top_logprobs`) in OpenAI's chat shape: each
/// generated token's text, bytes and log-probability equal those a completion of the same
/// rendered prompt reports, the chosen token is the likeliest at temperature 0, and the
/// streamed rows equal the whole answer's.
#[test]
fn chat_logprobs_equal_the_completions_of_the_rendered_prompt() {
    let s = start(&[]);
    let msgs = json!([{"role": "user", "content": "Where is the cat?"}]);
    let (st, ids) = s.call("/tokenize", json!({"messages": msgs}));
    assert_eq!(st, 200, "{ids}");
    let done = s.complete(
        json!({"prompt": ids["tokens"], "max_tokens": 12, "temperature": 0, "logprobs": 3}),
    );
    let legacy = &done["choices"][0]["logprobs"];
    let body = json!({"messages": msgs, "max_tokens": 12, "temperature": 0, "logprobs": true,
        "top_logprobs": 3});
    let (st, chat) = s.call("/v1/chat/completions", body.clone());
    assert_eq!(st, 200, "{chat}");
    let content = chat["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    assert_eq!(content.len(), 12, "{chat}");
    for (i, row) in content.iter().enumerate() {
        assert_eq!(row["token"], legacy["tokens"][i], "{row}");
        assert_eq!(row["logprob"], legacy["token_logprobs"][i], "{row}");
        let top = row["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{row}");
        assert_eq!(
            top[0]["logprob"], row["logprob"],
            "greedy takes the likeliest: {row}"
        );
        // byte-level tokenizer: one byte a token, the text's own where it is ASCII
        let bytes = row["bytes"].as_array().unwrap();
        assert_eq!(bytes.len(), 1, "{row}");
        let text = row["token"].as_str().unwrap();
        if text.is_ascii() {
            assert_eq!(bytes[0].as_u64(), Some(text.as_bytes()[0] as u64), "{row}");
        }
    }
    let mut body = body;
    body["stream"] = json!(true);
    let streamed: Vec<Value> = sse(s.post("/v1/chat/completions", &body.to_string()))
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(&streamed, content);
    // without `logprobs`, none
    let (_, plain) = s.call(
        "/v1/chat/completions",
        json!({"messages": msgs, "max_tokens": 2, "top_logprobs": 3}),
    );
    assert!(plain["choices"][0]["logprobs"].is_null(), "{plain}");
}

/// `n` choices per prompt, in OpenAI's order (prompt p's j-th at index p·n + j): sampled
/// ones differ from each other and repeat with the seed, greedy ones are alike, streamed
/// ones equal the whole answer's, each prompt counts once in `usage`; n outside 1..=128 is
/// a 400 naming `n`.
#[test]
fn n_choices_per_prompt_in_openai_order() {
    let s = start(&[]);
    let texts = |v: &Value| -> Vec<String> {
        let c = v["choices"].as_array().unwrap();
        assert!(c.iter().enumerate().all(|(i, c)| c["index"] == i), "{v}");
        c.iter()
            .map(|c| c["text"].as_str().unwrap().into())
            .collect()
    };
    let body = json!({"prompt": ["The cat", "A dog ran"], "n": 3, "max_tokens": 16,
        "temperature": 1.0, "seed": 5, "echo": true});
    let v = s.complete(body.clone());
    let got = texts(&v);
    assert_eq!(got.len(), 6, "{v}");
    for (i, t) in got.iter().enumerate() {
        assert!(t.starts_with(["The cat", "A dog ran"][i / 3]), "{i}: {t}");
    }
    assert!(
        got[0] != got[1] || got[1] != got[2],
        "three draws alike: {got:?}"
    );
    assert_eq!(
        texts(&s.complete(body.clone())),
        got,
        "the seed repeats them"
    );
    assert_eq!(v["usage"]["prompt_tokens"], 7 + 9, "{v}");
    let mut streamed = vec![String::new(); 6];
    let mut stream = body;
    stream["stream"] = json!(true);
    for c in sse(s.post("/v1/completions", &stream.to_string())) {
        for ch in c["choices"].as_array().unwrap() {
            let i = ch["index"].as_u64().unwrap() as usize;
            streamed[i].push_str(ch["text"].as_str().unwrap_or(""));
        }
    }
    assert_eq!(streamed, got);
    let greedy =
        s.complete(json!({"prompt": "The cat", "n": 2, "max_tokens": 8, "temperature": 0}));
    let g = texts(&greedy);
    assert_eq!((g.len(), &g[0]), (2, &g[1]));
    let (st, chat) = s.call(
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "Hi"}], "n": 2, "max_tokens": 4}),
    );
    assert_eq!(
        (st, chat["choices"].as_array().map(Vec::len)),
        (200, Some(2)),
        "{chat}"
    );
    for bad in [json!(0), json!(129), json!(1.5), json!("2")] {
        let (st, e) = s.call("/v1/completions", json!({"prompt": "a", "n": bad}));
        assert_eq!((st, &e["error"]["param"]), (400, &json!("n")), "{bad}: {e}");
    }
}

/// `logit_bias` moves the logits before each token is drawn and scored: +100 on "A" makes
/// greedy text all "A" with log-probabilities near 0; -100 on every byte but "B" leaves "B";
/// keys that are not token ids of the vocabulary, biases outside [-100, 100] and a
/// non-object are 400s naming `logit_bias`.
#[test]
fn logit_bias_steers_the_draw_and_is_checked() {
    let s = start(&[]);
    let body = |bias: Value| {
        json!({"prompt": "The cat", "max_tokens": 8, "temperature": 0, "logprobs": 0,
            "logit_bias": bias})
    };
    let a = s.complete(body(json!({"65": 100})));
    assert_eq!(text(&a), "AAAAAAAA", "{a}");
    for lp in a["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap()
    {
        assert!(lp.as_f64().unwrap() > -1e-3, "{a}");
    }
    // -100 on every byte but "B": only "B" is left to draw
    let away: serde_json::Map<String, Value> = (0..256)
        .filter(|&t| t != 66)
        .map(|t| (t.to_string(), json!(-100)))
        .collect();
    let b = s.complete(body(Value::Object(away)));
    assert_eq!(text(&b), "BBBBBBBB", "{b}");
    for bad in [
        json!({"x": 1}),
        json!({"65": 200}),
        json!({"300": 1}),
        json!([1]),
    ] {
        let (st, e) = s.call("/v1/completions", body(bad.clone()));
        assert_eq!(
            (st, &e["error"]["param"]),
            (400, &json!("logit_bias")),
            "{bad}: {e}"
        );
    }
}

/// The penalty fields steer greedy text exactly as `generate`'s flags do (one rule serves
/// both; scripts/penalty_fixtures.py checks the rule against transformers through
/// `generate`), in completions and in chat; out of range or of the wrong type they are 400s
/// naming the field.
#[test]
fn penalties_steer_the_text_as_generate_does_and_are_checked() {
    let s = start(&[]);
    let prompt = "The cat sat on the mat. The cat";
    let body = |extra: &Value| {
        let mut b = json!({"prompt": prompt, "max_tokens": 32, "temperature": 0});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    let plain = text(&s.complete(body(&json!({}))));
    for (fields, flags) in [
        (
            json!({"frequency_penalty": 1.5, "presence_penalty": 0.5}),
            ["--frequency-penalty", "1.5", "--presence-penalty", "0.5"],
        ),
        (
            json!({"repetition_penalty": 1.4}),
            ["--repetition-penalty", "1.4", "--presence-penalty", "0"],
        ),
    ] {
        let served = text(&s.complete(body(&fields)));
        let out = bin()
            .args(["generate", "--json", "--temperature", "0"])
            .args(["--max-new-tokens", "32", "--prompt", prompt])
            .args(flags)
            .arg("--model")
            .arg(&s.model)
            .output()
            .unwrap();
        ok(&out);
        let gen: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(served, gen["continuation"].as_str().unwrap(), "{fields}");
        assert_ne!(served, plain, "{fields} changed nothing");
    }
    for (field, bad) in [
        ("presence_penalty", json!(2.5)),
        ("frequency_penalty", json!(-3)),
        ("repetition_penalty", json!(0)),
        ("repetition_penalty", json!("1.2")),
    ] {
        let (st, e) = s.call("/v1/completions", body(&json!({field: bad})));
        assert_eq!((st, &e["error"]["param"]), (400, &json!(field)), "{e}");
        let chat = json!({"messages": [{"role": "user", "content": "hi"}], field: bad});
        let (st, e) = s.call("/v1/chat/completions", chat);
        assert_eq!((st, &e["error"]["param"]), (400, &json!(field)), "{e}");
    }
}

#[test]
fn echo_logprobs_equal_eval_losses() {
    // prefilled in chunks of 8 tokens, scored against `difftx eval`'s one uncached pass
    let s = start(&["--prefill-chunk", "8"]);
    let sample = "A differential transformer cancels attention noise.";
    let file = s._dir.path().join("sample.txt");
    std::fs::write(&file, sample).unwrap();
    let out = bin()
        .args(["eval", "--json", "--model"])
        .arg(&s.model)
        .arg("--data")
        .arg(&file)
        .output()
        .unwrap();
    ok(&out);
    let eval: Value = serde_json::from_slice(&out.stdout).unwrap();
    let v = s.complete(
        json!({"prompt": sample, "max_tokens": 0, "echo": true, "logprobs": 1, "temperature": 0}),
    );
    let lp = &v["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    let scores = lp["token_logprobs"].as_array().unwrap();
    assert_eq!(tokens.len(), sample.len());
    assert_eq!(
        (&scores[0], lp["top_logprobs"][0].is_null()),
        (&Value::Null, true)
    );
    assert_eq!(lp["text_offset"][3], 3);
    assert_eq!(v["choices"][0]["text"], sample);
    assert_eq!(v["usage"]["completion_tokens"], 0);
    let nll: Vec<f64> = scores[1..].iter().map(|x| -x.as_f64().unwrap()).collect();
    let mean = nll.iter().sum::<f64>() / nll.len() as f64;
    assert_eq!(eval["tokens"].as_u64(), Some(nll.len() as u64));
    let want = eval["loss"].as_f64().unwrap();
    assert!(
        (mean - want).abs() < 1e-5 * want,
        "echo mean {mean} vs eval {want}"
    );
    // the top alternative is at least as likely as the token itself
    for (i, top) in lp["top_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .skip(1)
    {
        let best = top
            .as_object()
            .unwrap()
            .values()
            .next()
            .unwrap()
            .as_f64()
            .unwrap();
        assert!(best >= scores[i].as_f64().unwrap() - 1e-6);
    }
}

fn prompt_of(i: usize) -> String {
    // lengths 3..=48, so prefills take one to several chunks of 16
    let words = ["alpha ", "beta ", "gamma ", "delta ", "eps "];
    (0..=i * 2)
        .map(|k| words[(i + k) % words.len()])
        .collect::<String>()[..3 + i * 3]
        .to_string()
}

#[test]
fn sixteen_concurrent_requests_each_equal_the_request_alone() {
    sixteen_concurrent_equal_alone(&[]);
    // bf16 weights too, where the CPU multiplies in bf16 (AVX512_BF16)
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    if cpu.contains("avx512_bf16") {
        sixteen_concurrent_equal_alone(&["--bf16"]);
    }
}

fn sixteen_concurrent_equal_alone(extra: &[&str]) {
    let s = start(&[&["--parallel", "16", "--prefill-chunk", "16"], extra].concat());
    let body = |i: usize| json!({"prompt": prompt_of(i), "max_tokens": 40, "temperature": 0, "logprobs": 0});
    let alone: Vec<Value> = (0..16).map(|i| s.complete(body(i))).collect();
    let together = s.complete_at_once((0..16).map(body).collect());
    for i in 0..16 {
        let (a, b) = (&alone[i]["choices"][0], &together[i]["choices"][0]);
        assert_eq!(a["text"], b["text"], "prompt {i} {extra:?}");
        // the same tokens with the same log-probabilities, to the last bit
        assert_eq!(a["logprobs"], b["logprobs"], "prompt {i} {extra:?}");
    }
    // The 16 clients above overlap only as far as their requests arrive within one another's
    // decoding, which a fast CPU can outrun (a step of this model takes a fraction of a
    // millisecond). One request with the 16 prompts queues them at once, so the engine's steps
    // alone decide the batch: it holds all 16 for eight steps on any machine.
    let prompts: Vec<String> = (0..16).map(prompt_of).collect();
    let one =
        s.complete(json!({"prompt": prompts, "max_tokens": 40, "temperature": 0, "logprobs": 0}));
    let choices = one["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 16, "{one}");
    for c in choices {
        let i = c["index"].as_u64().expect("index") as usize;
        let a = &alone[i]["choices"][0];
        assert_eq!(a["text"], c["text"], "prompt {i} of one request {extra:?}");
        assert_eq!(
            a["logprobs"], c["logprobs"],
            "prompt {i} of one request {extra:?}"
        );
    }
}

#[test]
fn a_dropped_stream_leaves_the_next_request_undisturbed() {
    let s = start(&["--parallel", "2"]);
    let body = json!({"prompt": "Once upon", "max_tokens": 30, "temperature": 0});
    let want = s.complete(body.clone());
    let long = json!({"prompt": "x", "max_tokens": 120, "temperature": 0, "stream": true});
    let r = s.post("/v1/completions", &long.to_string());
    let mut lines = BufReader::new(r).lines();
    assert!(lines.next().unwrap().unwrap().starts_with("data: "));
    drop(lines); // the client goes away mid-stream
    assert_eq!(s.complete(body)["choices"], want["choices"]);
    // the dropped request left the batch
    let t0 = Instant::now();
    while !s.get("/metrics").1.contains("difftx_running_sequences 0") {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the dropped request kept running"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn bad_requests_get_openai_error_objects() {
    let s = start(&["--max-body-bytes", "2000"]);
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("/v1/completions", "{not json".into(), 400, "body"),
        ("/v1/completions", "[1]".into(), 400, "body"),
        (
            "/v1/completions",
            json!({"prompt": "a", "max_tokens": -1}).to_string(),
            400,
            "max_tokens",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "temperature": -0.5}).to_string(),
            400,
            "temperature",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "top_p": 0}).to_string(),
            400,
            "top_p",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "top_p": 1.5}).to_string(),
            400,
            "top_p",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "max_tokens": 1e20}).to_string(),
            400,
            "max_tokens",
        ),
        (
            "/v1/completions",
            json!({"prompt": [[]]}).to_string(),
            400,
            "prompt",
        ),
        (
            "/v1/completions",
            json!({"prompt": null}).to_string(),
            400,
            "prompt",
        ),
        (
            "/v1/completions",
            json!({"prompt": [999999]}).to_string(),
            400,
            "prompt",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "stop": 5}).to_string(),
            400,
            "stop",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "logprobs": "x"}).to_string(),
            400,
            "logprobs",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "model": "gpt-4"}).to_string(),
            404,
            "model",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": "hi"}).to_string(),
            400,
            "messages",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"content": "x"}]}).to_string(),
            400,
            "messages",
        ),
        (
            "/detokenize",
            json!({"tokens": [-1]}).to_string(),
            400,
            "tokens",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a".repeat(3000)}).to_string(),
            413,
            "",
        ),
    ];
    for (path, body, status, param) in cases {
        let r = s.post(path, &body);
        assert_eq!(r.status().as_u16(), status, "{path} {body}");
        let e = r.json_value();
        let err = &e["error"];
        for k in ["message", "type", "param", "code"] {
            assert!(
                err.as_object().is_some_and(|o| o.contains_key(k)),
                "{k} missing: {e}"
            );
        }
        if !param.is_empty() {
            assert_eq!(err["param"], param, "{body}: {e}");
        }
    }
    // prompt + max_tokens beyond the context names both numbers
    let (st, e) = s.call(
        "/v1/completions",
        json!({"prompt": "abcde", "max_tokens": 124}),
    );
    assert_eq!(st, 400);
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("5 tokens") && msg.contains("124") && msg.contains("128"),
        "{msg}"
    );
    assert_eq!(
        s.call(
            "/v1/completions",
            json!({"prompt": "abcde", "max_tokens": 123})
        )
        .0,
        200
    );
    // unknown route
    let (st, body) = s.get("/v2/nothing");
    assert_eq!(st, 404, "{body}");
    assert!(body.contains("\"error\""));
    // nothing above took the server down
    assert_eq!(s.get("/health").0, 200);
}

#[test]
fn the_api_key_is_required_when_set() {
    let s = start(&["--api-key", "sesame"]);
    let body = json!({"prompt": "a", "max_tokens": 1}).to_string();
    let r = s.post("/v1/completions", &body);
    assert_eq!(r.status().as_u16(), 401);
    assert_eq!(r.json_value()["error"]["type"], "authentication_error");
    let wrong = client()
        .post(format!("{}/v1/completions", s.base))
        .header("authorization", "Bearer nope")
        .body(body.clone())
        .send()
        .unwrap();
    assert_eq!(wrong.status().as_u16(), 401);
    let right = client()
        .post(format!("{}/v1/completions", s.base))
        .header("authorization", "Bearer sesame")
        .body(body)
        .send()
        .unwrap();
    assert_eq!(right.status().as_u16(), 200);
    assert_eq!(s.get("/health").0, 200, "health needs no key");
}

#[test]
fn a_full_queue_answers_429_and_the_rest_complete() {
    let s = start(&["--parallel", "1", "--max-queue", "1"]);
    let base = s.base.clone();
    let statuses: Vec<u16> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..8)
            .map(|_| {
                let base = base.clone();
                sc.spawn(move || {
                    let b = json!({"prompt": "q", "max_tokens": 120, "temperature": 0});
                    client()
                        .post(format!("{base}/v1/completions"))
                        .body(b.to_string())
                        .send()
                        .unwrap()
                        .status()
                        .as_u16()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(statuses.contains(&429), "{statuses:?}");
    assert!(
        statuses.iter().all(|&c| c == 200 || c == 429),
        "{statuses:?}"
    );
    // at least the first runs to the end; whether a second got in depends on timing: on two
    // loaded cores the other seven can all arrive before the engine takes the first from the
    // queue (seen once in a clean-clone CI run), so one 200 is all that is sure
    assert!(statuses.contains(&200), "{statuses:?}");
    assert!(s
        .get("/metrics")
        .1
        .contains("difftx_requests_total{status=\"429\"}"));
    // more choices than the queue could ever hold: a 400 naming n, not a 429 forever
    let (st, e) = s.call(
        "/v1/completions",
        json!({"prompt": "a", "n": 2, "max_tokens": 1}),
    );
    assert_eq!((st, &e["error"]["param"]), (400, &json!("n")), "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-queue"),
        "{e}"
    );
}

#[test]
fn sigterm_stops_the_server_with_exit_code_0() {
    let mut s = start(&["--grace", "2"]);
    // one request in flight while the signal comes
    let base = s.base.clone();
    let h = std::thread::spawn(move || {
        let b = json!({"prompt": "z", "max_tokens": 120, "stream": true});
        client()
            .post(format!("{base}/v1/completions"))
            .body(b.to_string())
            .send()
            .map(|r| r.text())
    });
    std::thread::sleep(Duration::from_millis(50));
    // SAFETY: kill(2) on the child's own process id, which is still ours to signal.
    unsafe {
        libc::kill(s.child.id() as i32, libc::SIGTERM);
    }
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "still running 10 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    let _ = h.join();
}

#[test]
fn health_and_the_api_say_503_while_the_model_loads() {
    use difftx::serve::{serve, ServeOptions};
    use difftx::{AttentionKind, Model, ModelConfig, Preset};
    // in process: the loader waits until the test lets it finish
    let dir = tempfile::tempdir().unwrap();
    let model_dir = dir.path().to_path_buf();
    let (go, wait) = mpsc::channel::<()>();
    let (at, addr) = mpsc::channel();
    let opts = ServeOptions {
        host: "127.0.0.1".into(),
        port: 0,
        api_key: None,
        parallel: 2,
        max_queue: 4,
        chunk: 16,
        max_body_bytes: 1 << 20,
        prefix_cache: 0,
        name: "slow".into(),
        grace: Duration::from_secs(1),
        speculate: Default::default(),
    };
    let load = Box::new(move || {
        wait.recv().map_err(|e| e.to_string())?;
        let m = Model::init(ModelConfig::preset(Preset::Tiny, AttentionKind::DiffV1), 0)
            .map_err(|e| e.to_string())?;
        Ok((m, model_dir))
    });
    // the server thread is left running when the test ends, with the test process
    std::thread::spawn(move || serve(opts, load, |a| at.send(a).unwrap()));
    let base = format!(
        "http://{}",
        addr.recv_timeout(Duration::from_secs(10)).unwrap()
    );
    let c = client();
    let health = c.get(format!("{base}/health")).send().unwrap();
    assert_eq!(health.status().as_u16(), 503);
    assert_eq!(health.json_value()["error"]["code"], "model_loading");
    let body = json!({"prompt": "a", "max_tokens": 1}).to_string();
    let r = c
        .post(format!("{base}/v1/completions"))
        .body(body.clone())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    go.send(()).unwrap();
    let t0 = Instant::now();
    while c
        .get(format!("{base}/health"))
        .send()
        .unwrap()
        .status()
        .as_u16()
        != 200
    {
        assert!(t0.elapsed() < Duration::from_secs(30), "never ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = c
        .post(format!("{base}/v1/completions"))
        .body(body)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

#[test]
fn clients_that_hang_up_mid_stream_cost_the_server_nothing() {
    use std::io::{Read, Write};
    let mut s = start(&["--parallel", "4"]);
    let addr = s.base.trim_start_matches("http://").to_string();
    let body = json!({"prompt": "x", "max_tokens": 100, "temperature": 0, "stream": true});
    let body = body.to_string();
    for _ in 0..8 {
        // a raw socket that reads up to the first event and hangs up with data unread, so
        // the close resets the connection and the server's next writes meet the reset
        let mut tcp = std::net::TcpStream::connect(&addr).unwrap();
        write!(
            tcp,
            "POST /v1/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        while !String::from_utf8_lossy(&got).contains("data: ") {
            let n = tcp.read(&mut buf).unwrap();
            assert!(n > 0, "closed before the first event");
            got.extend_from_slice(&buf[..n]);
        }
        tcp.shutdown(std::net::Shutdown::Both).unwrap();
        drop(tcp);
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        s.child.try_wait().unwrap().is_none(),
        "the server died after clients hung up"
    );
    // whether a write meets the reset in time is up to the scheduler, so the cause is checked
    // too: the server ignores SIGPIPE (bit 13 of the kernel's SigIgn mask)
    let status = std::fs::read_to_string(format!("/proc/{}/status", s.child.id())).unwrap();
    let ignored = status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .map(|m| u64::from_str_radix(m.trim(), 16).unwrap())
        .unwrap();
    assert!(
        ignored & (1 << (13 - 1)) != 0,
        "SIGPIPE not ignored: {status}"
    );
    let r = s.complete(json!({"prompt": "Once upon", "max_tokens": 5, "temperature": 0}));
    assert_eq!(r["usage"]["completion_tokens"], 5);
}

#[test]
fn a_quantised_server_continues_as_quantised_generate_does() {
    let s = start(&["--quant", "q8_0"]);
    let prompt = "The cat sat on";
    let out = bin()
        .args([
            "generate",
            "--json",
            "--quant",
            "q8_0",
            "--temperature",
            "0",
        ])
        .args(["--max-new-tokens", "24", "--prompt", prompt, "--model"])
        .arg(&s.model)
        .output()
        .unwrap();
    ok(&out);
    let gen: Value = serde_json::from_slice(&out.stdout).unwrap();
    let v = s.complete(json!({"prompt": prompt, "max_tokens": 24, "temperature": 0}));
    assert_eq!(v["usage"]["completion_tokens"], 24, "{v}");
    assert_eq!(text(&v), gen["continuation"].as_str().unwrap());
    // and the quantised weights are in use: the f32 server continues otherwise
    let f32_server = start(&[]);
    let plain = f32_server.complete(json!({"prompt": prompt, "max_tokens": 24, "temperature": 0}));
    assert_ne!(
        text(&plain),
        text(&v),
        "q8_0 and f32 gave the same 24 tokens"
    );
}

#[test]
fn the_page_is_served_with_the_playground_and_the_explorer() {
    let s = start(&["--api-key", "k"]);
    // the page itself needs no key (its script sends the one typed in)
    let r = client().get(format!("{}/", s.base)).send().unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let ct = r.headers()["content-type"].to_str().unwrap().to_string();
    assert!(ct.starts_with("text/html"), "{ct}");
    let page = r.text().unwrap();
    for part in [
        r#"id="playground""#,
        r#"id="explorer""#,
        r#"id="layer""#,
        r#"id="head""#,
        r#"id="temperature""#,
        r#"id="stop""#,
        "/v1/completions",
        "stream: true",
        "/v1/attention",
    ] {
        assert!(page.contains(part), "the page lacks {part}");
    }
}

/// The largest difference between two JSON arrays of arrays of numbers (or of numbers).
fn max_diff(a: &Value, b: &Value) -> f64 {
    match (a, b) {
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!(x.len(), y.len());
            x.iter()
                .zip(y)
                .map(|(p, q)| max_diff(p, q))
                .fold(0.0, f64::max)
        }
        _ => (a.as_f64().unwrap() - b.as_f64().unwrap()).abs(),
    }
}

#[test]
fn attention_maps_are_causal_rows_and_equal_the_cli_dump() {
    let s = start(&[]);
    let prompt = "The cat sat on the mat.";
    let (st, v) = s.call("/v1/attention", json!({"prompt": prompt, "layer": 1}));
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (&v["attention"], &v["layers"], &v["heads"]),
        (&json!("diff_v1"), &json!(2), &json!(2))
    );
    let t = prompt.len();
    assert_eq!(v["tokens"].as_array().unwrap().len(), t);
    assert_eq!(v["tokens"][1], "h");
    let maps = v["maps"].as_array().unwrap();
    assert_eq!(maps.len(), 2);
    for m in maps {
        assert_eq!(m["layer"], 1);
        let lam = m["lambda"][0].as_f64().unwrap();
        for i in 0..t {
            let row = |k: &str, j: usize| m[k][i][j].as_f64().unwrap();
            let (s1, s2): (f64, f64) = (0..t)
                .map(|j| (row("a1", j), row("a2", j)))
                .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
            assert!(
                (s1 - 1.0).abs() < 1e-9 && (s2 - 1.0).abs() < 1e-9,
                "row {i}: {s1} {s2}"
            );
            for j in 0..t {
                if j > i {
                    assert_eq!(
                        (row("a1", j), row("a2", j), row("diff", j)),
                        (0.0, 0.0, 0.0)
                    );
                }
                let want = row("a1", j) - lam * row("a2", j);
                assert!((row("diff", j) - want).abs() < 1e-12, "({i}, {j})");
            }
        }
    }
    // the same numbers as `difftx attention-map --dump` for the same prompt and layer
    let dump = s._dir.path().join("maps.json");
    let out = bin()
        .args([
            "--threads",
            "2",
            "attention-map",
            "--layer",
            "1",
            "--all-heads",
        ])
        .args(["--prompt", prompt, "--model"])
        .arg(&s.model)
        .arg("--out")
        .arg(s._dir.path().join("maps.png"))
        .arg("--dump")
        .arg(&dump)
        .output()
        .unwrap();
    ok(&out);
    let cli: Value = serde_json::from_slice(&std::fs::read(&dump).unwrap()).unwrap();
    for (m, c) in maps.iter().zip(cli.as_array().unwrap()) {
        assert_eq!((&m["head"], &c["tokens"]), (&c["head"], &v["tokens"]));
        for k in ["lambda", "a1", "a2", "diff"] {
            let d = max_diff(&m[k], &c[k]);
            assert!(d <= 1e-6, "{k} of head {}: differs by {d}", m["head"]);
        }
    }
    // no layer: every head of every layer
    let (st, all) = s.call("/v1/attention", json!({"prompt": [72, 105]}));
    assert_eq!(
        (st, all["maps"].as_array().unwrap().len()),
        (200, 4),
        "{all}"
    );
}

#[test]
fn bad_attention_requests_get_400s() {
    let s = start(&[]);
    for (body, param, says) in [
        (json!({"prompt": "x".repeat(129)}), "prompt", "at most 128"),
        (json!({"prompt": "Hi", "layer": 2}), "layer", "2 layers"),
        (json!({"prompt": "Hi", "layer": "one"}), "layer", "integer"),
        (json!({"prompt": "Hi", "layer": -1}), "layer", "integer"),
        (json!({"prompt": ""}), "prompt", "empty"),
        (json!({"prompt": ["a", "b"]}), "prompt", "one prompt"),
        (json!({"prompt": [300]}), "prompt", "vocabulary"),
        (json!({"layer": 0}), "prompt", "prompt is required"),
    ] {
        let (st, v) = s.call("/v1/attention", body.clone());
        assert_eq!(
            (st, &v["error"]["param"]),
            (400, &json!(param)),
            "{body}: {v}"
        );
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(says), "{body}: {msg}");
    }
    // the server goes on answering
    let (st, _) = s.call("/v1/attention", json!({"prompt": "Hi", "layer": 0}));
    assert_eq!(st, 200);
}

/// `difftx bench serve` against a running server: every request's tokens counted once (each
/// asks for 6 and gets 6), the window's tokens no more than all of them, latencies and the
/// server's memory read; hung-up requests counted as cancelled, not errors; an unreachable
/// server counted as errors; a malformed URL or probability refused in one line.
#[test]
fn bench_serve_counts_what_the_server_streams() {
    let s = start(&["--parallel", "4"]);
    let run = |clients: &str, extra: &[&str]| -> Vec<Value> {
        let pid = s.child.id().to_string();
        let mut args = vec!["bench", "serve", "--url", &s.base, "--clients", clients];
        args.extend(["--seconds", "1", "--tokens", "6", "--json", "--pid", &pid]);
        args.extend(extra);
        let out = difftx(&args);
        ok(&out);
        let text = String::from_utf8(out.stdout).unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let levels = run("1,3", &["--stagger", "0.3"]);
    assert_eq!(levels.len(), 2);
    for (r, clients) in levels.iter().zip([1, 3]) {
        assert_eq!(r["clients"], clients);
        assert_eq!(r["errors"], 0, "{r}");
        let (requests, generated) = (
            r["requests"].as_u64().unwrap(),
            r["generated"].as_u64().unwrap(),
        );
        assert!(requests >= 1, "{r}");
        // the ramp's requests are generated but not counted among the steady state's
        assert!(generated >= 6 * requests && generated % 6 == 0, "{r}");
        let tps = r["tokens_per_s"].as_f64().unwrap();
        assert!(tps > 0.0 && tps * 0.7 <= generated as f64 + 1e-6, "{r}");
        let (p50, p99) = (
            r["ttft_p50_ms"].as_f64().unwrap(),
            r["ttft_p99_ms"].as_f64().unwrap(),
        );
        assert!(p50 > 0.0 && p50 <= p99, "{r}");
        assert!(r["token_p50_ms"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["peak_rss_mib"].as_f64().unwrap() > 1.0, "{r}");
    }
    let hung = &run("2", &["--disconnect", "1"])[0];
    assert_eq!(
        (&hung["errors"], &hung["requests"]),
        (&json!(0), &json!(0)),
        "{hung}"
    );
    assert!(hung["cancelled"].as_u64().unwrap() >= 2, "{hung}");
    // the server is none the worse
    let r = s.complete(json!({"prompt": "Once upon", "max_tokens": 5, "temperature": 0}));
    assert_eq!(r["usage"]["completion_tokens"], 5);
    // nothing listens on a port just released
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let url = format!("http://{free}");
    let out = difftx(&[
        "bench",
        "serve",
        "--url",
        &url,
        "--clients",
        "1",
        "--seconds",
        "0.2",
        "--json",
    ]);
    ok(&out);
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(r["errors"].as_u64().unwrap() >= 1, "{r}");
    assert!(
        r["first_errors"][0].as_str().unwrap().contains("connect"),
        "{r}"
    );
    fails_with(
        &difftx(&["bench", "serve", "--url", "localhost:8080"]),
        &["--url localhost:8080", "http://HOST"],
    );
    fails_with(
        &difftx(&["bench", "serve", "--disconnect", "1.5"]),
        &["--disconnect 1.5", "[0, 1]"],
    );
}

/// `/v1/embeddings`: one unit vector of the hidden size per input, in order, equal to the
/// library's `infer::embed` of the same tokens; base64 is the same floats' bytes; a string and
/// its token ids give one vector; usage counts the tokens; bad inputs are 400s naming `input`.
#[test]
fn embeddings_are_the_librarys_unit_vectors_in_both_formats() {
    let s = start(&[]);
    let model = difftx::Model::load(&s.model).unwrap();
    let texts = [
        "The cat sat.",
        "A different sentence, longer than the first one.",
    ];
    let (st, v) = s.call("/v1/embeddings", json!({"input": texts, "model": "tiny"}));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "list");
    let ids: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| t.bytes().map(u32::from).collect())
        .collect();
    let want = difftx::infer::embed(&model, &ids).unwrap();
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    let mut served = Vec::new();
    for (i, d) in data.iter().enumerate() {
        assert_eq!(
            (d["object"].as_str(), d["index"].as_u64()),
            (Some("embedding"), Some(i as u64))
        );
        let got: Vec<f32> = serde_json::from_value(d["embedding"].clone()).unwrap();
        assert_eq!(got.len(), model.config.hidden_size);
        // (another process's thread pool may sum in another order: f32 rounding apart)
        let off = got
            .iter()
            .zip(&want[i])
            .map(|(g, w)| (g - w).abs())
            .fold(0f32, f32::max);
        assert!(off < 1e-5, "input {i}: {off}");
        served.push(got);
    }
    assert_ne!(want[0], want[1]);
    let n = (ids[0].len() + ids[1].len()) as u64;
    assert_eq!(v["usage"]["prompt_tokens"].as_u64(), Some(n));
    // base64: the little-endian f32 bytes; token ids: the same vector as the text
    let (st, b) = s.call(
        "/v1/embeddings",
        json!({"input": [ids[0].clone()], "encoding_format": "base64"}),
    );
    assert_eq!(st, 200, "{b}");
    let raw = decode_base64(b["data"][0]["embedding"].as_str().unwrap());
    let floats: Vec<f32> = raw
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(floats, served[0]);
    // bad inputs: 400s that name the field
    let long = "x".repeat(129);
    for (body, param, says) in [
        (json!({"input": ""}), "input", "empty"),
        (json!({"input": long}), "input", "context of 128"),
        (json!({"input": [300]}), "input", "vocabulary"),
        (json!({"input": 5}), "input", "must be a string"),
        (json!({}), "input", "input is required"),
        (
            json!({"input": "a", "encoding_format": "hex"}),
            "encoding_format",
            "base64",
        ),
    ] {
        let (st, v) = s.call("/v1/embeddings", body.clone());
        assert_eq!(
            (st, &v["error"]["param"]),
            (400, &json!(param)),
            "{body}: {v}"
        );
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(says), "{body}: {msg}");
    }
}

/// Standard base64 (the test's own decoder, independent of the server's encoder).
fn decode_base64(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    } as u32;
    let mut out = Vec::new();
    for chunk in s.as_bytes().chunks(4) {
        let pad = chunk.iter().filter(|&&c| c == b'=').count();
        let n = chunk[..4 - pad]
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &c)| n | val(c) << (18 - 6 * i));
        out.extend((0..3 - pad).map(|k| (n >> (16 - 8 * k)) as u8));
    }
    out
}

/// JSON mode (`response_format: {"type": "json_object"}`): sampled at temperature 1, every
/// completion, chat answer and streamed text is one JSON object that closes within
/// max_tokens (finish_reason "stop"); json_schema and malformed formats are 400s.
#[test]
fn json_mode_answers_parse_as_json_objects() {
    let s = start(&[]);
    let parse = |text: &str| {
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        assert!(v.is_object(), "{text}");
    };
    let fmt = json!({"type": "json_object"});
    for (seed, max_tokens) in (0..24).zip([4, 9, 16, 40].into_iter().cycle()) {
        let v = s.complete(
            json!({"prompt": "Data: ", "max_tokens": max_tokens, "seed": seed,
            "temperature": 1.0, "n": 2, "response_format": fmt}),
        );
        for c in v["choices"].as_array().unwrap() {
            parse(c["text"].as_str().unwrap());
            assert_eq!(c["finish_reason"], "stop", "{c}");
        }
        assert!(v["usage"]["completion_tokens"].as_u64().unwrap() <= 2 * max_tokens);
    }
    let (st, v) = s.call(
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "JSON please"}], "max_tokens": 30,
               "seed": 5, "response_format": fmt}),
    );
    assert_eq!(st, 200, "{v}");
    parse(v["choices"][0]["message"]["content"].as_str().unwrap());
    let events = sse(s.post(
        "/v1/completions",
        &json!({"prompt": "x", "max_tokens": 20, "seed": 9, "stream": true,
                "response_format": fmt})
        .to_string(),
    ));
    let streamed: String = events
        .iter()
        .map(|e| e["choices"][0]["text"].as_str().unwrap_or(""))
        .collect();
    parse(&streamed);
    for (body, says) in [
        (
            json!({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {}}}),
            "needs",
        ),
        (
            json!({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "a",
                "schema": {"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}, "required": ["a"]}}}}),
            "`pattern` is not supported",
        ),
        (
            json!({"prompt": "x", "response_format": {"type": "yaml"}}),
            "must be",
        ),
        (json!({"prompt": "x", "response_format": "json"}), "must be"),
    ] {
        let (st, v) = s.call("/v1/completions", body.clone());
        assert_eq!(
            (st, &v["error"]["param"]),
            (400, &json!("response_format")),
            "{body}: {v}"
        );
        assert!(
            v["error"]["message"].as_str().unwrap().contains(says),
            "{v}"
        );
    }
    let (st, v) = s.call(
        "/v1/completions",
        json!({"prompt": "x", "max_tokens": 1, "response_format": fmt}),
    );
    assert_eq!(
        (st, &v["error"]["param"]),
        (400, &json!("max_tokens")),
        "{v}"
    );
}

/// The value of a counter or gauge in the server's /metrics text.
fn metric(s: &Server, name: &str) -> f64 {
    let (status, text) = s.get("/metrics");
    assert_eq!(status, 200);
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
}

#[test]
fn the_prefix_cache_answers_as_a_cold_server_does_and_counts_its_hits() {
    // one context scored with four continuations (as lm-evaluation-harness asks), then
    // generations after it, greedy and sampled: with the cache and without
    let chunk = ["--prefill-chunk", "16"];
    let (cold, warm) = (
        start(&[&chunk[..], &["--prefix-cache", "0"]].concat()),
        start(&chunk),
    );
    let context = "Question: which attention cancels the noise of two maps? Answer:";
    let asks: Vec<Value> = [" differential", " standard", " both", " neither"]
        .iter()
        .map(|c| json!({"prompt": format!("{context}{c}"), "max_tokens": 0, "echo": true, "logprobs": 1}))
        .chain((0..4).map(|i| {
            json!({"prompt": format!("{context} {i}"), "max_tokens": 12, "temperature": i as f64 / 2.0, "seed": i, "logprobs": 2})
        }))
        .collect();
    let (a, b): (Vec<Value>, Vec<Value>) = asks
        .iter()
        .map(|q| (cold.complete(q.clone()), warm.complete(q.clone())))
        .unzip();
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        let (x, y) = (&x["choices"][0], &y["choices"][0]);
        assert_eq!(
            (&x["text"], &x["logprobs"]),
            (&y["text"], &y["logprobs"]),
            "request {i}"
        );
    }
    // every request after the first took the context's blocks (64 bytes: four of 16)
    assert_eq!(metric(&warm, "difftx_prefix_cache_hits_total"), 7.0);
    assert_eq!(
        metric(&warm, "difftx_prefix_cache_tokens_saved_total"),
        7.0 * 64.0
    );
    assert_eq!(metric(&cold, "difftx_prefix_cache_lookups_total"), 0.0);
    assert!(metric(&warm, "difftx_prefix_cache_bytes") > 0.0);
    // 16 at once, sharing the context, each as the cold server answers it alone
    let together = warm.complete_at_once(asks.iter().chain(&asks).cloned().collect());
    for (i, y) in together.iter().enumerate() {
        let (x, y) = (&a[i % asks.len()]["choices"][0], &y["choices"][0]);
        assert_eq!(
            (&x["text"], &x["logprobs"]),
            (&y["text"], &y["logprobs"]),
            "concurrent {i}"
        );
    }
}

/// `response_format` `json_schema`: sampled at temperature 1 from an untrained model, every
/// answer validates against the schema (checked here field by field), closed in time.
#[test]
fn json_schema_answers_validate_against_the_schema() {
    let s = start(&[]);
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "mood": {"type": "string", "enum": ["calm", "cross", "glad"]},
            "scores": {"type": "array", "items": {"type": "number"}},
            "pet": {"type": "object", "properties": {"has": {"type": "boolean"}, "none": {"type": "null"}},
                    "required": ["has", "none"], "additionalProperties": false}
        },
        "required": ["name", "age", "mood", "scores", "pet"],
        "additionalProperties": false
    });
    let fmt = json!({"type": "json_schema", "json_schema": {"name": "person", "strict": true, "schema": schema}});
    let check = |text: &str| {
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        let o = v.as_object().unwrap_or_else(|| panic!("{text}"));
        let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(keys, ["age", "mood", "name", "pet", "scores"], "{text}");
        // an integer of any size (JSON Schema's integer), so no fraction or exponent in its text
        let age = text
            .split("\"age\":")
            .nth(1)
            .and_then(|t| t.split(',').next())
            .unwrap_or("");
        assert!(
            v["name"].is_string() && !age.is_empty() && !age.contains(['.', 'e', 'E']),
            "{text}"
        );
        assert!(
            ["calm", "cross", "glad"].contains(&v["mood"].as_str().unwrap()),
            "{text}"
        );
        assert!(
            v["scores"].as_array().unwrap().iter().all(Value::is_number),
            "{text}"
        );
        assert!(
            v["pet"]["has"].is_boolean() && v["pet"]["none"].is_null(),
            "{text}"
        );
        assert_eq!(v["pet"].as_object().unwrap().len(), 2, "{text}");
    };
    for (seed, max_tokens) in (0..12).zip([80, 100, 118].into_iter().cycle()) {
        let v = s.complete(
            json!({"prompt": "Person: ", "max_tokens": max_tokens, "seed": seed,
            "temperature": 1.0, "n": 2, "response_format": fmt}),
        );
        for c in v["choices"].as_array().unwrap() {
            check(c["text"].as_str().unwrap());
            assert_eq!(c["finish_reason"], "stop", "{c}");
        }
    }
    // chat too; and a budget below the shortest valid text is a 400
    let (st, v) = s.call(
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "who?"}],
        "max_tokens": 80, "seed": 3, "response_format": fmt}),
    );
    assert_eq!(st, 200, "{v}");
    check(v["choices"][0]["message"]["content"].as_str().unwrap());
    let (st, v) = s.call(
        "/v1/completions",
        json!({"prompt": "x", "max_tokens": 40, "response_format": fmt}),
    );
    assert_eq!(
        (st, &v["error"]["param"]),
        (400, &json!("max_tokens")),
        "{v}"
    );
}

/// The schema the `openai` client (3.57) sends for a Pydantic model with optional fields, a
/// nested model and a recursive one (`openai.lib._pydantic.to_strict_json_schema(Person)`,
/// pasted): `$defs`, `$ref`, `anyOf` with null. Sampled answers (temperature 1) validate.
#[test]
fn pydantic_schemas_with_references_and_optional_fields_validate() {
    let s = start(&[]);
    let person = json!({"properties": {"name": {"title": "Name", "type": "string"}, "age": {"anyOf": [{"type": "integer"}, {"type": "null"}], "title": "Age"}, "pet": {"anyOf": [{"$ref": "#/$defs/Pet"}, {"type": "null"}]}, "pets": {"items": {"$ref": "#/$defs/Pet"}, "title": "Pets", "type": "array"}, "boss": {"anyOf": [{"$ref": "#/$defs/Person"}, {"type": "null"}]}}, "required": ["name", "age", "pet", "pets", "boss"], "title": "Person", "type": "object", "additionalProperties": false});
    let pet = json!({"properties": {"kind": {"enum": ["cat", "dog"], "title": "Kind", "type": "string"}, "name": {"title": "Name", "type": "string"}}, "required": ["kind", "name"], "title": "Pet", "type": "object", "additionalProperties": false});
    let mut schema = person.clone();
    schema["$defs"] = json!({"Person": person, "Pet": pet});
    let fmt = json!({"type": "json_schema", "json_schema": {"name": "Person", "strict": true, "schema": schema}});
    fn is_pet(v: &Value) -> bool {
        let o = v.as_object().unwrap();
        o.len() == 2
            && ["cat", "dog"].contains(&v["kind"].as_str().unwrap_or(""))
            && v["name"].is_string()
    }
    fn is_person(v: &Value) -> bool {
        let o = v.as_object().unwrap();
        o.len() == 5
            && v["name"].is_string()
            && (v["age"].is_null()
                || v["age"].is_i64()
                || v["age"].is_u64()
                || v["age"].as_f64().is_some_and(|a| a.fract() == 0.0))
            && (v["pet"].is_null() || is_pet(&v["pet"]))
            && v["pets"].as_array().is_some_and(|p| p.iter().all(is_pet))
            && (v["boss"].is_null() || is_person(&v["boss"]))
    }
    let mut nulls = 0;
    for seed in 0..8 {
        let v = s.complete(
            json!({"prompt": "Person: ", "max_tokens": 118, "seed": seed,
            "temperature": 1.0, "n": 2, "response_format": fmt}),
        );
        for c in v["choices"].as_array().unwrap() {
            let text = c["text"].as_str().unwrap();
            let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
            assert!(is_person(&v), "{text}");
            assert_eq!(c["finish_reason"], "stop", "{c}");
            nulls += usize::from(v["pet"].is_null()) + usize::from(v["age"].is_null());
        }
    }
    // both sides of the alternatives were taken somewhere, not null alone
    assert!(
        nulls > 0 && nulls < 32,
        "{nulls} nulls of 32 optional fields"
    );
}

/// Speculative decoding over HTTP, by prompt lookup and by a draft model (here a model with
/// the same weights, so most drafts are taken): greedy answers, alone and 8 at once, are a
/// plain server's; JSON mode still answers JSON; /metrics counts drafts and acceptances.
#[test]
fn speculative_servers_answer_as_a_plain_one() {
    let dir = tempfile::tempdir().unwrap();
    let draft = tiny_model(dir.path());
    let chunk = ["--prefill-chunk", "16"];
    let plain = start(&chunk);
    let servers = [
        ("lookup", start(&[&chunk[..], &["--lookup", "4"]].concat())),
        (
            "draft",
            start(&[&chunk[..], &["--draft-model", draft.to_str().unwrap()]].concat()),
        ),
    ];
    let body = |i: usize| {
        let p = prompt_of(i);
        json!({"prompt": format!("{p} {p}"), "max_tokens": 32, "temperature": 0})
    };
    let want: Vec<Value> = (0..8).map(|i| plain.complete(body(i))).collect();
    for (by, s) in &servers {
        let alone: Vec<Value> = (0..8).map(|i| s.complete(body(i))).collect();
        let together = s.complete_at_once((0..8).map(body).collect());
        for i in 0..8 {
            let w = &want[i]["choices"][0]["text"];
            assert_eq!(&alone[i]["choices"][0]["text"], w, "{by} prompt {i}");
            assert_eq!(
                &together[i]["choices"][0]["text"], w,
                "{by} prompt {i}, 8 at once"
            );
        }
        for seed in 0..6 {
            let json_mode = json!({"prompt": "Data: ", "max_tokens": 16, "temperature": 1,
                "seed": seed, "response_format": {"type": "json_object"}});
            let t = text(&s.complete(json_mode));
            let v = serde_json::from_str::<Value>(&t);
            assert!(v.is_ok_and(|v| v.is_object()), "{by}: {t}");
        }
        let drafted = metric(s, "difftx_speculative_drafted_tokens_total");
        let accepted = metric(s, "difftx_speculative_accepted_tokens_total");
        assert!(
            accepted > 0.0 && accepted <= drafted,
            "{by}: {accepted} of {drafted}"
        );
    }
    assert_eq!(
        metric(&plain, "difftx_speculative_drafted_tokens_total"),
        0.0
    );
}

/// A draft model must share the model's tokenizer: `generate` and `serve` refuse another in
/// one line, exit 1; a missing one too.
#[test]
fn a_draft_model_with_another_tokenizer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::copy(model.join("config.json"), other.join("config.json")).unwrap();
    std::fs::copy(
        model.join("model.safetensors"),
        other.join("model.safetensors"),
    )
    .unwrap();
    let hf = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/llama_gqa");
    std::fs::copy(hf.join("tokenizer.json"), other.join("tokenizer.json")).unwrap();
    let m = model.to_str().unwrap();
    let o = other.to_str().unwrap();
    let run = |args: &[&str]| bin().args(args).output().unwrap();
    let gen = run(&[
        "generate",
        "--model",
        m,
        "--prompt",
        "x",
        "--draft-model",
        o,
    ]);
    fails_with(&gen, &["draft model", "tokenizer", "byte-level"]);
    let srv = run(&["serve", "--port", "0", "--model", m, "--draft-model", o]);
    fails_at_the_end_with(&srv, &["draft model", "same tokenizer"]);
    let gone = run(&[
        "serve",
        "--port",
        "0",
        "--model",
        m,
        "--draft-model",
        "/nowhere",
    ]);
    fails_with(&gone, &["--draft-model /nowhere"]);
}
