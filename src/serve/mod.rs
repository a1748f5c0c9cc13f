//! `difftx serve`: an OpenAI-compatible HTTP server over one model (docs/SERVING.md).
//!
//! ```text
//! HTTP (axum, one tokio thread) ──bounded queue──▶ engine thread (continuous batching)
//!        ▲                                              │
//!        └──────────── events per request ◀─────────────┘
//! ```
//!
//! The engine (`engine`) owns the model and runs the batch; the HTTP side (`http`) checks
//! requests (`api`), queues one job per prompt and builds answers from the events (`run`,
//! `respond`). The model loads on the engine thread while the server already answers
//! (`/health` says 503 until it is ready).

#[doc(hidden)]
pub mod api;
#[doc(hidden)]
pub mod chat;
mod embeddings;
#[doc(hidden)]
pub mod engine;
mod http;
mod maps;
#[doc(hidden)]
pub mod metrics;
pub mod prefix;
#[doc(hidden)]
pub mod respond;
mod run;
pub mod score;

use crate::data::Tokenizer;
use crate::error::{Error, Result};
use crate::model::Model;
use api::{ApiError, ApiResult};
use engine::{Engine, EngineGauges, EngineOptions, Task};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// How `serve` listens and batches.
pub struct ServeOptions {
    /// Address to listen on.
    pub host: String,
    /// Port to listen on (0: one the system picks).
    pub port: u16,
    /// clients must send `Authorization: Bearer KEY`
    pub api_key: Option<String>,
    /// sequences decoded together at most
    pub parallel: usize,
    /// requests waiting for a batch slot at most; more get 429
    pub max_queue: usize,
    /// prompt tokens prefilled per engine step
    pub chunk: usize,
    /// request bodies larger than this get 413
    pub max_body_bytes: usize,
    /// bytes of prompt blocks kept for later requests that start alike (0 keeps none)
    pub prefix_cache: usize,
    /// the name `/v1/models` lists and requests may give as `model`
    pub name: String,
    /// how long in-flight requests may run on after SIGTERM/SIGINT
    pub grace: Duration,
    /// speculative decoding's drafts: none, prompt lookup's, or a draft model's
    pub speculate: Speculate,
}

/// Where the server's speculative decoding takes its drafts from (`infer::speculative`).
#[derive(Clone, Debug, Default)]
pub enum Speculate {
    /// plain decoding
    #[default]
    Off,
    /// prompt lookup, drafts of up to this many tokens
    Lookup(usize),
    /// a draft model loaded beside the model
    Draft {
        /// what `open_model` opens, with the model's tokenizer
        dir: PathBuf,
        /// tokens drafted a step at most
        tokens: usize,
    },
}

/// Loads the model (on the engine thread, while the server answers 503): the model and the
/// directory it came from (for its tokenizer and chat template).
pub type Loader = Box<dyn FnOnce() -> std::result::Result<(Model, PathBuf), String> + Send>;

/// What the server knows once the model is loaded.
#[doc(hidden)]
pub struct Ready {
    pub tok: Tokenizer,
    pub chat: chat::ChatTemplate,
    pub context: usize,
    pub vocab: usize,
    pub eos: Option<u32>,
    pub attention: crate::config::AttentionKind,
    pub layers: usize,
    pub heads: usize,
    /// each token's bytes (`None`: special), which JSON mode checks tokens by
    pub token_bytes: Arc<Vec<Option<Vec<u8>>>>,
}

impl Ready {
    /// A prompt's token ids and text, checked against the vocabulary; an empty one is refused.
    fn encode(&self, p: &api::Prompt) -> ApiResult<(Vec<u32>, String)> {
        self.encode_as(p, "prompt")
    }

    /// `encode` for a request's field `field` (`input` for embeddings), which errors name.
    fn encode_as(&self, p: &api::Prompt, field: &'static str) -> ApiResult<(Vec<u32>, String)> {
        let (i, t) = match p {
            api::Prompt::Text(s) => {
                let i = self
                    .tok
                    .encode(s)
                    .map_err(|e| ApiError::bad(field, e.to_string()))?;
                (i, s.clone())
            }
            api::Prompt::Ids(i) => {
                api::check_ids(i, self.vocab, field)?;
                (i.clone(), self.tok.decode(i).unwrap_or_default())
            }
        };
        if i.is_empty() {
            return Err(ApiError::bad(
                field,
                format!("the {field} is empty: at least one token is needed"),
            ));
        }
        Ok((i, t))
    }
}

#[doc(hidden)]
pub struct App {
    opts: ServeOptions,
    name: String,
    ready: OnceLock<Arc<Ready>>,
    queue: SyncSender<Task>,
    gauges: Arc<EngineGauges>,
    metrics: metrics::Metrics,
    next_id: AtomicU64,
    /// why loading failed, once it has
    failed: Mutex<Option<String>>,
    failed_notify: tokio::sync::Notify,
}

