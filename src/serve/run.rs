//! One request in flight: its jobs in the engine, the events coming back, and the answer built
//! from them, whole (`finish`) or as server-sent events (`SseStream`).

use super::api::{ApiError, ApiResult, JsonFormat, Settings};
use super::engine::{Event, Job, Task};
use super::respond::Choice;
use super::App;
use crate::infer::constrain::JsonConstraint;
use axum::body::Bytes;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// Which API the answer is shaped for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Completions,
    Chat,
}

pub struct Run {
    app: Arc<App>,
    api: Api,
    id: String,
    created: u64,
    set: Settings,
    prompts: Vec<Vec<u32>>,
    /// the text each echoed answer starts with
    echo_texts: Vec<String>,
    choices: Vec<Choice>,
    cancel: Vec<Arc<AtomicBool>>,
    rx: UnboundedReceiver<(usize, Event)>,
    open: usize,
    t0: Instant,
    first: Option<Instant>,
}

impl Drop for Run {
    /// A request that goes away (finished, or its client disconnected) takes its jobs out of
    /// the batch at their next token.
    fn drop(&mut self) {
        self.cancel
            .iter()
            .for_each(|c| c.store(true, Ordering::Relaxed));
    }
}

/// Each of `xs` `n` times in a row.
fn copies<T: Clone>(xs: Vec<T>, n: usize) -> Vec<T> {
    xs.iter()
        .flat_map(|x| std::iter::repeat_n(x.clone(), n))
        .collect()
}

impl Run {
    /// Queues `set.n` jobs per prompt, choice `p · n + j` the j-th of prompt p (OpenAI's
    /// order), each drawn with the request's seed plus j; 429 when the queue is full.
    pub fn start(
        app: Arc<App>,
        api: Api,
        set: Settings,
        prompts: Vec<Vec<u32>>,
        echo_texts: Vec<String>,
    ) -> ApiResult<Run> {
        let ready = app.ready()?;
        let bias: Vec<u32> = set.logit_bias.iter().map(|b| b.0).collect();
        super::api::check_ids(&bias, ready.vocab, "logit_bias")?;
        let (prompts, echo_texts) = (copies(prompts, set.n), copies(echo_texts, set.n));
        // more choices than the queue holds would be refused however long the client waited
        if prompts.len() > app.opts.max_queue {
            return Err(ApiError::bad(
                if set.n > 1 { "n" } else { "prompt" },
                format!(
                    "{} choices (n = {} for each prompt) exceed the queue of {} (--max-queue)",
                    prompts.len(),
                    set.n,
                    app.opts.max_queue
                ),
            ));
        }
        let n = app.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = unbounded_channel();
        let cancel: Vec<Arc<AtomicBool>> = prompts.iter().map(|_| Arc::default()).collect();
        let scored = set.echo && set.logprobs.is_some();
        let choices = prompts
            .iter()
            .map(|p| Choice::new(&ready.tok, p, scored))
            .collect();
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let run = Run {
            id: format!("{}-{n}", if api == Api::Chat { "chatcmpl" } else { "cmpl" }),
            created,
            open: prompts.len(),
            choices,
            cancel,
            rx,
            t0: Instant::now(),
            first: None,
            app: app.clone(),
            api,
            set,
            prompts,
            echo_texts,
        };
        for (i, p) in run.prompts.iter().enumerate() {
            let (tx, flag) = (tx.clone(), run.cancel[i].clone());
            let job = Job {
                prompt: p.clone(),
                max_tokens: run.set.max_tokens,
                sampling: run.set.sampling,
                // unseeded requests differ from each other; a prompt's n choices too
                seed: (run.set.seed)
                    .unwrap_or(n.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ created)
                    .wrapping_add((i % run.set.n) as u64),
                eos: ready.eos,
                logprobs: run.set.logprobs,
                logit_bias: run.set.logit_bias.clone(),
                echo: scored,
                json: run.set.json.as_ref().map(|f| match f {
                    JsonFormat::Object => JsonConstraint::new(ready.token_bytes.clone()),
                    JsonFormat::Schema(s) => {
                        JsonConstraint::with_schema(ready.token_bytes.clone(), s.clone())
                    }
                }),
                sink: Box::new(move |ev| !flag.load(Ordering::Relaxed) && tx.send((i, ev)).is_ok()),
            };
            app.submit(Task::Complete(Box::new(job)))?;
            app.metrics
                .prompt_tokens
                .fetch_add(p.len() as u64, Ordering::Relaxed);
        }
        Ok(run)
    }

    /// Takes one event into its choice; a choice that is over leaves the engine.
    fn apply(&mut self, i: usize, ev: Event) {
        if i >= self.choices.len() || self.choices[i].finish.is_some() {
            return;
        }
        if let Event::Token(..) = ev {
            self.app
                .metrics
                .generated_tokens
                .fetch_add(1, Ordering::Relaxed);
            if self.first.is_none() {
                self.first = Some(Instant::now());
                let m = &self.app.metrics;
                m.first_token_seconds
                    .observe(self.t0.elapsed().as_secs_f64());
            }
        }
        let Ok(ready) = self.app.ready() else { return };
        let open = self.choices[i].take(ev, &ready.tok, &self.prompts[i], &self.set.stop);
        if !open {
            self.cancel[i].store(true, Ordering::Relaxed);
            self.open -= 1;
            if self.open == 0 {
                self.observe_end();
            }
        }
    }

    fn observe_end(&self) {
        let m = &self.app.metrics;
        m.request_seconds.observe(self.t0.elapsed().as_secs_f64());
        let n: usize = self.choices.iter().map(|c| c.generated).sum();
        if let (Some(f), true) = (self.first, n > 1) {
            m.per_token_seconds
                .observe(f.elapsed().as_secs_f64() / (n - 1) as f64);
        }
    }

