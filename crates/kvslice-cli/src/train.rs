//! `kvslice train-policy`: DistillCache's per-head networks trained on traces the runtime records
//! from public-domain text ([`kvslice_runtime::traces`], [`kvslice_policy::learn`]).
//!
//! The passages come from [`crate::passages`] (none shares a line with the evaluation suites).
//! The last `--held-out` traces are not trained on; the report compares the trained networks
//! with their untrained start and with fixed scores on them. The first
//! [`SINK_FLAG`] entries of every list, which DistillCache always keeps, are left out of the
//! training and of the figures.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use kvslice_runtime::policies::distill::{DistillWeights, SCALARS, SINK_FLAG, feature_count};
use kvslice_runtime::policies::learn::{self, TraceList, TrainConfig, kept_utility};
use serde_json::json;

use crate::ModelArgs;
use crate::passages::PassageArgs;

#[derive(clap::Args, Clone)]
pub struct TrainArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub passages: PassageArgs,
    /// Traces recorded (the last `--held-out` of them are not trained on).
    #[arg(long, default_value_t = 32)]
    pub traces: usize,
    #[arg(long, default_value_t = 8)]
    pub held_out: usize,
    /// Tokens of a passage the cache holds when it is judged.
    #[arg(long, default_value_t = 512)]
    pub context: usize,
    /// Tokens after the context whose attention is the entries' utility.
    #[arg(long, default_value_t = 256)]
    pub future: usize,
    #[arg(long, default_value_t = 8)]
    pub hidden: usize,
    #[arg(long, default_value_t = 300)]
    pub steps: usize,
    #[arg(long, default_value_t = 0.01)]
    pub learning_rate: f32,
    #[arg(long, default_value_t = 1e-4)]
    pub weight_decay: f32,
    /// Threads for the training (the result does not depend on it; default: every core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Where the weights go (safetensors).
    #[arg(long)]
    pub out: PathBuf,
    /// Write the held-back figures as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Scores of a fixed rule on a list's features (for the report).
fn baseline(name: &str, list: &TraceList, f: usize, head_dim: usize) -> Vec<f32> {
    let s = head_dim / 2 + head_dim; // the scalars' offset
    list.features
        .chunks_exact(f)
        .map(|x| match name {
            // StreamingLLM (its sinks are left out of the lists): the most recent
            "recent" => x[s],
            // KeyDiff: least like the mean key
            "keydiff" => -x[s + 3],
            "key-norm" => x[s + 4],
            "value-norm" => x[s + 5],
            _ => 0.0,
        })
        .collect()
}

