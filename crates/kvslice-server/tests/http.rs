//! The server over real HTTP on 127.0.0.1, with the tiny seeded GGUF model on the CPU backend
//! (`tests/golden/tiny-gguf`, byte-level tokenizer, context 512). The text a request gets is
//! checked against the runtime's own generation loop on the same file (the loop itself is
//! checked against transformers' logits and a full recomputation elsewhere).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kvslice_runtime::{Compression, DeviceChoice, GenerateOptions, Generator, LoadedModel, init_device};
use kvslice_server::{EngineConfig, ServeOptions};
use serde_json::{Value, json};

fn model_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/tiny-gguf/tiny-llama-F32.gguf")
}

fn load() -> anyhow::Result<LoadedModel> {
    let (device, _) = pollster::block_on(init_device(DeviceChoice::Cpu))?;
    Ok(LoadedModel::open(&model_path(), &device)?)
}

fn config() -> EngineConfig {
    EngineConfig {
        default_kv: None,
        max_sessions: 8,
        kv_memory: 1 << 30,
        parallel: 4,
        session_ttl: Duration::from_secs(600),
    }
}

/// A server on a free port, serving until the test process ends.
fn start(engine: EngineConfig, queue: usize) -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    let options = ServeOptions { host: "127.0.0.1".into(), port: 0, queue, model_name: "tiny".into(), engine };
    std::thread::spawn(move || {
        kvslice_server::serve(options, load, |addr| tx.send(addr).unwrap()).unwrap();
    });
    rx.recv_timeout(Duration::from_secs(120)).expect("the server did not start")
}

struct Response {
    status: u16,
    headers: String,
    body: String,
}

