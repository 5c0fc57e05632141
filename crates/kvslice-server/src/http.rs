//! The HTTP side: OpenAI's routes on axum, each request handed to the engine through the
//! bounded queue and answered from the engine's events (streamed as server-sent events or
//! gathered into one body).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{SyncSender, TrySendError};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::api::{ApiError, ChatRequest, CompletionRequest, Prompt, Settings, parse};
use crate::engine::{Event, Input, Job, Usage};
use crate::metrics::Metrics;

/// What every handler shares.
pub struct AppState {
    pub jobs: SyncSender<Job>,
    pub metrics: Arc<Metrics>,
    pub model_name: String,
    pub next_id: AtomicU64,
}

/// The routes.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        // a long document is a large body; the context bounds what is used of it
        .layer(DefaultBodyLimit::max(32 << 20))
        .with_state(state)
}

fn error(e: &ApiError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, axum::Json(e.body())).into_response()
}

async fn not_found() -> Response {
    error(&ApiError { status: 404, message: "no such route".into(), kind: "invalid_request_error", param: None })
}

async fn health() -> Response {
    axum::Json(json!({"status": "ok"})).into_response()
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], st.metrics.render()).into_response()
}

async fn models(State(st): State<Arc<AppState>>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{"id": st.model_name, "object": "model", "created": 0, "owned_by": "kvslice"}],
    }))
    .into_response()
}

/// Which endpoint a request came through: the shapes of its answers.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Chat,
    Completion,
}

async fn chat(State(st): State<Arc<AppState>>, body: Bytes) -> Response {
    Metrics::add(&st.metrics.requests, 1);
    let request = parse::<ChatRequest>(&body).and_then(|r| {
        let settings = r.common.settings()?;
        if r.messages.is_empty() {
            return Err(ApiError::invalid("messages is empty", Some("messages")));
        }
        let messages = r.messages.iter().map(|m| Ok((m.role.clone(), m.text()?))).collect::<Result<Vec<_>, _>>()?;
        Ok((Input::Chat(messages), settings))
    });
    match request {
        Ok((input, settings)) => run(st, Kind::Chat, input, settings).await,
        Err(e) => bad(&st, e),
    }
}

async fn completions(State(st): State<Arc<AppState>>, body: Bytes) -> Response {
    Metrics::add(&st.metrics.requests, 1);
    let request = parse::<CompletionRequest>(&body).and_then(|r| {
        let settings = r.common.settings()?;
        let input = match r.prompt {
            Prompt::Text(t) => Input::Text(t),
            Prompt::Texts(mut v) if v.len() == 1 => Input::Text(v.remove(0)),
            Prompt::Texts(v) => {
                return Err(ApiError::invalid(
                    format!("{} prompts: one per request is supported", v.len()),
                    Some("prompt"),
                ));
            }
            Prompt::Tokens(ids) => Input::Tokens(ids),
        };
        Ok((input, settings))
    });
    match request {
        Ok((input, settings)) => run(st, Kind::Completion, input, settings).await,
        Err(e) => bad(&st, e),
    }
}

fn bad(st: &AppState, e: ApiError) -> Response {
    Metrics::add(&st.metrics.bad_requests, 1);
    error(&e)
}

/// Queues the job, waits for the engine to take it, then answers.
async fn run(st: Arc<AppState>, kind: Kind, input: Input, settings: Settings) -> Response {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let stream = settings.stream;
    let include_usage = settings.include_usage;
    st.metrics.queue_depth.fetch_add(1, Relaxed);
    match st.jobs.try_send(Job { input, settings, events: tx }) {
        Ok(()) => {}
        Err(e) => {
            st.metrics.queue_depth.fetch_sub(1, Relaxed);
            let (status, message) = match e {
                TrySendError::Full(_) => (429, "the server is busy: too many requests waiting; retry shortly"),
                TrySendError::Disconnected(_) => (503, "the engine has stopped"),
            };
            if status == 429 {
                Metrics::add(&st.metrics.rejected, 1);
            }
            let e = ApiError { status, message: message.into(), kind: "server_error", param: None };
            let mut response = error(&e);
            response.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            return response;
        }
    }
    match rx.recv().await {
        Some(Event::Started) => {}
        Some(Event::Failed(e)) => return error(&e),
        _ => return error(&ApiError::server("the engine dropped the request")),
    }
    let reply = Reply {
        kind,
        id: format!("{}-{}", if kind == Kind::Chat { "chatcmpl" } else { "cmpl" }, st.next_id.fetch_add(1, Relaxed)),
        created: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        model: st.model_name.clone(),
    };
    if stream { streamed(reply, rx, include_usage) } else { gathered(reply, rx).await }
}