impl App {
    fn ready(&self) -> ApiResult<Arc<Ready>> {
        self.ready.get().cloned().ok_or_else(|| {
            ApiError::new(
                503,
                "service_unavailable",
                "model_loading",
                "the model is still loading",
            )
        })
    }

    /// 401 unless the request carries the API key (when one is set).
    fn authorize(&self, headers: &axum::http::HeaderMap) -> ApiResult<()> {
        let Some(key) = &self.opts.api_key else {
            return Ok(());
        };
        let given = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given == Some(key.as_str()) {
            return Ok(());
        }
        Err(ApiError::new(
            401,
            "authentication_error",
            "invalid_api_key",
            "missing or wrong API key: send the header Authorization: Bearer KEY",
        ))
    }

    /// Runs a job on the model thread, between two engine steps, and waits for its answer:
    /// `task` wraps the reply the engine hands the result to; a stopped engine is a 503, the
    /// job's own error a 500 with `code` (the attention maps, the embeddings).
    async fn on_model_thread<T: Send + 'static>(
        &self,
        task: impl FnOnce(Box<dyn FnOnce(Result<T>) + Send>) -> Task,
        code: &'static str,
    ) -> ApiResult<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.submit(task(Box::new(move |r| {
            let _ = tx.send(r);
        })))?;
        rx.await
            .map_err(|_| {
                ApiError::new(
                    503,
                    "service_unavailable",
                    "engine_stopped",
                    "the model loop has stopped",
                )
            })?
            .map_err(|e| ApiError::new(500, "server_error", code, e.to_string()))
    }

    fn submit(&self, job: Task) -> ApiResult<()> {
        self.gauges.queued.fetch_add(1, Ordering::Relaxed);
        match self.queue.try_send(job) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.gauges.queued.fetch_sub(1, Ordering::Relaxed);
                Err(match e {
                    TrySendError::Full(_) => ApiError::new(
                        429,
                        "rate_limit_error",
                        "queue_full",
                        format!(
                            "the queue is full ({} requests wait): try again later",
                            self.opts.max_queue
                        ),
                    ),
                    TrySendError::Disconnected(_) => ApiError::new(
                        503,
                        "service_unavailable",
                        "engine_stopped",
                        "the model loop has stopped",
                    ),
                })
            }
        }
    }
}

/// Serves until SIGTERM or SIGINT (then exits cleanly after at most `grace`), or fails when the
/// address cannot be bound or the model does not load. `on_listening` hears the bound address
/// (the port is chosen by the system when `port` is 0).
///
/// To embed the server, run it on a thread of your own with `serve_until`, which also stops
/// when its `Shutdown` handle says so (`examples/embed_server.rs`):
///
/// ```
/// use difftx::prelude::*;
/// use std::io::{Read, Write};
///
/// let dir = tempfile::tempdir()?;
/// Model::init(ModelConfig::preset(Preset::Tiny, AttentionKind::DiffV1), 0)?.save(dir.path())?;
/// let opts = ServeOptions {
///     host: "127.0.0.1".into(),
///     port: 0, // the system picks a free one
///     api_key: None,
///     parallel: 4,
///     max_queue: 16,
///     chunk: 64,
///     max_body_bytes: 1 << 20,
///     prefix_cache: 64 << 20,
///     name: "tiny".into(),
///     grace: std::time::Duration::from_secs(1),
///     speculate: Speculate::Off,
/// };
/// let path = dir.path().to_path_buf();
/// let load: difftx::serve::Loader = Box::new(move || {
///     let (model, _tok) = open_model(&path).map_err(|e| e.to_string())?;
///     Ok((model, path))
/// });
/// let (tx, rx) = std::sync::mpsc::channel();
/// let shutdown = Shutdown::new();
/// let handle = shutdown.clone();
/// let server =
///     std::thread::spawn(move || serve_until(opts, load, move |a| tx.send(a).unwrap(), handle));
/// let addr = rx.recv()?;
/// let health = loop {
///     let mut s = std::net::TcpStream::connect(addr)?;
///     s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
///     let mut answer = String::new();
///     s.read_to_string(&mut answer)?;
///     if !answer.starts_with("HTTP/1.1 503") {
///         break answer; // 503 while the model loads
///     }
///     std::thread::sleep(std::time::Duration::from_millis(20));
/// };
/// assert!(health.starts_with("HTTP/1.1 200"), "{health}");
/// shutdown.stop();
/// server.join().unwrap()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn serve(
    opts: ServeOptions,
    load: Loader,
    on_listening: impl FnOnce(SocketAddr),
) -> Result<()> {
    serve_until(opts, load, on_listening, Shutdown::default())
}