impl Response {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

fn request(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> Response {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    let body = body.unwrap_or("");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let raw = String::from_utf8(raw).unwrap();
    let (head, rest) = raw.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let headers = head.to_ascii_lowercase();
    let body = if headers.contains("transfer-encoding: chunked") { dechunk(rest) } else { rest.to_string() };
    Response { status, headers, body }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap();
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

fn post(addr: SocketAddr, path: &str, body: &Value) -> Response {
    request(addr, "POST", path, Some(&body.to_string()))
}

fn metric(addr: SocketAddr, name: &str) -> f64 {
    let r = request(addr, "GET", "/metrics", None);
    let line = r.body.lines().find(|l| l.starts_with(&format!("kvslice_{name} "))).unwrap_or_else(|| panic!("{name}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// Waits (up to 30 s) for a gauge to reach `value`: the engine updates its gauges after it has
/// answered.
fn eventually(addr: SocketAddr, name: &str, value: f64) {
    let t0 = Instant::now();
    while metric(addr, name) != value {
        assert!(t0.elapsed() < Duration::from_secs(30), "{name} stays at {} instead of {value}", metric(addr, name));
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The runtime's greedy generation of `max` tokens after `prompt`, under `kv` (policy, budget).
fn reference(prompt: &[u32], max: usize, kv: Option<(&str, &str)>) -> (Vec<u32>, String) {
    let loaded = load().unwrap();
    let compression = kv.map(|(p, b)| Compression::new(p, b, &Compression::model_info(&loaded.model)).unwrap());
    let options = GenerateOptions::greedy(max, loaded.stop_tokens());
    let mut g = pollster::block_on(Generator::prefill(&loaded.model, prompt, options, compression.as_ref())).unwrap();
    let ids = pollster::block_on(g.run()).unwrap().to_vec();
    let text = loaded.decode(&ids).unwrap();
    (ids, text)
}

fn prompt(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + seed * 11 + 5) % 256).collect()
}

#[test]
fn health_models_metrics_and_unknown_routes() {
    let addr = start(config(), 8);
    assert_eq!(request(addr, "GET", "/health", None).json()["status"], "ok");
    let models = request(addr, "GET", "/v1/models", None).json();
    assert_eq!(models["data"][0]["id"], "tiny");
    let m = request(addr, "GET", "/metrics", None);
    assert!(m.headers.contains("content-type: text/plain"), "{}", m.headers);
    for name in ["requests_total", "kv_bytes_held", "sessions", "queue_depth", "prefill_tokens_per_second"] {
        assert!(m.body.contains(&format!("# TYPE kvslice_{name} ")), "{name} missing");
    }
    let missing = request(addr, "GET", "/v2/nothing", None);
    assert_eq!(missing.status, 404);
    assert_eq!(missing.json()["error"]["type"], "invalid_request_error");
}

#[test]
fn bad_requests_get_400_with_an_openai_error_body() {
    let addr = start(config(), 8);
    let cases: Vec<(&str, String, &str)> = vec![
        ("/v1/completions", "{\"prompt\": \"ab\"".into(), "not valid JSON"),
        ("/v1/completions", r#"{"prompt": 5}"#.into(), "invalid request"),
        ("/v1/chat/completions", r#"{"messages": []}"#.into(), "messages is empty"),
        (
            "/v1/completions",
            r#"{"prompt": "ab", "kv_policy": "nosuchpolicy", "kv_budget": "10%"}"#.into(),
            "nosuchpolicy",
        ),
        ("/v1/completions", r#"{"prompt": "ab", "kv_policy": "snapkv", "kv_budget": "ten"}"#.into(), "ten"),
        ("/v1/completions", r#"{"prompt": "ab", "kv_policy": "snapkv:window=0", "kv_budget": "10%"}"#.into(), "window"),
        ("/v1/completions", json!({"prompt": prompt(600, 1)}).to_string(), "context"),
        ("/v1/completions", json!({"prompt": prompt(500, 1), "max_tokens": 100}).to_string(), "context"),
        ("/v1/completions", r#"{"prompt": [300]}"#.into(), "vocabulary"),
        ("/v1/completions", r#"{"prompt": "ab", "n": 3}"#.into(), "one choice"),
        ("/v1/completions", r#"{"prompt": "ab", "temperature": -1}"#.into(), "temperature"),
        ("/v1/completions", r#"{"prompt": "ab", "max_tokens": 0}"#.into(), "max_tokens"),
    ];
    for (path, body, needle) in cases {
        let r = request(addr, "POST", path, Some(&body));
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        let e = r.json();
        assert_eq!(e["error"]["type"], "invalid_request_error", "{body}");
        let message = e["error"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{body}: `{message}` does not mention `{needle}`");
    }
    // the server is still there, and counted them
    assert_eq!(request(addr, "GET", "/health", None).status, 200);
    assert_eq!(metric(addr, "requests_bad_total"), 12.0);
}

#[test]
fn the_next_turn_continues_the_kept_cache() {
    let addr = start(config(), 8);
    let first = prompt(40, 2);
    let (ids, text) = reference(&first, 8, None);
    let body = json!({"model": "tiny", "prompt": first, "max_tokens": 8, "temperature": 0});
    let r = post(addr, "/v1/completions", &body).json();
    assert_eq!(r["object"], "text_completion");
    assert_eq!(r["choices"][0]["text"], text);
    assert_eq!(r["choices"][0]["finish_reason"], "length");
    assert_eq!(r["usage"]["prompt_tokens"], 40);
    assert_eq!(r["usage"]["completion_tokens"], 8);
    assert_eq!(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

    // the next turn: the conversation so far and new tokens; the cache holds the prompt and
    // all reply tokens but the last, which is fed with the new ones
    let second: Vec<u32> = first.iter().chain(&ids).chain(&prompt(12, 3)).copied().collect();
    let (_, expected) = reference(&second, 6, None);
    let body = json!({"prompt": second, "max_tokens": 6, "temperature": 0});
    let r = post(addr, "/v1/completions", &body).json();
    assert_eq!(r["usage"]["prompt_tokens_details"]["cached_tokens"], 40 + 7);
    assert_eq!(r["choices"][0]["text"], expected, "reused cache against a fresh prefill");

    // a prompt that leaves the conversation part-way goes back to the shared prefix (when that
    // keeps at least half of what the conversation holds: here 40 of 65 tokens)
    let mut third: Vec<u32> = second[..40].to_vec();
    third.extend(prompt(5, 9));
    let (_, expected) = reference(&third, 4, None);
    let r = post(addr, "/v1/completions", &json!({"prompt": third, "max_tokens": 4, "temperature": 0})).json();
    assert_eq!(r["choices"][0]["text"], expected);
    let cached = r["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert_eq!(cached, 40, "{cached} tokens reused");
    assert_eq!(metric(addr, "prompt_tokens_cached_total"), 87.0);
}

#[test]
fn a_compressed_conversation_stays_within_its_budget() {
    let addr = start(config(), 8);
    let kv = ("streaming-llm", "32");
    let first = prompt(200, 4);
    let (ids, text) = reference(&first, 6, Some(kv));
    let body = json!({"prompt": first, "max_tokens": 6, "temperature": 0, "kv_policy": kv.0, "kv_budget": kv.1});
    let r = post(addr, "/v1/completions", &body).json();
    assert_eq!(r["choices"][0]["text"], text);
    // 3 layers × 2 KV heads × 32 entries
    assert_eq!(r["usage"]["kv_cache"]["entries"], 192);
    let second: Vec<u32> = first.iter().chain(&ids).chain(&prompt(20, 5)).copied().collect();
    let body = json!({"prompt": second, "max_tokens": 6, "temperature": 0, "kv_policy": kv.0, "kv_budget": kv.1});
    let r = post(addr, "/v1/completions", &body).json();
    assert_eq!(r["usage"]["prompt_tokens_details"]["cached_tokens"], 205);
    assert_eq!(r["usage"]["kv_cache"]["entries"], 192, "the turn went through the eviction rule");
    // another policy does not reuse this conversation
    let body = json!({"prompt": second, "max_tokens": 2, "temperature": 0});
    let r = post(addr, "/v1/completions", &body).json();
    assert_eq!(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
}

#[test]
fn a_stream_carries_the_same_text_and_ends_with_done() {
    let addr = start(config(), 8);
    let p = prompt(30, 6);
    let (_, text) = reference(&p, 10, None);
    let body = json!({"prompt": p, "max_tokens": 10, "temperature": 0, "stream": true,
                      "stream_options": {"include_usage": true}});
    let r = post(addr, "/v1/completions", &body);
    assert_eq!(r.status, 200);
    assert!(r.headers.contains("content-type: text/event-stream"), "{}", r.headers);
    let data: Vec<&str> = r.body.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(data.last(), Some(&"[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    let streamed: String = chunks.iter().filter_map(|c| c["choices"].get(0).and_then(|x| x["text"].as_str())).collect();
    assert_eq!(streamed, text);
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 10);
    // a stop sequence cuts the text before it and ends with "stop"
    let cut: String = text.chars().take(4).collect();
    let stop: String = text.chars().skip(4).take(2).collect();
    if !stop.is_empty() && !cut.contains(&stop) {
        let body = json!({"prompt": p, "max_tokens": 10, "temperature": 0, "stop": [stop]});
        let r = post(addr, "/v1/completions", &body).json();
        assert_eq!(r["choices"][0]["text"], cut);
        assert_eq!(r["choices"][0]["finish_reason"], "stop");
    }
}

#[test]
fn a_full_queue_answers_429_with_retry_after() {
    let addr = start(EngineConfig { parallel: 1, ..config() }, 1);
    let clients: Vec<_> = (0..8)
        .map(|i| {
            std::thread::spawn(move || {
                let body = json!({"prompt": prompt(16, i), "max_tokens": 400, "temperature": 0});
                post(addr, "/v1/completions", &body)
            })
        })
        .collect();
    let responses: Vec<Response> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    let busy: Vec<&Response> = responses.iter().filter(|r| r.status == 429).collect();
    assert!(!busy.is_empty(), "8 requests of 400 tokens, one running and one waiting: some must be refused");
    for r in &busy {
        assert!(r.headers.contains("retry-after: 1"), "{}", r.headers);
        assert_eq!(r.json()["error"]["code"], "rate_limit_exceeded");
    }
    assert!(responses.iter().all(|r| r.status == 200 || r.status == 429));
    assert!(responses.iter().any(|r| r.status == 200));
    assert_eq!(metric(addr, "requests_rejected_total"), busy.len() as f64);
}

#[test]
fn a_client_that_goes_away_stops_its_generation_and_frees_its_cache() {
    let addr = start(EngineConfig { max_sessions: 8, ..config() }, 8);
    let body = json!({"prompt": prompt(20, 7), "max_tokens": 480, "temperature": 0, "stream": true}).to_string();
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut first = [0u8; 64];
    let n = s.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    drop(s);
    let t0 = Instant::now();
    while metric(addr, "requests_cancelled_total") < 1.0 {
        assert!(t0.elapsed() < Duration::from_secs(60), "the generation went on without its client");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(metric(addr, "decode_tokens_total") < 470.0, "stopped early");
    // nothing kept of it
    eventually(addr, "kv_bytes_held", 0.0);
    eventually(addr, "sessions", 0.0);
}

#[test]
fn kept_conversations_go_least_recently_used_first_under_the_limits() {
    let continued = |addr: SocketAddr, p: &[u32]| {
        let r = post(addr, "/v1/completions", &json!({"prompt": p, "max_tokens": 2, "temperature": 0})).json();
        let ids: Vec<u32> = p.iter().copied().chain(prompt(3, 8)).collect();
        (r["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(), ids)
    };
    // one kept conversation at most: b pushes a out
    let addr = start(EngineConfig { max_sessions: 1, ..config() }, 8);
    let (a, b) = (prompt(30, 10), prompt(30, 11));
    let (_, a_next) = continued(addr, &a);
    let (_, b_next) = continued(addr, &b);
    eventually(addr, "sessions_evicted_total", 1.0);
    assert_eq!(continued(addr, &a_next).0, 0, "a was dropped");
    eventually(addr, "sessions_evicted_total", 2.0);
    assert_eq!(continued(addr, &b_next).0, 0, "and b after it");

    // a KV memory limit below one conversation's cache keeps none
    let addr = start(EngineConfig { kv_memory: 1024, ..config() }, 8);
    let (_, a_next) = continued(addr, &a);
    eventually(addr, "kv_bytes_held", 0.0);
    assert_eq!(continued(addr, &a_next).0, 0);

    // an idle conversation expires
    let addr = start(EngineConfig { session_ttl: Duration::from_millis(200), ..config() }, 8);
    let (_, a_next) = continued(addr, &a);
    eventually(addr, "sessions", 0.0);
    assert_eq!(continued(addr, &a_next).0, 0);
}