    fn usage(&self) -> Value {
        // each prompt counted once, however many choices it has
        let p: usize = self.prompts.iter().step_by(self.set.n).map(Vec::len).sum();
        let c: usize = self.choices.iter().map(|c| c.generated).sum();
        json!({"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c})
    }

    fn failure(&self) -> Option<ApiError> {
        self.choices
            .iter()
            .find_map(|c| c.error.as_ref())
            .map(|e| ApiError::new(500, "server_error", "generation_failed", e.clone()))
    }

    /// Waits for every choice and returns the whole answer.
    pub async fn finish(mut self) -> ApiResult<Value> {
        while self.open > 0 {
            match self.rx.recv().await {
                Some((i, ev)) => self.apply(i, ev),
                None => break,
            }
        }
        if let Some(e) = self.failure() {
            return Err(e);
        }
        let choices: Vec<Value> = (0..self.choices.len())
            .map(|i| {
                let c = &self.choices[i];
                match self.api {
                    Api::Completions => {
                        let echo = if self.set.echo { self.echo_texts[i].as_str() } else { "" };
                        let lp = self.set.logprobs.map(|_| c.logprobs(0, 0));
                        json!({"index": i, "text": format!("{echo}{}", c.text), "logprobs": lp, "finish_reason": c.finish})
                    }
                    Api::Chat => {
                        let lp = self.set.logprobs.map(|_| c.chat_logprobs(0));
                        json!({"index": i, "message": {"role": "assistant", "content": c.text}, "logprobs": lp, "finish_reason": c.finish})
                    }
                }
            })
            .collect();
        let object = if self.api == Api::Chat {
            "chat.completion"
        } else {
            "text_completion"
        };
        Ok(json!({
            "id": self.id, "object": object, "created": self.created, "model": self.app.name,
            "choices": choices, "usage": self.usage(),
        }))
    }

    /// One `data: {…}` chunk for choice `i`: its new text, and for completions its new
    /// log-probability rows.
    fn chunk(&mut self, i: usize, text: &str, finish: Option<&str>) -> Bytes {
        let choice = match self.api {
            Api::Completions => {
                let lp = self
                    .set
                    .logprobs
                    .map(|_| self.choices[i].fresh_logprobs(false));
                json!({"index": i, "text": text, "logprobs": lp, "finish_reason": finish})
            }
            Api::Chat => {
                let lp = self
                    .set
                    .logprobs
                    .map(|_| self.choices[i].fresh_logprobs(true));
                json!({"index": i, "delta": {"content": text}, "logprobs": lp, "finish_reason": finish})
            }
        };
        self.event(json!([choice]), Value::Null)
    }

    fn event(&self, choices: Value, usage: Value) -> Bytes {
        let object = if self.api == Api::Chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        let mut v = json!({"id": self.id, "object": object, "created": self.created, "model": self.app.name, "choices": choices});
        if !usage.is_null() {
            v["usage"] = usage;
        }
        Bytes::from(format!("data: {v}\n\n"))
    }

    /// The answer as server-sent events.
    pub fn into_stream(mut self) -> SseStream {
        let mut out = VecDeque::new();
        for i in 0..self.choices.len() {
            let first = match self.api {
                Api::Chat => {
                    let c = json!({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null});
                    Some(self.event(json!([c]), Value::Null))
                }
                Api::Completions if self.set.echo => {
                    let text = self.echo_texts[i].clone();
                    Some(self.chunk(i, &text, None))
                }
                Api::Completions => None,
            };
            out.extend(first);
        }
        SseStream {
            run: self,
            out,
            done: false,
        }
    }
}

/// A streamed answer: one chunk per token of each choice, the finish reasons, the usage when
/// asked for (`stream_options.include_usage`), then `data: [DONE]`.
pub struct SseStream {
    run: Run,
    out: VecDeque<Bytes>,
    done: bool,
}

impl SseStream {
    /// Queues what event `ev` of choice `i` adds to the stream.
    fn push(&mut self, i: usize, ev: Event) {
        let r = &mut self.run;
        let was_open = r
            .choices
            .get(i)
            .is_some_and(|c| c.finish.is_none() && c.error.is_none());
        let is_token = matches!(ev, Event::Token(..) | Event::Prompt(_));
        r.apply(i, ev);
        if !was_open {
            return;
        }
        let stops = r.set.stop.clone();
        let piece = r.choices[i].next_piece(&stops);
        if let Some(e) = r.choices[i].error.clone() {
            let err = ApiError::new(500, "server_error", "generation_failed", e);
            self.out
                .push_back(Bytes::from(format!("data: {}\n\n", err.body())));
        } else if is_token || !piece.is_empty() {
            let c = r.chunk(i, &piece, None);
            self.out.push_back(c);
        }
        if let Some(f) = r.choices[i].finish {
            let c = r.chunk(i, "", Some(f));
            self.out.push_back(c);
        }
        if r.open == 0 {
            if r.set.include_usage {
                let u = r.event(json!([]), r.usage());
                self.out.push_back(u);
            }
            self.out.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
            self.done = true;
        }
    }
}

impl futures_core::Stream for SseStream {
    type Item = Result<Bytes, std::convert::Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(b) = this.out.pop_front() {
                return Poll::Ready(Some(Ok(b)));
            }
            if this.done {
                return Poll::Ready(None);
            }
            match this.run.rx.poll_recv(cx) {
                Poll::Ready(Some((i, ev))) => this.push(i, ev),
                Poll::Ready(None) => {
                    this.out.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                    this.done = true;
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}