/// Stops a server that `serve_until` runs, as SIGTERM does: it takes no new connections and
/// its in-flight requests get the grace period. Clone it to keep one where the server is not;
/// a stop asked before the server listens stops it as soon as it does.
#[derive(Clone, Default)]
pub struct Shutdown(Arc<tokio::sync::Notify>);

impl Shutdown {
    /// A handle that stops nothing until `stop` is called.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks the server to stop.
    pub fn stop(&self) {
        self.0.notify_one();
    }
}

/// `serve`, which also stops when `shutdown.stop()` is called: for a program that embeds the
/// server and stops it itself (`examples/embed_server.rs`).
pub fn serve_until(
    opts: ServeOptions,
    load: Loader,
    on_listening: impl FnOnce(SocketAddr),
    shutdown: Shutdown,
) -> Result<()> {
    if opts.parallel == 0 || opts.max_queue == 0 || opts.chunk == 0 {
        return Err(Error::Invalid(
            "--parallel, --max-queue and the prefill chunk must be at least 1".into(),
        ));
    }
    let addr = format!("{}:{}", opts.host, opts.port);
    let listener = std::net::TcpListener::bind(&addr)
        .map_err(|e| Error::Invalid(format!("cannot listen on {addr}: {e}")))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::Invalid(format!("cannot listen on {addr}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::Invalid(format!("cannot listen on {addr}: {e}")))?;
    let (tx, rx) = sync_channel(opts.max_queue);
    let eopts = EngineOptions {
        parallel: opts.parallel,
        chunk: opts.chunk,
        prefix_cache: opts.prefix_cache,
        lookup: match opts.speculate {
            Speculate::Lookup(n) => n,
            _ => 0,
        },
    };
    let draft = match &opts.speculate {
        Speculate::Draft { dir, tokens } => Some((dir.clone(), *tokens)),
        _ => None,
    };
    let app = Arc::new(App {
        name: opts.name.clone(),
        opts,
        ready: OnceLock::new(),
        queue: tx,
        gauges: Arc::default(),
        metrics: Default::default(),
        next_id: AtomicU64::new(0),
        failed: Mutex::new(None),
        failed_notify: tokio::sync::Notify::new(),
    });
    // 1. The engine thread: load, then serve the queue until the server is gone.
    let engine_app = app.clone();
    std::thread::Builder::new()
        .name("difftx-engine".into())
        .spawn(move || {
            if let Err(e) = load_and_run(&engine_app, load, (eopts, draft), rx) {
                *engine_app.failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                engine_app.failed_notify.notify_one();
            }
        })
        .map_err(|e| Error::Invalid(format!("cannot start the model thread: {e}")))?;
    // 2. The HTTP side on this thread.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Invalid(format!("cannot start the HTTP runtime: {e}")))?;
    on_listening(bound);
    rt.block_on(http::run(app.clone(), listener, shutdown))?;
    let failed = app.failed.lock().unwrap_or_else(|p| p.into_inner()).take();
    match failed {
        Some(e) => Err(Error::Invalid(e)),
        None => Ok(()),
    }
}

fn load_and_run(
    app: &Arc<App>,
    load: Loader,
    (eopts, draft): (EngineOptions, Option<(PathBuf, usize)>),
    rx: std::sync::mpsc::Receiver<Task>,
) -> std::result::Result<(), String> {
    // a request's numbers must not depend on the batch beside it (see `set_batch_invariant`)
    crate::kernels::gemm::linear::set_batch_invariant(eopts.parallel);
    let (model, dir) = load()?;
    let tok = Tokenizer::for_model(&dir, &model.config).map_err(|e| e.to_string())?;
    let chat = chat::ChatTemplate::for_model(&dir).map_err(|e| e.to_string())?;
    let eos = tok.eos_id(&model.config);
    let draft_model = match &draft {
        Some((dir, _)) => {
            Some(crate::open_draft_model(dir, &model, &tok).map_err(|e| e.to_string())?)
        }
        None => None,
    };
    let mut engine = Engine::new(&model, eopts, app.gauges.clone()).map_err(|e| e.to_string())?;
    if let (Some(d), Some((_, tokens))) = (&draft_model, &draft) {
        let d = crate::infer::DraftModel::new(d, &model, *tokens).map_err(|e| e.to_string())?;
        engine = engine.with_draft(d).map_err(|e| e.to_string())?;
    }
    let token_bytes = (0..model.config.vocab_size as u32)
        .map(|t| tok.token_bytes(t))
        .collect();
    let _ = app.ready.set(Arc::new(Ready {
        token_bytes: Arc::new(token_bytes),
        tok,
        chat,
        context: model.config.max_position_embeddings,
        vocab: model.config.vocab_size,
        eos,
        attention: model.config.attention,
        layers: model.config.num_hidden_layers,
        heads: model.config.num_attention_heads,
    }));
    eprintln!(
        "difftx serve: model ready ({} parameters)",
        model.num_params()
    );
    engine.run(rx);
    Ok(())
}
