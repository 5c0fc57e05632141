//! `kvslice bench`: prefill and decode speed on the chosen device. One process measures every
//! figure, so ratios between them are meaningful on a noisy machine.

use std::time::Instant;

use anyhow::{Context, Result};
use kvslice_runtime::dispatch::{self, Dispatches};
use kvslice_runtime::{Compression, GenerateOptions, Generator, Llama, Sampler, Session, read_f32};

use crate::ModelArgs;

#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt lengths to prefill.
    #[arg(long, value_delimiter = ',', default_value = "512,2048")]
    prefill: Vec<usize>,
    /// Context depths at which decoding is timed.
    #[arg(long, value_delimiter = ',', default_value = "16,4096")]
    decode_depth: Vec<usize>,
    /// Decode steps timed at each depth.
    #[arg(long, default_value_t = 16)]
    decode_steps: usize,
    /// Repetitions of each measurement (the best is reported).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Also time decoding after compressing each depth's prompt with these policies (comma
    /// separated; one prefill serves them all)...
    #[arg(long, requires = "budget", value_delimiter = ',')]
    policy: Vec<String>,
    /// ...at this budget (e.g. `256` tokens per layer).
    #[arg(long)]
    budget: Option<String>,
    /// Also write the figures as JSON: the device, the weights' bytes in the file and on the
    /// device, and a row per measurement with its kernel dispatches per token.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

/// One measurement of the JSON report.
#[derive(serde::Serialize)]
struct Row {
    /// `prefill` or `decode`
    kind: &'static str,
    /// The prompt length (prefill) or the cache depth (decode).
    tokens: usize,
    ms_per_token: f64,
    tok_per_s: f64,
    /// Kernel launches submitted per token (0 on the CPU backend, which launches none).
    dispatches_per_token: f64,
    /// The eviction policy a decode row ran after (absent: the full cache).
    #[serde(skip_serializing_if = "Option::is_none")]
    policy: Option<String>,
}

#[derive(serde::Serialize)]
struct Weights {
    file_bytes: Option<u64>,
    device_bytes: u64,
}

#[derive(serde::Serialize)]
struct Report {
    device: String,
    layers: usize,
    weights: Weights,
    rows: Vec<Row>,
}

/// With `-v`: where one row's dispatches go, per token, by part of the model and kernel (the
/// layers' share per layer).
fn breakdown(what: &str, d: &Dispatches, tokens: usize, layers: usize) {
    let per = |n: u64, by: usize| n as f64 / (tokens * by.max(1)) as f64;
    eprintln!(
        "{what}: {:.1} dispatches per token = embed {:.1} + {layers} layers × {:.2} + head {:.1} + other {:.1}",
        per(d.total(), 1),
        per(d.in_scope("embed"), 1),
        per(d.in_scope("layer"), layers),
        per(d.in_scope("head"), 1),
        per(d.in_scope(dispatch::OTHER), 1)
    );
    for ((scope, kernel), &n) in &d.by_kernel {
        let by = if scope == "layer" { layers } else { 1 };
        let unit = if scope == "layer" { "per layer" } else { "" };
        eprintln!("    {scope:<6} {:>8.2} {unit:<9} {kernel}", per(n, by));
    }
}

/// Deterministic pseudo-random token ids in the ordinary-text range of the vocabulary.
fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let lo = 256.min(vocab / 2) as u64;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (lo + (s >> 33) % (vocab as u64 - lo)) as u32
        })
        .collect()
}

