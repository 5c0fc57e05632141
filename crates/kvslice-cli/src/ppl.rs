//! `kvslice ppl`: perplexity of a long text decoded token by token under each policy × budget
//! (StreamingLLM's PG19 setting), beside the full cache.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use kvslice_runtime::{Compression, perplexity};
use serde_json::json;

use crate::ModelArgs;

#[derive(clap::Args, Clone)]
pub struct PplArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text to score: `kjv` (the default) or `shakespeare` (fetched on first use), or a
    /// UTF-8 file.
    #[arg(long, default_value = "kjv")]
    pub text: crate::fetch::CorpusChoice,
    /// Tokens of the text to score (at most the model's context).
    #[arg(long, default_value_t = 8192)]
    pub tokens: usize,
    /// Policies, comma-separated; the full cache always runs first.
    #[arg(long, value_delimiter = ',')]
    pub policy: Vec<String>,
    /// Budgets, comma-separated (`512` tokens per layer is StreamingLLM's setting).
    #[arg(long, value_delimiter = ',', default_value = "512")]
    pub budget: Vec<String>,
    /// Tokens fed in one pass before decoding starts (at most the smallest budget keeps the
    /// first predictions the same for every policy). The full cache, which evicts nothing, runs
    /// the whole text as one pass: the same predictions as token by token.
    #[arg(long, default_value_t = 256)]
    pub prefill: usize,
    /// Perplexity per span of this many positions in the table and the JSON.
    #[arg(long, default_value_t = 1024)]
    pub span: usize,
    /// Write `{"tokens", "runs": {run: {"ppl", "kept_entries", "spans": [...], "nll": [...]}}}`.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Draw perplexity per span against position, one line per run, into this PNG.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

pub fn run(args: PplArgs, verbose: bool) -> Result<()> {
    let path = args.text.path(true)?;
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let loaded = crate::open(&args.model, verbose)?;
    let model = &loaded.model;
    let context = model.config.max_position_embeddings;
    if args.tokens > context || args.tokens < 2 {
        bail!("--tokens {}: between 2 and the model's context of {context}", args.tokens);
    }
    let mut ids = loaded.tokenizer.encode(&text, true)?;
    if ids.len() < args.tokens {
        bail!("{} holds {} tokens, fewer than --tokens {}", path.display(), ids.len(), args.tokens);
    }
    ids.truncate(args.tokens);
    if args.span == 0 {
        bail!("--span must be at least 1");
    }
    let info = Compression::model_info(model);
    let mut runs: Vec<(String, Option<Compression>)> = vec![("full".into(), None)];
    for name in crate::policy_list(&args.policy) {
        for budget in &args.budget {
            let c = Compression::new(&name, budget, &info)?;
            runs.push((c.label(), Some(c)));
        }
    }
    let spans: Vec<(usize, usize)> =
        (0..ids.len() - 1).step_by(args.span).map(|s| (s, (s + args.span).min(ids.len() - 1))).collect();
    println!(
        "| run | kept KV entries | ppl | {} |",
        spans.iter().map(|(a, b)| format!("{a}–{b}")).collect::<Vec<_>>().join(" | ")
    );
    println!("|---|---:|---:|{}", "---:|".repeat(spans.len()));
    let mut report = serde_json::Map::new();
    let mut curves: Vec<(String, Vec<f64>)> = Vec::new();
    for (label, c) in &runs {
        let t0 = std::time::Instant::now();
        // The full cache evicts nothing: one forward pass over the whole text computes the same
        // predictions as token by token (causal attention), in a fraction of the time.
        let prefill = if c.is_none() { ids.len() - 1 } else { args.prefill };
        let result = pollster::block_on(perplexity(model, &ids, c.as_ref(), prefill, |done, total| {
            if verbose && done % 512 == 0 {
                eprintln!("  {label}: {done}/{total}");
            }
        }))?;
        let per_span: Vec<f64> = spans.iter().map(|&(a, b)| result.ppl(a..b)).collect();
        println!(
            "| {label} | {} | {:.3} | {} |",
            result.kept_entries,
            result.ppl(..),
            per_span.iter().map(|p| format!("{p:.3}")).collect::<Vec<_>>().join(" | ")
        );
        eprintln!("{label}: {} tokens in {:.1}s", ids.len(), t0.elapsed().as_secs_f64());
        curves.push((label.clone(), result.nll.clone()));
        report.insert(
            label.clone(),
            json!({"ppl": result.ppl(..), "kept_entries": result.kept_entries, "spans": per_span, "nll": result.nll}),
        );
    }
    if let Some(out) = &args.plot {
        plot(&curves, args.span, ids.len(), out)?;
    }
    if let Some(out) = &args.json {
        let body = json!({"tokens": ids.len(), "prefill": args.prefill, "span": args.span, "runs": report});
        std::fs::write(out, serde_json::to_string(&body)? + "\n")
            .with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
}

/// Draws `runs` (each prediction's negative log-likelihood) as perplexity per `span` against
/// position.
pub fn plot(runs: &[(String, Vec<f64>)], span: usize, tokens: usize, out: &std::path::Path) -> Result<()> {
    let series = kvslice_eval::plot::ppl_series(runs, span)?;
    let title = format!("Perplexity per {span} positions, {tokens} tokens");
    kvslice_eval::plot::ppl_vs_position(&series, &title, out)?;
    eprintln!("plot written to {}", out.display());
    Ok(())
}

/// A run's name and each prediction's negative log-likelihood.
pub type Nll = (String, Vec<f64>);

/// Reads the runs of a `kvslice ppl --json` file: (run, each prediction's NLL), the full cache
/// first, and the file's span and token count.
pub fn read_runs(path: &std::path::Path) -> Result<(Vec<Nll>, usize, usize)> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let body: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{}: not a `kvslice ppl --json` file", path.display()))?;
    let bad = |what: &str| anyhow::anyhow!("{}: {what}", path.display());
    let runs = body["runs"].as_object().ok_or_else(|| bad("no \"runs\" object"))?;
    let mut out = Vec::with_capacity(runs.len());
    for (name, run) in runs {
        let nll = run["nll"]
            .as_array()
            .ok_or_else(|| bad(&format!("run {name} has no \"nll\" list")))?
            .iter()
            .map(|v| v.as_f64().ok_or_else(|| bad(&format!("run {name}: a non-number in \"nll\""))))
            .collect::<Result<Vec<f64>>>()?;
        out.push((name.clone(), nll));
    }
    out.sort_by_key(|(name, _)| name != "full");
    let span = body["span"].as_u64().unwrap_or(1024) as usize;
    let tokens = body["tokens"].as_u64().unwrap_or(0) as usize;
    Ok((out, span, tokens))
}
