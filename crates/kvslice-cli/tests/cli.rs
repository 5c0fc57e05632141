//! The `kvslice` binary: output formats other tools rely on, and one-line errors for bad input.

use std::path::PathBuf;
use std::process::{Command, Output};

fn kvslice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvslice")).args(args).output().expect("run kvslice")
}

fn golden(relative: &str) -> serde_json::Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden").join(relative);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn default_model() -> String {
    let p = kvslice_model_path();
    assert!(p.is_file(), "{} missing: run `kvslice fetch`", p.display());
    p.display().to_string()
}

fn kvslice_model_path() -> PathBuf {
    let out = kvslice(&["fetch"]);
    assert!(out.status.success(), "fetch: {}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

fn one_line_error(out: &Output) -> String {
    assert!(!out.status.success(), "expected failure, got success: {}", String::from_utf8_lossy(&out.stdout));
    let err = String::from_utf8(out.stderr.clone()).unwrap();
    assert!(!err.contains("panicked"), "panic: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line expected: {err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    lines[0].to_string()
}

#[test]
fn logits_prints_tokens_and_top_k_as_json() {
    let model = default_model();
    let g = golden("smollm2/logits.json");
    let case = &g["cases"][0];
    let text = case["text"].as_str().unwrap();
    let out = kvslice(&["logits", "--model", &model, "--text", text, "--top", "5", "--device", "cpu"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["tokens"], case["token_ids"]);
    let top = json["top"].as_array().unwrap();
    assert_eq!(top.len(), 5);
    let want = case["positions"].as_array().unwrap().last().unwrap()["top"].as_array().unwrap();
    for (got, want) in top.iter().zip(want) {
        assert_eq!(got[0], want[0]);
        assert!((got[1].as_f64().unwrap() - want[1].as_f64().unwrap()).abs() < 1e-2, "{got} vs {want}");
    }
}

#[test]
fn generate_streams_text_and_reports_speed() {
    let model = default_model();
    let out = kvslice(&[
        "generate",
        "--model",
        &model,
        "--chat",
        "--prompt",
        "What is the capital of France? Answer in one sentence.",
        "--max-new-tokens",
        "12",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    // transformers' greedy answer (tests/golden/smollm2/greedy.json, case chat_capital).
    assert_eq!(text.trim(), "The capital of France is Paris.");
    let err = String::from_utf8(out.stderr).unwrap();
    let last = err.lines().last().unwrap();
    assert!(last.starts_with("prefill: 42 tokens, ") && last.contains(" tok/s; decode: "), "{last}");
}

#[test]
fn missing_model_is_a_one_line_error() {
    let out = kvslice(&["logits", "--model", "/nonexistent/model.gguf", "--text", "hi", "--device", "cpu"]);
    let line = one_line_error(&out);
    assert!(line.contains("/nonexistent/model.gguf"), "{line}");
}

#[test]
fn corrupt_gguf_is_a_one_line_error() {
    let dir = std::env::temp_dir().join(format!("kvslice-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("corrupt.gguf");
    // A GGUF header claiming 2^40 tensors in a 24-byte file.
    let mut bytes = b"GGUF".to_vec();
    bytes.extend(3u32.to_le_bytes());
    bytes.extend((1u64 << 40).to_le_bytes());
    bytes.extend(0u64.to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
    let out = kvslice(&["logits", "--model", path.to_str().unwrap(), "--text", "hi", "--device", "cpu"]);
    one_line_error(&out);
    let truncated = dir.join("truncated.gguf");
    let real = std::fs::read(default_model()).unwrap();
    std::fs::write(&truncated, &real[..real.len() / 3]).unwrap();
    let out = kvslice(&["logits", "--model", truncated.to_str().unwrap(), "--text", "hi", "--device", "cpu"]);
    one_line_error(&out);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_options_are_one_line_errors() {
    let model = default_model();
    let out = kvslice(&["generate", "--model", &model, "--prompt", "hi", "--device", "tpu"]);
    assert!(one_line_error(&out).contains("tpu"));
    let out = kvslice(&["generate", "--model", &model, "--prompt", "hi", "--temperature=-1", "--device", "cpu"]);
    assert!(one_line_error(&out).contains("temperature"));
    // A prompt longer than the 8192-token context.
    let long = "word ".repeat(9000);
    let out = kvslice(&["generate", "--model", &model, "--prompt", &long, "--device", "cpu"]);
    assert!(one_line_error(&out).contains("context"));
}

#[test]
fn policies_lists_every_policy_with_its_paper() {
    let out = kvslice(&["policies"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for name in ["streaming-llm", "h2o", "snapkv", "tova", "pyramidkv", "cake", "adakv", "lacache", "snapkv-span"] {
        assert!(text.lines().any(|l| l.starts_with(&format!("{name} "))), "{name} missing:\n{text}");
    }
    assert!(text.contains("arXiv:2404.14469") && text.contains("ICLR 2025"), "{text}");
}

fn smoke_cases() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/eval/smoke.jsonl").display().to_string()
}

/// `kvslice fetch --corpus` gives both texts; `cases --corpus shakespeare` draws its haystack from
/// the plays (consecutive speeches, joined by spaces) and marks its ids, so suites over both
/// corpora can share a file.
#[test]
fn cases_draw_from_shakespeare() {
    let model = default_model();
    let out = kvslice(&["fetch", "--corpus"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let paths: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect();
    assert!(paths.len() == 3 && paths[1].ends_with("kjv.txt") && paths[2].ends_with("shakespeare.txt"), "{paths:?}");
    let plays = std::fs::read_to_string(&paths[2]).unwrap();
    let kjv = std::fs::read_to_string(&paths[1]).unwrap();
    let out =
        kvslice(&["cases", "--model", &model, "--kind", "doc-multikey", "--tokens", "400", "--corpus", "shakespeare"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["id"], "doc-multikey-400-s1-shakespeare");
    assert_eq!(doc["questions"].as_array().unwrap().len(), 2);
    let body = doc["context"].as_str().unwrap().split('\n').nth(1).unwrap();
    let opening: Vec<&str> = body.split_whitespace().take(12).collect();
    let opening = opening.join(" ");
    let joined = plays.lines().collect::<Vec<_>>().join(" ");
    assert!(joined.contains(&opening) && !kjv.contains(&opening), "{opening}");
}

/// A document is prefilled without its questions and each question is fed after it: with the full
/// cache (and with a budget past the context) every question gets the output of prefilling its
/// whole prompt at once, which a prompt case with the same text gives; the report counts
/// questions, each with its whole prompt's tokens.
#[test]
fn eval_answers_each_question_of_a_document() {
    let model = default_model();
    let dir = std::env::temp_dir().join(format!("kvslice-eval-doc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let docs = dir.join("doc.jsonl");
    let out = kvslice(&[
        "cases",
        "--model",
        &model,
        "--kind",
        "doc-niah",
        "--tokens",
        "320",
        "--out",
        docs.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: serde_json::Value = serde_json::from_str(std::fs::read_to_string(&docs).unwrap().trim()).unwrap();
    let (id, context) = (doc["id"].as_str().unwrap(), doc["context"].as_str().unwrap());
    let questions = doc["questions"].as_array().unwrap();
    assert_eq!(questions.len(), 6);
    // The same texts as prompt cases, each prefilled whole.
    let mut lines = vec![doc.to_string()];
    for (i, q) in questions.iter().enumerate() {
        let prompt = format!("{context}\n{}", q["question"].as_str().unwrap());
        lines.push(
            serde_json::json!({"id": format!("p{}", i + 1), "prompt": prompt, "answer": q["answer"]}).to_string(),
        );
    }
    let cases = dir.join("cases.jsonl");
    std::fs::write(&cases, lines.join("\n") + "\n").unwrap();
    let json = dir.join("report.json");
    let out = kvslice(&[
        "eval",
        "--model",
        &model,
        "--device",
        "cpu",
        "--cases",
        cases.to_str().unwrap(),
        "--policy",
        "snapkv",
        "--budget",
        "4096,50%",
        "--max-new-tokens",
        "8",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let runs = report["runs"].as_object().unwrap();
    assert_eq!(runs.keys().collect::<Vec<_>>(), ["full", "snapkv@4096", "snapkv@50%"]);
    for (key, run) in runs {
        assert_eq!(run["total"], 12, "{key}");
        assert_eq!(run["cases"].as_object().unwrap().len(), 12, "{key}");
    }
    let case = |run: &str, id: &str| runs[run]["cases"][id].clone();
    for i in 1..=6 {
        let (q, p) = (format!("{id}/q{i}"), format!("p{i}"));
        assert_eq!(case("full", &q)["output"], case("full", &p)["output"], "{q}");
        assert_eq!(case("snapkv@4096", &q)["output"], case("full", &q)["output"], "{q}");
        assert_eq!(case("full", &q)["prompt_tokens"], case("full", &p)["prompt_tokens"], "{q}");
        assert!(case("full", &q)["prompt_tokens"].as_u64().unwrap() <= 320);
    }
    // A document without questions is refused before any work, naming its line.
    std::fs::write(&cases, format!("{}\n{{\"id\":\"d\",\"context\":\"text\",\"questions\":[]}}\n", lines[1])).unwrap();
    let out = kvslice(&["eval", "--model", &model, "--device", "cpu", "--cases", cases.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("line 2") && err.contains("at least one question"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The report's JSON format is stable: `{"runs": {key: {"passed", "total", "cases": {id:
/// {"pass", "output", "prompt_tokens"}}}}}`; a budget past the prompt gives the full cache's
/// outputs, and every run covers every case.
#[test]
fn eval_writes_the_stable_report() {
    let model = default_model();
    let dir = std::env::temp_dir().join(format!("kvslice-eval-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("report.json");
    let cases = smoke_cases();
    let out = kvslice(&[
        "eval",
        "--model",
        &model,
        "--device",
        "cpu",
        "--cases",
        &cases,
        "--policy",
        "snapkv,streaming-llm",
        "--budget",
        "4096,50%",
        "--max-new-tokens",
        "8",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let runs = report["runs"].as_object().unwrap();
    let keys: Vec<&str> = runs.keys().map(String::as_str).collect();
    assert_eq!(keys, ["full", "snapkv@4096", "snapkv@50%", "streaming-llm@4096", "streaming-llm@50%"]);
    let lines = std::fs::read_to_string(&cases).unwrap();
    let ids: Vec<String> = lines
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["id"].as_str().unwrap().to_string())
        .collect();
    for (key, run) in runs {
        let cases = run["cases"].as_object().unwrap();
        assert_eq!(run["total"], ids.len(), "{key}");
        let passed = cases.values().filter(|c| c["pass"].as_bool().unwrap()).count();
        assert_eq!(run["passed"], passed, "{key}");
        for id in &ids {
            let c = &cases[id];
            assert!(c["output"].is_string() && c["prompt_tokens"].as_u64().unwrap() > 250, "{key} {id}: {c}");
        }
    }
    for id in &ids {
        assert_eq!(runs["snapkv@4096"]["cases"][id]["output"], runs["full"]["cases"][id]["output"], "{id}");
        assert_eq!(runs["streaming-llm@4096"]["cases"][id]["output"], runs["full"]["cases"][id]["output"], "{id}");
    }
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.contains("snapkv") && table.contains("50%"), "{table}");

    // the same sweep as two shards (one from the job environment), merged: the same bytes
    let mut shards = Vec::new();
    for (k, spec) in [("0", "0/2"), ("1", "2")] {
        let path = dir.join(format!("shard-{k}.json"));
        let out = Command::new(env!("CARGO_BIN_EXE_kvslice"))
            .args(["eval", "--model", &model, "--device", "cpu", "--cases", &cases, "--policy", "snapkv,streaming-llm"])
            .args(["--budget", "4096,50%", "--max-new-tokens", "8", "--shard", spec, "--json", path.to_str().unwrap()])
            .env("JOB_COMPLETION_INDEX", k)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("shard {k}/2")));
        shards.push(path.to_str().unwrap().to_string());
    }
    let merged = dir.join("merged.json");
    let out = kvslice(&["report", "merge", &shards[0], &shards[1], "--out", merged.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(&merged).unwrap(), std::fs::read(&json).unwrap());
    // a shard merged twice is refused
    let e = one_line_error(&kvslice(&["report", "merge", &shards[0], &shards[0]]));
    assert!(e.contains("disjoint"), "{e}");
    let e =
        one_line_error(&kvslice(&["eval", "--model", &model, "--device", "cpu", "--cases", &cases, "--shard", "2/2"]));
    assert!(e.contains("2/2"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn eval_bad_input_is_a_one_line_error() {
    let model = default_model();
    let dir = std::env::temp_dir().join(format!("kvslice-eval-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"id\": \"a\", \"prompt\": \"x\", \"answer\": \"y\"}\n\n{\"id\": \"b\", \"prompt\": 3}\n")
        .unwrap();
    let e = one_line_error(&kvslice(&["eval", "--model", &model, "--device", "cpu", "--cases", bad.to_str().unwrap()]));
    assert!(e.contains("line 3"), "{e}");
    let cases = smoke_cases();
    let e = one_line_error(&kvslice(&[
        "eval", "--model", &model, "--device", "cpu", "--cases", &cases, "--policy", "nope", "--budget", "10%",
    ]));
    assert!(e.contains("nope") && e.contains("snapkv"), "{e}");
    let e = one_line_error(&kvslice(&[
        "generate", "--model", &model, "--device", "cpu", "--prompt", "hi", "--policy", "snapkv", "--budget", "0%",
    ]));
    assert!(e.contains("0%"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn conformance_checks_every_kernel_on_the_adapter_and_reports_json() {
    let out = kvslice(&["conformance", "--json"]);
    assert!(out.status.success(), "conformance: {}", String::from_utf8_lossy(&out.stderr));
    let cases: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("a JSON array");
    let kernels: std::collections::BTreeSet<&str> = cases.iter().map(|c| c["kernel"].as_str().unwrap()).collect();
    for k in ["window_stats", "decode_attention", "append_rows", "write_rows", "compact_in_place", "linear"] {
        assert!(kernels.contains(k), "no case for {k}: {kernels:?}");
    }
    for c in &cases {
        assert_eq!(c["passed"], true, "{c}");
        assert!(c["failure"].is_null(), "{c}");
        assert!(c["checked"].as_u64().unwrap() > 0, "a case that compares nothing: {c}");
        assert!(!c["case"].as_str().unwrap().is_empty());
    }
    // the CPU backend has no kernels to check
    let err = one_line_error(&kvslice(&["conformance", "--device", "cpu"]));
    assert!(err.contains("wgpu"), "{err}");
}

/// `kvslice doctor --json`: on this machine (Mesa) wgpu finds llvmpipe through Vulkan
/// (lavapipe) and through GL; each must pass the whole conformance suite, and each device,
/// the CPU backend included, the default model's logits against transformers'.
#[test]
fn doctor_checks_every_adapter_and_the_cpu_backend() {
    let model = default_model();
    let out = kvslice(&["doctor", "--json"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "doctor: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    assert_eq!(report["passed"], true, "{report:#}");
    assert_eq!(report["model"].as_str(), Some(model.as_str()));
    let devices = report["devices"].as_array().unwrap();
    let suite = kvslice(&["conformance", "--json"]);
    let suite_cases = serde_json::from_slice::<Vec<serde_json::Value>>(&suite.stdout).unwrap().len();
    let mut apis = Vec::new();
    for d in devices {
        let api = d["api"].as_str().unwrap();
        apis.push(api.to_string());
        assert_eq!(d["passed"], true, "{d:#}");
        assert!(d["error"].is_null(), "{d:#}");
        if api == "cpu" {
            assert!(d["conformance"].is_null(), "{d:#}");
            assert_eq!(d["device"], "cpu");
        } else {
            assert_eq!(d["conformance"]["cases"].as_u64().unwrap() as usize, suite_cases, "{d:#}");
            assert_eq!(d["conformance"]["failed"], 0, "{d:#}");
            // what `--device` takes back
            let device = d["device"].as_str().unwrap();
            assert!(device.starts_with(&format!("wgpu:{api}:")), "{device}");
        }
        // the five golden prompts of up to 128 tokens, five positions each
        let logits = &d["logits"];
        assert_eq!(logits["prompts"], 5, "{d:#}");
        assert_eq!(logits["positions"], 25, "{d:#}");
        let worst = logits["max_abs_delta"].as_f64().unwrap();
        assert!(worst > 0.0 && worst < 1e-2, "{d:#}");
        assert!(logits["failure"].is_null(), "{d:#}");
    }
    if cfg!(target_os = "linux") {
        for api in ["vulkan", "gl", "cpu"] {
            assert!(apis.iter().any(|a| a == api), "no {api} device in {apis:?}");
        }
    }
    // an adapter that is not there is a one-line error that says where the list is
    let err = one_line_error(&kvslice(&["conformance", "--device", "wgpu:vulkan:99"]));
    assert!(err.contains("wgpu:vulkan:99") && err.contains("kvslice doctor"), "{err}");
    let err = one_line_error(&kvslice(&["conformance", "--device", "wgpu:vulkan:first"]));
    assert!(err.contains("index"), "{err}");
}

#[test]
fn serve_refuses_bad_settings_before_listening() {
    let out = kvslice(&["serve", "--model", "/nonexistent/model.gguf", "--device", "cpu", "--port", "0"]);
    assert!(one_line_error(&out).contains("/nonexistent/model.gguf"));
    let model = default_model();
    let out = kvslice(&[
        "serve", "--model", &model, "--device", "cpu", "--port", "0", "--policy", "nosuch", "--budget", "10%",
    ]);
    assert!(one_line_error(&out).contains("nosuch"));
    // a port already taken
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let out = kvslice(&["serve", "--model", &model, "--device", "cpu", "--port", &port]);
    assert!(one_line_error(&out).contains(&port));
}

#[test]
fn ppl_reports_every_run_per_span_and_as_json() {
    let tiny = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/tiny-gguf/tiny-llama-F32.gguf");
    let tiny = tiny.to_str().unwrap();
    let dir = std::env::temp_dir().join(format!("kvslice-ppl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = dir.join("text.txt");
    std::fs::write(&text, "In the beginning God created the heaven and the earth. ".repeat(4)).unwrap();
    let json = dir.join("ppl.json");
    let args = ["ppl", "--model", tiny, "--device", "cpu", "--text", text.to_str().unwrap(), "--tokens", "96"];
    let out = kvslice(
        &[&args[..], &["--policy", "streaming-llm", "--budget", "16", "--prefill", "16", "--span", "40"]].concat(),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.contains("| 0–40 | 40–80 | 80–95 |"), "{table}");
    assert!(table.contains("| full |") && table.contains("| streaming-llm@16 | 96 |"), "{table}");
    let out = kvslice(&[&args[..], &["--json", json.to_str().unwrap()]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let full = &report["runs"]["full"];
    let nll: Vec<f64> = full["nll"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    assert_eq!(nll.len(), 95);
    let ppl = (nll.iter().sum::<f64>() / 95.0).exp();
    assert!((full["ppl"].as_f64().unwrap() - ppl).abs() < 1e-9 * ppl);
    let png = dir.join("ppl.png");
    let out = kvslice(&["report", "plot-ppl", json.to_str().unwrap(), "--out", png.to_str().unwrap(), "--span", "20"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG\r\n\x1a\n"));
    let e = one_line_error(&kvslice(&[&args[..7], &["--tokens", "600"]].concat()));
    assert!(e.contains("context of 512"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn calibrate_writes_low_rank_keys_that_ppl_and_logits_load() {
    let tiny = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/tiny-gguf/tiny-llama-F32.gguf");
    let tiny = tiny.to_str().unwrap();
    let dir = std::env::temp_dir().join(format!("kvslice-calibrate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let corpus = dir.join("corpus.txt");
    let lines: Vec<String> =
        (0..400).map(|i| format!("Verse {i}: and the {} went forth unto the {}.", i * 7 % 13, i % 5)).collect();
    std::fs::write(&corpus, lines.join("\n")).unwrap();
    let suite = dir.join("suite.jsonl");
    std::fs::write(&suite, "{\"id\": \"x\", \"prompt\": \"nothing of the corpus\", \"answer\": \"y\"}\n").unwrap();
    let (out_file, json) = (dir.join("lowrank.safetensors"), dir.join("lowrank.json"));
    let calibrate = |rank: &str| {
        let args = ["calibrate", "--model", tiny, "--device", "cpu", "--corpus", corpus.to_str().unwrap()];
        let more = ["--exclude", suite.to_str().unwrap(), "--skip-lines", "0", "--texts", "2", "--tokens", "40"];
        let last = ["--rank", rank, "--out", out_file.to_str().unwrap(), "--json", json.to_str().unwrap()];
        kvslice(&[&args[..], &more[..], &last[..]].concat())
    };
    let out = calibrate("1.0");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    // the tiny llama: 3 layers of 2 KV heads × 16, both heads in one group at full rank
    assert_eq!(report["key_width"], 32);
    assert_eq!(report["latent_width"], 96);
    assert_eq!(report["layers"][0]["groups"], serde_json::json!([[0, 1]]));
    // at full rank the perplexity is the plain model's
    let text = dir.join("text.txt");
    std::fs::write(&text, "In the beginning God created the heaven and the earth. ".repeat(4)).unwrap();
    let ppl = |extra: &[&str]| {
        let args = ["ppl", "--model", tiny, "--device", "cpu", "--text", text.to_str().unwrap(), "--tokens", "64"];
        let out = kvslice(&[&args[..], extra].concat());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let plain = ppl(&[]);
    assert_eq!(ppl(&["--low-rank-keys", out_file.to_str().unwrap()]), plain);
    // a quarter of the width changes it
    assert!(calibrate("0.25").status.success());
    assert_ne!(ppl(&["--low-rank-keys", out_file.to_str().unwrap()]), plain);
    // a file of another kind, and bad settings, are one-line errors
    let e = one_line_error(&kvslice(&[
        "logits",
        "--model",
        tiny,
        "--device",
        "cpu",
        "--low-rank-keys",
        tiny,
        "--text",
        "hi",
    ]));
    assert!(e.contains("low-rank keys") && e.contains("not safetensors"), "{e}");
    let e = one_line_error(&calibrate("1.5"));
    assert!(e.contains("(0, 1]"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bench_writes_its_figures_and_counts_dispatches() {
    let model = default_model();
    let dir = std::env::temp_dir().join(format!("kvslice-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // SmolLM2-135M's parameters on the device, from its config (tied head: the embedding's
    // transposed copy is a second tensor): per layer q, k, v, o, gate, up, down and two norms
    let (v, h, layers, inter, kv) = (49152u64, 576u64, 30u64, 1536u64, 192u64);
    let per_layer = 2 * h * h + 2 * h * kv + 3 * h * inter + 2 * h;
    let params = 2 * v * h + layers * per_layer + h;
    assert_eq!(params, 162_826_560);
    let file_size = std::fs::metadata(&model).unwrap().len();
    for device in ["cpu", "wgpu"] {
        let json = dir.join(format!("{device}.json"));
        let out = kvslice(&[
            "bench",
            "--model",
            &model,
            "--device",
            device,
            "--prefill",
            "8",
            "--decode-depth",
            "4",
            "--decode-steps",
            "2",
            "--json",
            json.to_str().unwrap(),
            "-v",
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{device}: {stderr}");
        let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert!(r["device"].as_str().unwrap().starts_with(device), "{r}");
        assert_eq!(r["layers"], 30);
        // the tensors' bytes: the file less its header (metadata and the tokenizer's vocabulary)
        let file_bytes = r["weights"]["file_bytes"].as_u64().unwrap();
        assert!(file_bytes < file_size && file_bytes > file_size * 9 / 10, "{file_bytes} of {file_size}");
        let device_bytes = r["weights"]["device_bytes"].as_u64().unwrap();
        if device == "cpu" {
            assert_eq!(device_bytes, 4 * params, "f32 weights");
        } else {
            // kept in their blocks: the file's embedding is Q8_0 (36 bytes per 32 values on the
            // device, the f16 scale widened to a word; the tied head shares it), every layer
            // matrix Q4_1 (20 bytes per 32 values), the norms f32
            let matrices = layers * (per_layer - 2 * h);
            let norms = layers * 2 * h + h;
            assert_eq!(device_bytes, v * h / 32 * 36 + matrices / 32 * 20 + 4 * norms, "quantized weights");
            assert!(device_bytes * 100 <= file_bytes * 115, "{device_bytes} on the device for {file_bytes}");
        }
        let rows = r["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 2, "{r}");
        for (row, kind, tokens) in [(&rows[0], "prefill", 8), (&rows[1], "decode", 4)] {
            assert_eq!((row["kind"].as_str(), row["tokens"].as_u64()), (Some(kind), Some(tokens)), "{row}");
            let (ms, rate) = (row["ms_per_token"].as_f64().unwrap(), row["tok_per_s"].as_f64().unwrap());
            assert!(ms > 0.0 && (ms * rate / 1000.0 - 1.0).abs() < 1e-9, "{row}");
            let dispatches = row["dispatches_per_token"].as_f64().unwrap();
            if device == "cpu" {
                assert_eq!(dispatches, 0.0, "the CPU backend launches nothing");
            } else {
                assert!(dispatches >= 30.0, "{row}");
            }
        }
        if device == "wgpu" {
            // every decode step issues the same launches, at most 10 per layer and 8 around
            // them: each layer runs four fused products over the quantized blocks, one RoPE split, appends its new key
            // and value rows once and runs the ragged decode attention as one pass (one
            // partition at this depth: no combine)
            let decode = rows[1]["dispatches_per_token"].as_f64().unwrap();
            assert_eq!(decode.fract(), 0.0, "{decode}");
            assert!(decode <= 10.0 * 30.0 + 8.0, "{decode}");
            let decode_lines: Vec<&str> = stderr.lines().skip_while(|l| !l.starts_with("decode at depth 4")).collect();
            for (kernel, per_layer) in [
                ("wgsl:qproject/project", "4.00"),
                ("wgsl:step/rope", "1.00"),
                ("wgsl:append/append", "1.00"),
                ("wgsl:decode/part", "1.00"),
            ] {
                let line = decode_lines
                    .iter()
                    .find(|l| l.trim_start().starts_with("layer") && l.ends_with(kernel))
                    .unwrap_or_else(|| panic!("no {kernel} in {stderr}"));
                assert!(line.contains(&format!("layer      {per_layer} per layer")), "{line}");
            }
            assert!(!decode_lines.iter().any(|l| l.ends_with("wgsl:decode/combine")), "{stderr}");
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}
