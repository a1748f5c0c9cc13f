//! The routes: each handler checks the key and the request, then queues jobs (`run::Run`) or
//! answers from the tokenizer; every failure is an OpenAI error object.

use super::api::{self, ApiError, ApiResult, Prompt, ToTokenize};
use super::run::{Api, Run};
use super::{App, Ready};
use crate::error::{Error, Result};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use std::sync::Arc;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, axum::Json(self.body())).into_response()
    }
}

type AppState = State<Arc<App>>;

fn answer(r: ApiResult<Response>) -> Response {
    r.unwrap_or_else(IntoResponse::into_response)
}

fn json_ok(v: Value) -> Response {
    axum::Json(v).into_response()
}

/// Serves on `listener` until SIGTERM/SIGINT, `shutdown` or a failed load; in-flight
/// requests get the grace period to end.
pub async fn run(
    app: Arc<App>,
    listener: std::net::TcpListener,
    shutdown: super::Shutdown,
) -> Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)
        .map_err(|e| Error::Invalid(format!("cannot listen: {e}")))?;
    let router = Router::new()
        .route("/", get(page))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/attention", post(attention))
        .route("/v1/embeddings", post(embeddings))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/tokenizer_info", get(tokenizer_info))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(app.clone(), count_status))
        .with_state(app.clone());
    let stopping = Arc::new(tokio::sync::Notify::new());
    let stop = stopping.clone();
    let app2 = app.clone();
    let shutdown = async move {
        let said = tokio::select! {
            _ = signal() => true,
            _ = shutdown.0.notified() => true,
            _ = app2.failed_notify.notified() => false,
        };
        if said {
            eprintln!(
                "difftx serve: stopping (no new requests; in-flight ones get {:?})",
                app2.opts.grace
            );
        }
        stop.notify_one();
    };
    let server = axum::serve(listener, router).with_graceful_shutdown(shutdown);
    let grace = app.opts.grace;
    tokio::select! {
        r = server => r.map_err(|e| Error::Invalid(format!("the server failed: {e}")))?,
        _ = async { stopping.notified().await; tokio::time::sleep(grace).await } => {
            eprintln!("difftx serve: grace period over, cancelling what is left");
        }
    }
    Ok(())
}

/// SIGTERM or SIGINT.
async fn signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut t), Ok(mut i)) => {
            tokio::select! { _ = t.recv() => {}, _ = i.recv() => {} }
        }
        // no signal handling: serve until killed
        _ => std::future::pending().await,
    }
}

async fn count_status(State(app): AppState, req: Request, next: Next) -> Response {
    let r = next.run(req).await;
    app.metrics.count_status(r.status().as_u16());
    r
}

async fn not_found(req: Request) -> Response {
    ApiError::new(
        404,
        "invalid_request_error",
        "not_found",
        format!("no route {} {}", req.method(), req.uri().path()),
    )
    .into_response()
}

/// The playground and attention explorer: one HTML file with its script and style inline.
const PAGE: &str = include_str!("page/index.html");

async fn page() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE).into_response()
}

async fn attention(State(app): AppState, headers: HeaderMap, body: Body) -> Response {
    answer(
        async {
            let (ready, req) = request(&app, &headers, body).await?;
            Ok(json_ok(
                super::maps::attention(app.clone(), ready, req).await?,
            ))
        }
        .await,
    )
}

async fn embeddings(State(app): AppState, headers: HeaderMap, body: Body) -> Response {
    answer(
        async {
            let (ready, req) = request(&app, &headers, body).await?;
            Ok(json_ok(
                super::embeddings::embeddings(app.clone(), ready, req).await?,
            ))
        }
        .await,
    )
}

async fn health(State(app): AppState) -> Response {
    answer(app.ready().map(|_| json_ok(json!({"status": "ok"}))))
}