pub fn run(args: TrainArgs, verbose: bool) -> Result<()> {
    if args.traces <= args.held_out || args.held_out == 0 {
        bail!("--traces {} must exceed --held-out {} (at least 1)", args.traces, args.held_out);
    }
    if args.context == 0 || args.future == 0 {
        bail!("--context and --future must be positive");
    }
    let loaded = crate::open(&args.model, verbose)?;
    let model = &loaded.model;
    let cfg = &model.config;
    let total = args.context + args.future;
    if total > cfg.max_position_embeddings {
        bail!("--context + --future = {total} exceeds the model's context of {}", cfg.max_position_embeddings);
    }
    let passages = args.passages.draw(&loaded.tokenizer, args.traces, total, verbose)?;
    // traces
    let t0 = std::time::Instant::now();
    let (layers, kv_heads, d) = (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim);
    let mut train: Vec<Vec<Vec<TraceList>>> = vec![vec![Vec::new(); kv_heads]; layers];
    let mut held: Vec<Vec<Vec<TraceList>>> = vec![vec![Vec::new(); kv_heads]; layers];
    let mut sources = Vec::new();
    for (i, p) in passages.iter().enumerate() {
        let lists = pollster::block_on(kvslice_runtime::traces::record(model, &p.ids, args.context))?;
        let into = if i < args.traces - args.held_out { &mut train } else { &mut held };
        for (l, layer) in lists.into_iter().enumerate() {
            for (h, list) in layer.into_iter().enumerate() {
                into[l][h].push(list.without_sinks(SINK_FLAG));
            }
        }
        let name = &p.corpus;
        sources.push(json!({"corpus": name, "first_line": p.first_line, "held_out": i >= args.traces - args.held_out}));
        eprintln!(
            "trace {}/{}: {name} from line {} ({:.0} s)",
            i + 1,
            args.traces,
            p.first_line,
            t0.elapsed().as_secs_f64()
        );
    }
    let trace_seconds = t0.elapsed().as_secs_f64();
    // training
    let config = TrainConfig {
        hidden: args.hidden,
        steps: args.steps,
        learning_rate: args.learning_rate,
        weight_decay: args.weight_decay,
        seed: args.passages.seed,
    };
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let t1 = std::time::Instant::now();
    let weights = learn::train(&train, d, &config, threads)?;
    let train_seconds = t1.elapsed().as_secs_f64();
    let bytes = weights.to_safetensors()?;
    std::fs::write(&args.out, &bytes).with_context(|| format!("writing {}", args.out.display()))?;
    // held-back figures
    let f = feature_count(d);
    let fractions = [0.05, 0.1, 0.25, 0.5];
    let untrained = |l: usize, h: usize| {
        learn::init(&train[l][h], f, args.hidden, args.passages.seed.wrapping_add((l * kv_heads + h) as u64))
    };
    let (mut before, mut after, mut train_loss) = (0f64, 0f64, 0f64);
    let mut rows: Vec<(String, Vec<f64>)> =
        ["distillcache", "untrained", "recent", "keydiff", "key-norm", "value-norm"]
            .iter()
            .map(|n| (n.to_string(), vec![0.0; fractions.len()]))
            .collect();
    let mut count = 0f64;
    for l in 0..layers {
        for h in 0..kv_heads {
            let net = weights.head(l, h);
            let start = untrained(l, h);
            before += learn::loss(&start, &held[l][h]);
            after += learn::loss(net, &held[l][h]);
            train_loss += learn::loss(net, &train[l][h]);
            for list in &held[l][h] {
                count += 1.0;
                for (name, sums) in rows.iter_mut() {
                    let scores = match name.as_str() {
                        "distillcache" => net.score(&list.features),
                        "untrained" => start.score(&list.features),
                        other => baseline(other, list, f, d),
                    };
                    for (s, &fr) in sums.iter_mut().zip(&fractions) {
                        *s += kept_utility(&scores, &list.utility, fr);
                    }
                }
            }
        }
    }
    let heads = (layers * kv_heads) as f64;
    let (before, after, train_loss) = (before / heads, after / heads, train_loss / heads);
    println!(
        "{} traces ({} held out) of {total} tokens, context {}: recorded in {trace_seconds:.1} s, {} heads trained in {train_seconds:.1} s ({} steps, {} threads)",
        args.traces,
        args.held_out,
        args.context,
        layers * kv_heads,
        args.steps,
        threads
    );
    println!(
        "held-back loss KL(utility ‖ softmax(scores)), mean per head: {before:.4} untrained → {after:.4} trained (training traces: {train_loss:.4})"
    );
    println!(
        "\nkept utility on the held-back traces (the utility of the best-scored entries over the most useful ones'):\n"
    );
    println!("| scores | {} |", fractions.iter().map(|f| format!("{:.0}%", f * 100.0)).collect::<Vec<_>>().join(" | "));
    println!("|---|{}", "---:|".repeat(fractions.len()));
    for (name, sums) in &mut rows {
        sums.iter_mut().for_each(|s| *s /= count);
        println!("| {name} | {} |", sums.iter().map(|s| format!("{s:.3}")).collect::<Vec<_>>().join(" | "));
    }
    println!(
        "\nweights: {} ({} bytes, {} features per entry of which {SCALARS} scalars, {} hidden units)",
        args.out.display(),
        bytes.len(),
        f,
        args.hidden
    );
    if let Some(path) = &args.json {
        let report = json!({
            "traces": sources,
            "context": args.context,
            "future": args.future,
            "config": {"hidden": args.hidden, "steps": args.steps, "learning_rate": args.learning_rate, "weight_decay": args.weight_decay, "seed": args.passages.seed},
            "held_out_loss": {"untrained": before, "trained": after},
            "train_loss": train_loss,
            "kept_utility": rows.iter().map(|(n, s)| (n.clone(), json!(fractions.iter().zip(s).map(|(f, v)| json!({"fraction": f, "kept": v})).collect::<Vec<_>>()))).collect::<serde_json::Map<_, _>>(),
            "seconds": {"traces": trace_seconds, "training": train_seconds},
        });
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let _ = DistillWeights::from_safetensors(&bytes)?;
    Ok(())
}
