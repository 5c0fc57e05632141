//! Counters and gauges shared by the HTTP side and the engine, written as Prometheus text.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Every figure `/metrics` reports.
#[derive(Debug, Default)]
pub struct Metrics {
    pub requests: AtomicU64,
    /// Answered 400 (bad request), 429 (queue full), 5xx.
    pub bad_requests: AtomicU64,
    pub rejected: AtomicU64,
    pub failed: AtomicU64,
    /// Streams whose client went away before the end.
    pub cancelled: AtomicU64,
    pub prompt_tokens: AtomicU64,
    /// Of them, reused from a kept session's cache.
    pub cached_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
    /// Tokens fed by prefills and their time (µs); decode steps and theirs.
    pub prefill_tokens: AtomicU64,
    pub prefill_micros: AtomicU64,
    pub decode_tokens: AtomicU64,
    pub decode_micros: AtomicU64,
    /// Gauges.
    pub kv_bytes_held: AtomicU64,
    pub sessions_held: AtomicU64,
    pub active: AtomicU64,
    pub queue_depth: AtomicU64,
    /// Kept sessions dropped to stay under `--max-sessions` and the KV memory limit.
    pub sessions_evicted: AtomicU64,
}

impl Metrics {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let get = |a: &AtomicU64| a.load(Relaxed);
        let rate = |tokens: &AtomicU64, micros: &AtomicU64| {
            let m = get(micros);
            if m == 0 { 0.0 } else { get(tokens) as f64 / (m as f64 / 1e6) }
        };
        let mut line = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(out, "# HELP kvslice_{name} {help}\n# TYPE kvslice_{name} {kind}\nkvslice_{name} {value}");
        };
        line("requests_total", "counter", "Completion requests received.", get(&self.requests).to_string());
        line("requests_bad_total", "counter", "Requests answered 400.", get(&self.bad_requests).to_string());
        line(
            "requests_rejected_total",
            "counter",
            "Requests answered 429 (the queue was full).",
            get(&self.rejected).to_string(),
        );
        line("requests_failed_total", "counter", "Requests that failed on the server.", get(&self.failed).to_string());
        line(
            "requests_cancelled_total",
            "counter",
            "Generations stopped because the client went away.",
            get(&self.cancelled).to_string(),
        );
        line("prompt_tokens_total", "counter", "Prompt tokens of every request.", get(&self.prompt_tokens).to_string());
        line(
            "prompt_tokens_cached_total",
            "counter",
            "Prompt tokens reused from a kept session's cache instead of prefilled.",
            get(&self.cached_tokens).to_string(),
        );
        line("completion_tokens_total", "counter", "Tokens generated.", get(&self.completion_tokens).to_string());
        line(
            "prefill_tokens_total",
            "counter",
            "Prompt tokens fed through the model (the uncached ones).",
            get(&self.prefill_tokens).to_string(),
        );
        line("decode_tokens_total", "counter", "Decode steps run.", get(&self.decode_tokens).to_string());
        line(
            "prefill_tokens_per_second",
            "gauge",
            "Prefill throughput over every request so far.",
            format!("{:.3}", rate(&self.prefill_tokens, &self.prefill_micros)),
        );
        line(
            "decode_tokens_per_second",
            "gauge",
            "Decode throughput over every request so far.",
            format!("{:.3}", rate(&self.decode_tokens, &self.decode_micros)),
        );
        line(
            "kv_bytes_held",
            "gauge",
            "KV cache storage of every session, kept or generating.",
            get(&self.kv_bytes_held).to_string(),
        );
        line(
            "sessions",
            "gauge",
            "Sessions whose cache the server holds (kept between turns or generating).",
            get(&self.sessions_held).to_string(),
        );
        line("active_generations", "gauge", "Generations in progress.", get(&self.active).to_string());
        line("queue_depth", "gauge", "Requests waiting for the engine.", get(&self.queue_depth).to_string());
        line(
            "sessions_evicted_total",
            "counter",
            "Kept sessions dropped (least recently used first) under the session and memory limits.",
            get(&self.sessions_evicted).to_string(),
        );
        out
    }
}
