//! `kvslice serve`: an OpenAI-compatible HTTP server (`/v1/chat/completions`,
//! `/v1/completions`, `/v1/models`, `/health`, `/metrics`) over one loaded model, whose
//! conversations keep their (compressed) KV cache between requests.
//!
//! Threads: tokio runs the HTTP side; one engine thread owns the model and every session and
//! runs the generations ([`engine`]). They meet in a bounded queue of jobs, and each job
//! carries a channel back for its events.

pub mod api;
pub mod engine;
mod http;
pub mod metrics;
pub mod stop;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use anyhow::Context;
use kvslice_runtime::LoadedModel;

pub use engine::EngineConfig;
use metrics::Metrics;

/// The server's settings.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub host: String,
    /// 0 picks a free port (reported to `ready`).
    pub port: u16,
    /// Requests that may wait for the engine; one more is answered 429.
    pub queue: usize,
    /// The model's name in `/v1/models` and in every answer.
    pub model_name: String,
    pub engine: EngineConfig,
}

/// Loads the model on the engine thread (`load`), listens, calls `ready` with the address, and
/// serves until Ctrl-C or SIGTERM.
pub fn serve(
    options: ServeOptions,
    load: impl FnOnce() -> anyhow::Result<LoadedModel> + Send + 'static,
    ready: impl FnOnce(SocketAddr),
) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::default());
    let (jobs, queue) = std::sync::mpsc::sync_channel(options.queue);
    let (loaded_tx, loaded_rx) = std::sync::mpsc::channel::<anyhow::Result<()>>();
    let engine_metrics = metrics.clone();
    let config = options.engine.clone();
    let engine = std::thread::Builder::new().name("kvslice-engine".into()).spawn(move || {
        let model = match load() {
            Ok(m) => m,
            Err(e) => {
                let _ = loaded_tx.send(Err(e));
                return;
            }
        };
        // a bad default policy is an error at start, not on every request
        if let Some((policy, budget)) = &config.default_kv
            && let Err(e) = kvslice_runtime::Compression::new(
                policy,
                budget,
                &kvslice_runtime::Compression::model_info(&model.model),
            )
        {
            let _ = loaded_tx.send(Err(anyhow::anyhow!("--policy {policy} --budget {budget}: {e}")));
            return;
        }
        let _ = loaded_tx.send(Ok(()));
        // the model serves for the rest of the process: sessions borrow it for 'static
        let model: &'static LoadedModel = Box::leak(Box::new(model));
        engine::Engine::new(model, config, engine_metrics).run(queue);
    })?;
    loaded_rx.recv().context("the engine thread ended while loading the model")??;

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let state = Arc::new(http::AppState { jobs, metrics, model_name: options.model_name, next_id: AtomicU64::new(1) });
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind((options.host.as_str(), options.port))
            .await
            .with_context(|| format!("listening on {}:{}", options.host, options.port))?;
        ready(listener.local_addr()?);
        axum::serve(listener, http::router(state)).with_graceful_shutdown(shutdown()).await?;
        anyhow::Ok(())
    })?;
    // the router (and the queue's last sender) is gone: the engine finishes its work and ends
    let _ = engine.join();
    Ok(())
}

async fn shutdown() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            s.recv().await;
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