async fn metrics(State(app): AppState) -> Response {
    let text = app.metrics.render(&app.gauges);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

async fn models(State(app): AppState, headers: HeaderMap) -> Response {
    answer((|| {
        app.authorize(&headers)?;
        let r = app.ready()?;
        Ok(json_ok(json!({"object": "list", "data": [{
            "id": app.name, "object": "model", "created": 0, "owned_by": "difftx",
            "max_model_len": r.context,
        }]})))
    })())
}

/// The key, the model's readiness and the body as a JSON object, checked in that order.
async fn request(app: &App, headers: &HeaderMap, body: Body) -> ApiResult<(Arc<Ready>, Value)> {
    app.authorize(headers)?;
    let ready = app.ready()?;
    let limit = app.opts.max_body_bytes;
    let too_big = || {
        ApiError::new(
            413,
            "invalid_request_error",
            "body_too_large",
            format!("the body is larger than {limit} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_big());
    }
    let bytes = axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| too_big())?;
    let req = api::parse_body(&bytes)?;
    api::check_model(&req, &app.name)?;
    Ok((ready, req))
}

/// Token ids of each prompt, checked against the vocabulary and the context.
fn encode(
    ready: &Ready,
    prompts: &[Prompt],
    max_tokens: usize,
) -> ApiResult<(Vec<Vec<u32>>, Vec<String>)> {
    let (mut ids, mut texts) = (Vec::new(), Vec::new());
    for p in prompts {
        let (i, t) = ready.encode(p)?;
        if i.len() + max_tokens > ready.context {
            return Err(ApiError::bad(
                "max_tokens",
                format!(
                    "the prompt's {} tokens plus max_tokens {} make {}, more than the model's context of {} tokens",
                    i.len(),
                    max_tokens,
                    i.len() + max_tokens,
                    ready.context
                ),
            ));
        }
        ids.push(i);
        texts.push(t);
    }
    Ok((ids, texts))
}

/// The answer of a run: streamed as server-sent events, or whole.
async fn respond(run: Run, stream: bool) -> ApiResult<Response> {
    if stream {
        let body = Body::from_stream(run.into_stream());
        return Ok((
            [
                (header::CONTENT_TYPE, "text/event-stream"),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            body,
        )
            .into_response());
    }
    Ok(json_ok(run.finish().await?))
}

async fn completions(State(app): AppState, headers: HeaderMap, body: Body) -> Response {
    answer(
        async {
            let (ready, req) = request(&app, &headers, body).await?;
            let (set, prompts) = api::completion_request(&req)?;
            let (ids, texts) = encode(&ready, &prompts, set.max_tokens)?;
            let stream = set.stream;
            respond(
                Run::start(app.clone(), Api::Completions, set, ids, texts)?,
                stream,
            )
            .await
        }
        .await,
    )
}

async fn chat(State(app): AppState, headers: HeaderMap, body: Body) -> Response {
    answer(
        async {
            let (ready, req) = request(&app, &headers, body).await?;
            let (messages, mut set) = api::chat_request(&req)?;
            let text = ready
                .chat
                .render(messages)
                .map_err(|e| ApiError::bad("messages", e))?;
            let ids = ready
                .tok
                .encode(&text)
                .map_err(|e| ApiError::bad("messages", e.to_string()))?;
            if set.max_tokens == usize::MAX {
                // no limit given: up to the end of the context
                set.max_tokens = ready.context.saturating_sub(ids.len()).max(1);
            }
            // chat answers do not echo the prompt; their log-probabilities (`logprobs: true`,
            // `top_logprobs`) cover the generated tokens
            set.echo = false;
            let (ids, texts) = encode(&ready, &[Prompt::Ids(ids)], set.max_tokens)?;
            let stream = set.stream;
            respond(Run::start(app.clone(), Api::Chat, set, ids, texts)?, stream).await
        }
        .await,
    )
}

/// `{"prompt": text}` or `{"messages": [...]}` → `{"tokens", "count", "max_model_len"}`.
async fn tokenize(State(app): AppState, headers: HeaderMap, body: Body) -> Response {
    answer(
        async {
            let (ready, req) = request(&app, &headers, body).await?;
            let text = match api::tokenize_request(&req)? {
                ToTokenize::Text(s) => s.to_string(),
                ToTokenize::Messages(m) => ready
                    .chat
                    .render(m)
                    .map_err(|e| ApiError::bad("messages", e))?,
            };
            let ids = ready
                .tok
                .encode(&text)
                .map_err(|e| ApiError::bad("prompt", e.to_string()))?;
            Ok(json_ok(
                json!({"tokens": ids, "count": ids.len(), "max_model_len": ready.context}),
            ))
        }
        .await,
    )
}

/// `{"tokens": [ids]}` → `{"prompt": text}`.
async fn detokenize(State(app): AppState, headers: HeaderMap, body: Body) -> Response {
    answer(
        async {
            let (ready, req) = request(&app, &headers, body).await?;
            let ids = api::detokenize_request(&req, ready.vocab)?;
            let text = ready
                .tok
                .decode(&ids)
                .map_err(|e| ApiError::bad("tokens", e.to_string()))?;
            Ok(json_ok(json!({"prompt": text})))
        }
        .await,
    )
}

/// What lm-evaluation-harness's remote tokenizer reads: the special tokens and chat template.
async fn tokenizer_info(State(app): AppState, headers: HeaderMap) -> Response {
    answer((|| {
        app.authorize(&headers)?;
        let r = app.ready()?;
        let eos = r.eos.and_then(|id| r.tok.decode(&[id]).ok());
        let class = if r.tok.file().is_some() {
            "tokenizers"
        } else {
            "byte-level"
        };
        Ok(json_ok(json!({
            "tokenizer_class": class, "eos_token": eos, "bos_token": null, "pad_token": null,
            "chat_template": r.chat.source(), "model_max_length": r.context, "vocab_size": r.vocab,
        })))
    })())
}
