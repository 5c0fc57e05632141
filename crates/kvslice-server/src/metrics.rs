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
        let get = |a: &AtomicU64| a.load(Relaxed) as f64;
        let rate = |tokens: &AtomicU64, micros: &AtomicU64| {
            let m = get(micros);
            if m == 0.0 { 0.0 } else { get(tokens) / (m / 1e6) }
        };
        let rows: [(&str, &str, &str, f64); 17] = [
            ("requests_total", "counter", "Completion requests received.", get(&self.requests)),
            ("requests_bad_total", "counter", "Requests answered 400.", get(&self.bad_requests)),
            ("requests_rejected_total", "counter", "Requests answered 429 (the queue was full).", get(&self.rejected)),
            ("requests_failed_total", "counter", "Requests that failed on the server.", get(&self.failed)),
            (
                "requests_cancelled_total",
                "counter",
                "Generations stopped because the client went away.",
                get(&self.cancelled),
            ),
            ("prompt_tokens_total", "counter", "Prompt tokens of every request.", get(&self.prompt_tokens)),
            (
                "prompt_tokens_cached_total",
                "counter",
                "Prompt tokens reused from a kept session's cache instead of prefilled.",
                get(&self.cached_tokens),
            ),
            ("completion_tokens_total", "counter", "Tokens generated.", get(&self.completion_tokens)),
            (
                "prefill_tokens_total",
                "counter",
                "Prompt tokens fed through the model (the uncached ones).",
                get(&self.prefill_tokens),
            ),
            ("decode_tokens_total", "counter", "Decode steps run.", get(&self.decode_tokens)),
            (
                "prefill_tokens_per_second",
                "gauge",
                "Prefill throughput over every request so far.",
                rate(&self.prefill_tokens, &self.prefill_micros),
            ),
            (
                "decode_tokens_per_second",
                "gauge",
                "Decode throughput over every request so far.",
                rate(&self.decode_tokens, &self.decode_micros),
            ),
            (
                "kv_bytes_held",
                "gauge",
                "KV cache storage of every session, kept or generating.",
                get(&self.kv_bytes_held),
            ),
            (
                "sessions",
                "gauge",
                "Sessions whose cache the server holds (kept between turns or generating).",
                get(&self.sessions_held),
            ),
            ("active_generations", "gauge", "Generations in progress.", get(&self.active)),
            ("queue_depth", "gauge", "Requests waiting for the engine.", get(&self.queue_depth)),
            (
                "sessions_evicted_total",
                "counter",
                "Kept sessions dropped (least recently used first) under the session and memory limits.",
                get(&self.sessions_evicted),
            ),
        ];
        let mut out = String::new();
        for (name, kind, help, value) in rows {
            let _ = writeln!(out, "# HELP kvslice_{name} {help}\n# TYPE kvslice_{name} {kind}\nkvslice_{name} {value}");
        }
        out
    }
}