pub fn run(args: BenchArgs, verbose: bool) -> Result<()> {
    let loaded = crate::open(&args.model, verbose)?;
    let model = &loaded.model;
    let vocab = model.config.vocab_size;
    let layers = model.config.num_layers;
    let repeat = args.repeat.max(1);
    // Warm-up: compile the kernels once.
    {
        let mut s = Session::new(model, 64)?;
        pollster::block_on(s.next_logits(&tokens(32, vocab, 1)))?;
        pollster::block_on(s.step(&[5], &mut Sampler::greedy()))?;
    }
    let mut rows = Vec::new();
    println!("| measurement | tokens | seconds | tok/s | dispatches/token |");
    println!("|---|---|---|---|---|");
    for &n in &args.prefill {
        let mut best = f64::INFINITY;
        let mut launches = Dispatches::default();
        for r in 0..repeat {
            let ids = tokens(n, vocab, 10 + r as u64);
            let mut s = Session::new(model, n)?;
            let t = Instant::now();
            let (out, counted) = dispatch::count(|| pollster::block_on(s.next_logits(&ids)));
            out?;
            best = best.min(t.elapsed().as_secs_f64());
            launches = counted;
        }
        let per_token = launches.total() as f64 / n as f64;
        println!("| prefill | {n} | {best:.3} | {:.1} | {per_token:.2} |", n as f64 / best);
        if verbose {
            breakdown(&format!("prefill {n}"), &launches, n, layers);
        }
        rows.push(Row {
            kind: "prefill",
            tokens: n,
            ms_per_token: best * 1e3 / n as f64,
            tok_per_s: n as f64 / best,
            dispatches_per_token: per_token,
            policy: None,
        });
    }
    for &depth in &args.decode_depth {
        let mut best = f64::INFINITY;
        let mut launches = Dispatches::default();
        for r in 0..repeat {
            let ids = tokens(depth, vocab, 20 + r as u64);
            let mut s = Session::new(model, depth + args.decode_steps + 1)?;
            let hidden = s.feed(&ids)?;
            pollster::block_on(read_f32(hidden.narrow(0, depth - 1, 1)))?;
            let steps = tokens(args.decode_steps, vocab, 30);
            let t = Instant::now();
            let mut greedy = Sampler::greedy();
            let (out, counted) = dispatch::count(|| -> Result<()> {
                for &tok in &steps {
                    pollster::block_on(s.step(&[tok], &mut greedy))?;
                }
                Ok(())
            });
            out?;
            best = best.min(t.elapsed().as_secs_f64());
            launches = counted;
        }
        let per = best / args.decode_steps as f64;
        let per_token = launches.total() as f64 / args.decode_steps as f64;
        println!(
            "| decode at depth {depth} | {} | {best:.3} | {:.1} ({:.1} ms/token) | {per_token:.2} |",
            args.decode_steps,
            1.0 / per,
            per * 1e3
        );
        if verbose {
            breakdown(&format!("decode at depth {depth}"), &launches, args.decode_steps, layers);
        }
        rows.push(Row {
            kind: "decode",
            tokens: depth,
            ms_per_token: per * 1e3,
            tok_per_s: 1.0 / per,
            dispatches_per_token: per_token,
            policy: None,
        });
        if let Some(budget) = &args.budget {
            compressed(model, &args.policy, budget, depth, per, &args, &mut rows)?;
        }
    }
    if let Some(path) = &args.json {
        let device = kvslice_runtime::device_info(model.device())
            .map(|i| i.to_string())
            .unwrap_or_else(|| "cpu (burn flex)".to_string());
        let report = Report {
            device,
            layers,
            weights: Weights { file_bytes: loaded.file_bytes, device_bytes: model.device_bytes() },
            rows,
        };
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Decoding after compression at one depth, beside the full cache's `full_per_token`; and the
/// eviction's share of the prefill (statistics, planning, compaction against a plain prefill).
/// With several policies, one prefill records the union of their statistics (the statistics
/// time in each share is then that union's).
fn compressed(
    model: &Llama,
    policies: &[String],
    budget: &str,
    depth: usize,
    full_per_token: f64,
    args: &BenchArgs,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let vocab = model.config.vocab_size;
    let info = Compression::model_info(model);
    let all: Vec<Compression> = crate::policy_list(policies)
        .iter()
        .map(|p| Compression::new(p, budget, &info))
        .collect::<std::result::Result<_, _>>()?;
    let mut request = kvslice_runtime::StatsRequest::default();
    for c in &all {
        c.add_to(&mut request, model.config.num_layers);
    }
    let ids = tokens(depth, vocab, 20);
    // plain prefill of the same prompt
    let mut s = Session::new(model, depth)?;
    let t = Instant::now();
    let hidden = s.feed(&ids)?;
    pollster::block_on(read_f32(hidden.narrow(0, depth - 1, 1)))?;
    let plain = t.elapsed().as_secs_f64();
    drop(s);
    let prefilled = pollster::block_on(Session::prefill_for(model, &ids, &request))?;
    for c in &all {
        rows.push(decode_after(model, c, &prefilled, plain, depth, full_per_token, args)?);
    }
    Ok(())
}

fn decode_after(
    model: &Llama,
    c: &Compression,
    prefilled: &kvslice_runtime::Prefilled,
    plain: f64,
    depth: usize,
    full_per_token: f64,
    args: &BenchArgs,
) -> Result<Row> {
    let options = GenerateOptions::greedy(args.decode_steps + 1, Vec::new());
    let mut generator = pollster::block_on(Generator::resume(model, prefilled, Some(c), options))?;
    let report = generator.report().cloned().unwrap_or_default();
    // statistics as computed inside the forward pass (exact on the CPU backend) + read-back,
    // planning and compaction; the plain prefill is the reference
    let (stats_compute, stats_read) = (prefilled.stats_compute_seconds, prefilled.stats_seconds);
    let overhead = stats_compute + stats_read + report.plan_time.as_secs_f64() + report.compact_time.as_secs_f64();
    let t = Instant::now();
    let (out, launches) = dispatch::count(|| pollster::block_on(generator.run()));
    out?;
    let per = t.elapsed().as_secs_f64() / args.decode_steps as f64;
    let evictions = match generator.session().eviction() {
        Some(e) if e.recompressions() > 0 => {
            format!(", {} evictions in {} recompressions", e.evicted, e.recompressions())
        }
        Some(e) => format!(", {} evictions, {} score refreshes", e.evicted, e.refreshes()),
        None => String::new(),
    };
    let per_token = launches.total() as f64 / args.decode_steps as f64;
    println!(
        "| decode at depth {depth}, {} | {} | {:.3} | {:.1} ({:.1} ms/token, {:.1}x the full cache{evictions}) | {per_token:.2} |",
        c.label(),
        args.decode_steps,
        per * args.decode_steps as f64,
        1.0 / per,
        per * 1e3,
        full_per_token / per
    );
    println!(
        "| eviction share of prefill at {depth} ({}) | {} kept of {} | {:.3} of {:.3} | {:.1}% (statistics {:.3} s, read-back {:.3} s, plan {:.3} s, compaction {:.3} s; KV {:.1} → {:.1} MiB) | |",
        c.label(),
        report.kept_entries,
        depth * model.config.num_layers * model.config.num_kv_heads,
        overhead,
        plain,
        100.0 * overhead / plain,
        stats_compute,
        stats_read,
        report.plan_time.as_secs_f64(),
        report.compact_time.as_secs_f64(),
        report.full_bytes as f64 / (1 << 20) as f64,
        report.compressed_bytes as f64 / (1 << 20) as f64
    );
    Ok(Row {
        kind: "decode",
        tokens: depth,
        ms_per_token: per * 1e3,
        tok_per_s: 1.0 / per,
        dispatches_per_token: per_token,
        policy: Some(c.label()),
    })
}
