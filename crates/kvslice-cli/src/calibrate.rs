//! `kvslice calibrate`: low-rank keys for a model ([`kvslice_runtime::lowrank`]) from passages of
//! public-domain text ([`crate::passages`], none of it in the evaluation suites): every layer's
//! pre-RoPE keys gathered as moments, the KV heads grouped by CKA, each group's basis and the
//! layer's ranks; written as safetensors for `--low-rank-keys FILE`.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use kvslice_runtime::lowrank::{Allocation, Grouping, KeyMoments, RankSpec, Settings, Weighting};
use serde_json::json;

use crate::ModelArgs;
use crate::passages::PassageArgs;

#[derive(clap::Args, Clone)]
pub struct CalibrateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub passages: PassageArgs,
    /// Latent dimensions per layer: a share of the key width (`0.5`, `50%`) or a number.
    #[arg(long, default_value = "0.5")]
    pub rank: String,
    /// The most KV heads a group holds.
    #[arg(long, default_value_t = 4)]
    pub group: usize,
    /// `cka` (heads grouped by the similarity of their keys) or `adjacent` (neighbours in the
    /// heads' order, to compare with).
    #[arg(long, default_value = "cka")]
    pub grouping: String,
    /// The error the bases minimise: `queries` (the attention logits', each RoPE pair of key
    /// columns weighted by the energy the queries put in it) or `keys` (the keys' own).
    #[arg(long, default_value = "queries")]
    pub weighting: String,
    /// `model` (the model's latent dimensions go to the largest eigenvalues of any layer) or
    /// `layer` (every layer the same number).
    #[arg(long, default_value = "model")]
    pub allocation: String,
    /// Passages calibrated on.
    #[arg(long, default_value_t = 8)]
    pub texts: usize,
    /// Tokens of each passage.
    #[arg(long, default_value_t = 1024)]
    pub tokens: usize,
    /// Where the low-rank keys go (safetensors).
    #[arg(long)]
    pub out: PathBuf,
    /// Write the per-layer figures as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

pub fn run(args: CalibrateArgs, verbose: bool) -> Result<()> {
    let rank: RankSpec = args.rank.parse()?;
    let grouping = match args.grouping.as_str() {
        _ if args.group == 0 => bail!("--group must be at least 1"),
        "cka" => Grouping::Cka(args.group),
        "adjacent" => Grouping::Adjacent(args.group),
        other => bail!("--grouping {other}: `cka` or `adjacent`"),
    };
    let weighting = match args.weighting.as_str() {
        "queries" => Weighting::Queries,
        "keys" => Weighting::Keys,
        other => bail!("--weighting {other}: `queries` or `keys`"),
    };
    let allocation = match args.allocation.as_str() {
        "model" => Allocation::Model,
        "layer" => Allocation::PerLayer,
        other => bail!("--allocation {other}: `model` or `layer`"),
    };
    if args.texts == 0 || args.tokens < 2 {
        bail!("--texts must be positive and --tokens at least 2");
    }
    let loaded = crate::open(&args.model, verbose)?;
    let model = &loaded.model;
    if model.low_rank_keys().is_some() {
        bail!("the model's keys are low-rank already: calibrate the model without --low-rank-keys");
    }
    let c = &model.config;
    if args.tokens > c.max_position_embeddings {
        bail!("--tokens {} exceeds the model's context of {}", args.tokens, c.max_position_embeddings);
    }
    let passages = args.passages.draw(&loaded.tokenizer, args.texts, args.tokens, verbose)?;
    let t0 = std::time::Instant::now();
    let mut moments = vec![KeyMoments::new(c.num_kv_heads, c.head_dim); c.num_layers];
    for (i, p) in passages.iter().enumerate() {
        pollster::block_on(kvslice_runtime::calibrate::add_key_moments(model, &p.ids, &mut moments))?;
        eprintln!(
            "text {}/{}: {} from line {} ({:.0} s)",
            i + 1,
            passages.len(),
            p.corpus,
            p.first_line,
            t0.elapsed().as_secs_f64()
        );
    }
    let (keys, reports) =
        kvslice_runtime::lowrank::calibrate(&moments, &Settings { rank, grouping, weighting, allocation })?;
    let bytes = keys.to_safetensors()?;
    std::fs::write(&args.out, &bytes).with_context(|| format!("writing {}", args.out.display()))?;
    let width = c.num_kv_heads * c.head_dim;
    let latent: usize = (0..c.num_layers).map(|l| keys.latent_width(l)).sum();
    println!(
        "{} texts of {} tokens, {} layers of {} KV heads × {}: calibrated in {:.1} s",
        passages.len(),
        args.tokens,
        c.num_layers,
        c.num_kv_heads,
        c.head_dim,
        t0.elapsed().as_secs_f64()
    );
    println!("\n| layer | groups (KV heads) | ranks | CKA within the groups | error share |");
    println!("|---:|---|---|---|---:|");
    for (l, r) in reports.iter().enumerate() {
        let h = c.num_kv_heads;
        let within: Vec<String> = r
            .groups
            .iter()
            .filter(|g| g.len() > 1)
            .map(|g| {
                let pairs: Vec<f64> = g
                    .iter()
                    .enumerate()
                    .flat_map(|(a, &i)| g[a + 1..].iter().map(move |&j| r.cka[i * h + j]))
                    .collect();
                format!("{:.3}", pairs.iter().sum::<f64>() / pairs.len() as f64)
            })
            .collect();
        println!(
            "| {l} | {} | {} | {} | {:.4} |",
            r.groups.iter().map(|g| format!("{g:?}")).collect::<Vec<_>>().join(" "),
            r.ranks.iter().map(usize::to_string).collect::<Vec<_>>().join("+"),
            if within.is_empty() { "—".to_string() } else { within.join(" ") },
            r.relative_error
        );
    }
    println!(
        "\nlatent key width: {latent} of {} ({:.1}%); {} ({} bytes)",
        width * c.num_layers,
        100.0 * latent as f64 / (width * c.num_layers) as f64,
        args.out.display(),
        bytes.len()
    );
    if let Some(path) = &args.json {
        let report = json!({
            "texts": passages.iter().map(|p| json!({"corpus": p.corpus, "first_line": p.first_line})).collect::<Vec<_>>(),
            "tokens": args.tokens,
            "rank": args.rank,
            "group": args.group,
            "grouping": args.grouping,
            "weighting": args.weighting,
            "allocation": args.allocation,
            "key_width": width,
            "layers": reports.iter().map(|r| json!({
                "cka": r.cka, "groups": r.groups, "ranks": r.ranks, "relative_error": r.relative_error, "energy": r.energy,
            })).collect::<Vec<_>>(),
            "latent_width": latent,
            "seconds": t0.elapsed().as_secs_f64(),
        });
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