/// The fields every answer of one request carries.
struct Reply {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
}

impl Reply {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value) -> Value {
        json!({"id": self.id, "object": self.object(chunk), "created": self.created, "model": self.model, "choices": choices})
    }

    /// One streamed piece: text, or the end with its reason.
    fn chunk(&self, text: Option<&str>, finish: Option<&str>, role: bool) -> Value {
        let choice = match self.kind {
            Kind::Chat => {
                let mut delta = serde_json::Map::new();
                if role {
                    delta.insert("role".into(), json!("assistant"));
                }
                if let Some(t) = text {
                    delta.insert("content".into(), json!(t));
                }
                json!({"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null})
            }
            Kind::Completion => {
                json!({"index": 0, "text": text.unwrap_or(""), "finish_reason": finish, "logprobs": null})
            }
        };
        self.envelope(true, json!([choice]))
    }
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        "kv_cache": {"entries": u.kv_entries, "bytes": u.kv_bytes},
    })
}

async fn gathered(reply: Reply, mut rx: UnboundedReceiver<Event>) -> Response {
    let mut text = String::new();
    while let Some(event) = rx.recv().await {
        match event {
            Event::Text(t) => text.push_str(&t),
            Event::Failed(e) => return error(&e),
            Event::Started => {}
            Event::Finished(u) => {
                let choice = match reply.kind {
                    Kind::Chat => json!({"index": 0, "message": {"role": "assistant", "content": text},
                                         "finish_reason": u.finish_reason, "logprobs": null}),
                    Kind::Completion => {
                        json!({"index": 0, "text": text, "finish_reason": u.finish_reason, "logprobs": null})
                    }
                };
                let mut body = reply.envelope(false, json!([choice]));
                body["usage"] = usage_json(&u);
                return axum::Json(body).into_response();
            }
        }
    }
    error(&ApiError::server("the generation ended without a result"))
}

/// Server-sent events: one `data:` line per piece, `data: [DONE]` at the end. When the client
/// goes away the stream (and with it the receiver) is dropped, which stops the generation.
fn streamed(reply: Reply, rx: UnboundedReceiver<Event>, include_usage: bool) -> Response {
    struct State {
        reply: Reply,
        rx: UnboundedReceiver<Event>,
        pending: VecDeque<String>,
        done: bool,
        include_usage: bool,
    }
    let mut first = VecDeque::new();
    if reply.kind == Kind::Chat {
        first.push_back(reply.chunk(Some(""), None, true).to_string());
    }
    let state = State { reply, rx, pending: first, done: false, include_usage };
    let events = futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(data) = s.pending.pop_front() {
                return Some((Ok::<_, std::convert::Infallible>(SseEvent::default().data(data)), s));
            }
            if s.done {
                return None;
            }
            match s.rx.recv().await {
                Some(Event::Text(t)) => s.pending.push_back(s.reply.chunk(Some(&t), None, false).to_string()),
                Some(Event::Started) => {}
                Some(Event::Finished(u)) => {
                    s.pending.push_back(s.reply.chunk(None, Some(u.finish_reason), false).to_string());
                    if s.include_usage {
                        let mut last = s.reply.envelope(true, json!([]));
                        last["usage"] = usage_json(&u);
                        s.pending.push_back(last.to_string());
                    }
                    s.pending.push_back("[DONE]".into());
                    s.done = true;
                }
                Some(Event::Failed(e)) => {
                    s.pending.push_back(e.body().to_string());
                    s.done = true;
                }
                None => {
                    s.pending.push_back(ApiError::server("the generation ended without a result").body().to_string());
                    s.done = true;
                }
            }
        }
    });
    Sse::new(events).into_response()
}
