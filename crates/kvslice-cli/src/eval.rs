//! `kvslice eval`: retrieval cases under every policy × budget, prefilling each case once.
//!
//! Prefill-time policies only change what is kept after the prompt's forward pass, so each case
//! is prefilled once with the statistics every requested policy needs; then the full cache and
//! every policy × budget pair are each one compression of that prefill and a short greedy
//! decode. The report's format is stable (see `kvslice_eval::report`).
//!
//! A document (query-agnostic) is prefilled and compressed without its questions: the prefix is
//! the longest run of tokens its context shares with every question's full prompt (the context,
//! a newline, the question — tokenized together, as the model reads them); the budget is a share
//! of that prefix. For each run, each question is fed into its own copy of the compressed cache
//! and answered greedily; the report counts questions (`{id}/q{n}`), each with the tokens of its
//! whole prompt.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use kvslice_eval::Entry;
use kvslice_eval::report::{CaseReport, FULL, Report, passes};
use kvslice_runtime::{Compression, GenerateOptions, Generator, Session, StatsRequest, policies};

use crate::ModelArgs;

/// Kept source positions, `[layer][kv_head]`.
type KeptPositions = Vec<Vec<Vec<u32>>>;

#[derive(clap::Args, Clone)]
pub struct EvalArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// JSON Lines cases file: prompts `{"id", "prompt", "answer"}` (compressed with the question)
    /// and documents `{"id", "context", "questions": [{"question", "answer"}, …]}` (compressed
    /// before any question), one per line.
    #[arg(long)]
    pub cases: PathBuf,
    /// Policies, comma-separated (`kvslice policies` lists them), or `all`; none runs the full
    /// cache only.
    #[arg(long, value_delimiter = ',')]
    pub policy: Vec<String>,
    /// Budgets, comma-separated: `10%` of the prompt, `128L` per layer on average, `2048` flat.
    #[arg(long, value_delimiter = ',', default_value = "50%,25%,10%,5%")]
    pub budget: Vec<String>,
    /// KV dtypes of the compressed caches, comma-separated (`f32`, `f16`, `q8`, `q4`): every
    /// policy × budget runs with each (reports key them `policy+q4@budget`); the full cache
    /// stays f32.
    #[arg(long, value_delimiter = ',', default_value = "f32")]
    pub kv_dtype: Vec<kvslice_runtime::KvDtype>,
    #[arg(long, default_value_t = 16)]
    pub max_new_tokens: usize,
    /// Wrap each prompt in the model's chat template (default: plain text).
    #[arg(long)]
    pub chat: bool,
    /// Write the report as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write `scores.png` (pass rate against budget) and `kept-<run>.png` (kept positions per
    /// layer and head for the first case) into this folder.
    #[arg(long)]
    pub plots: Option<PathBuf>,
    /// Runs (`policy@budget`) whose kept positions are drawn with --plots; default: every
    /// policy at the last budget.
    #[arg(long, value_delimiter = ',')]
    pub heatmap: Vec<String>,
    /// Only the first N cases.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Run the K-th (from 0) of N disjoint slices of the cases: `K/N`, or `N` with K from
    /// `JOB_COMPLETION_INDEX` (a Kubernetes Indexed Job) or `SLURM_ARRAY_TASK_ID` (a Slurm
    /// array). `kvslice report merge` joins the shards' `--json` reports into one.
    #[arg(long)]
    pub shard: Option<String>,
}

/// What one case prefills once and then asks.
struct Unit {
    id: String,
    /// Prefilled once and compressed.
    prefix: Vec<u32>,
    /// (report id, tokens fed after the prefix, the whole prompt's token count, answer); a
    /// prompt case has one question with nothing after the prefix.
    questions: Vec<(String, Vec<u32>, usize, String)>,
}

/// The longest common prefix of `a` and `b`.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Timings of a sweep, to compare with re-prefilling for every run.
#[derive(Debug, Default)]
struct Timing {
    prefill: f64,
    stats: f64,
    runs: f64,
    run_count: usize,
}

pub fn run(args: EvalArgs, verbose: bool) -> Result<()> {
    let mut cases =
        kvslice_eval::read_entries(&args.cases).with_context(|| format!("reading {}", args.cases.display()))?;
    if let Some(n) = args.limit {
        cases.truncate(n);
    }
    if let Some(spec) = &args.shard {
        let shard = kvslice_eval::shard::Shard::parse(spec, |v| std::env::var(v).ok())?;
        let total = cases.len();
        cases = shard.select(cases);
        eprintln!("shard {shard}: {} of {total} cases", cases.len());
    }
    let loaded = crate::open(&args.model, verbose)?;
    let model = &loaded.model;
    let info = Compression::model_info(model);
    let names: Vec<String> = if args.policy.iter().any(|p| p == "all") {
        policies::registry().iter().map(|e| e.name.to_string()).collect()
    } else {
        crate::policy_list(&args.policy)
    };
    let mut compressions = Vec::new();
    for name in &names {
        for budget in &args.budget {
            for &dtype in &args.kv_dtype {
                compressions.push(Compression::new(name, budget, &info)?.with_kv_dtype(dtype));
            }
        }
    }
    let layers = model.config.num_layers;
    let mut request = StatsRequest::default();
    for c in &compressions {
        c.add_to(&mut request, layers);
    }

    // Every prompt is checked before any prefill.
    let context = model.config.max_position_embeddings;
    let check = |id: &str, ids: &[u32]| -> Result<()> {
        if ids.is_empty() {
            bail!("case {id}: empty prompt");
        }
        if ids.len() + args.max_new_tokens.saturating_sub(1) > context {
            bail!(
                "case {id}: {} prompt tokens plus {} new exceed the model's context of {context}",
                ids.len(),
                args.max_new_tokens
            );
        }
        Ok(())
    };
    let mut units = Vec::with_capacity(cases.len());
    for entry in &cases {
        let unit = match entry {
            Entry::Prompt(case) => {
                let ids = loaded.encode_prompt(&case.prompt, args.chat)?;
                check(&case.id, &ids)?;
                let n = ids.len();
                Unit {
                    id: case.id.clone(),
                    prefix: ids,
                    questions: vec![(case.id.clone(), Vec::new(), n, case.answer.clone())],
                }
            }
            Entry::Document(doc) => {
                let alone = loaded.encode_prompt(&doc.context, args.chat)?;
                let mut prompts = Vec::with_capacity(doc.questions.len());
                for i in 0..doc.questions.len() {
                    let ids = loaded.encode_prompt(&doc.prompt(i), args.chat)?;
                    check(&doc.question_id(i), &ids)?;
                    prompts.push(ids);
                }
                // At least one token of every question is fed after the prefix.
                let shared = prompts.iter().map(|p| common_prefix(&alone, p).min(p.len() - 1)).min().unwrap_or(0);
                if shared == 0 {
                    bail!("case {}: the context and its questions share no leading tokens", doc.id);
                }
                let questions = prompts
                    .iter()
                    .zip(&doc.questions)
                    .enumerate()
                    .map(|(i, (ids, q))| (doc.question_id(i), ids[shared..].to_vec(), ids.len(), q.answer.clone()))
                    .collect();
                Unit { id: doc.id.clone(), prefix: alone[..shared].to_vec(), questions }
            }
        };
        units.push(unit);
    }

    let stop = loaded.stop_tokens();
    let mut report = Report::default();
    let mut timing = Timing::default();
    // (label, kept positions `[layer][kv_head]`, prompt length)
    let mut heatmaps: Vec<(String, KeptPositions, usize)> = Vec::new();
    let wanted_heatmaps: Vec<String> = if args.heatmap.is_empty() {
        let last = args.budget.last().map(|b| format!("@{b}")).unwrap_or_default();
        compressions.iter().map(Compression::label).filter(|l| l.ends_with(&last)).collect()
    } else {
        args.heatmap.clone()
    };
    for (i, unit) in units.iter().enumerate() {
        let t0 = Instant::now();
        let ids = &unit.prefix;
        let bar = crate::progress::prefill(&format!("[{}/{}] {}", i + 1, units.len(), unit.id), ids.len());
        let prefilled = pollster::block_on(Session::prefill_for(model, ids, &request));
        drop(bar);
        let mut prefilled = prefilled?;
        timing.prefill += prefilled.prefill_seconds;
        timing.stats += prefilled.stats_seconds;
        eprintln!(
            "[{}/{}] {}: {} tokens prefilled in {:.1}s (statistics read back in {:.2}s){}",
            i + 1,
            units.len(),
            unit.id,
            ids.len(),
            prefilled.prefill_seconds,
            prefilled.stats_seconds,
            match unit.questions.len() {
                1 if unit.questions[0].1.is_empty() => String::new(),
                n => format!(", then {n} questions"),
            }
        );
        if request.reconstruction {
            // KVzip's pass: the whole prefix is the context it repeats
            let t = Instant::now();
            pollster::block_on(prefilled.reconstruct(model, &loaded.reconstruction_prompt()?, 0..ids.len()))?;
            timing.prefill += t.elapsed().as_secs_f64();
            eprintln!("  context reconstructed in {:.1}s", t.elapsed().as_secs_f64());
        }
        let mut runs: Vec<Option<&Compression>> = vec![None];
        runs.extend(compressions.iter().map(Some));
        for c in runs {
            let key = c.map(Compression::label).unwrap_or_else(|| FULL.to_string());
            for (qid, suffix, prompt_tokens, answer) in &unit.questions {
                let t = Instant::now();
                let outcome = pollster::block_on(async {
                    let options = GenerateOptions::greedy(args.max_new_tokens, stop.clone());
                    let (mut generator, report) = if suffix.is_empty() {
                        let g = Generator::resume(model, &prefilled, c, options).await?;
                        let report = g.report().cloned();
                        (g, report)
                    } else {
                        // A copy of the compressed cache, with room for the question and the answer.
                        let room = suffix.len() + args.max_new_tokens;
                        let (session, report) = Session::resume(model, &prefilled, c, room).await?;
                        (Generator::extend(session, suffix, options).await?, report)
                    };
                    generator.run().await?;
                    Ok::<_, kvslice_runtime::RuntimeError>((generator.output(), report))
                });
                timing.runs += t.elapsed().as_secs_f64();
                timing.run_count += 1;
                let mut kv_bytes = None;
                let (output, pass) = match outcome {
                    Ok((kept, compressed)) => {
                        kv_bytes = compressed.as_ref().map(|r| r.compressed_bytes);
                        let text = loaded.decode(&kept)?;
                        if let Some(r) = compressed
                            && i == 0
                            && wanted_heatmaps.contains(&key)
                            && !heatmaps.iter().any(|(k, _, _)| *k == key)
                        {
                            heatmaps.push((key.clone(), r.kept, ids.len()));
                        }
                        let pass = passes(&text, answer);
                        (text, pass)
                    }
                    Err(e) => (format!("error: {e}"), false),
                };
                if verbose {
                    eprintln!("  {key:28} {qid:24} {} {:?}", if pass { "pass" } else { "fail" }, output);
                }
                report.record(&key, qid, CaseReport { pass, output, prompt_tokens: *prompt_tokens, kv_bytes });
            }
        }
        if verbose {
            eprintln!("  case done in {:.1}s", t0.elapsed().as_secs_f64());
        }
        // after every case, so a long sweep that is interrupted keeps what it did
        if let Some(path) = &args.json {
            report.write(path)?;
        }
    }

    println!("{}", report.table());
    // the compressed caches' size, from the real element sizes
    for (key, run) in &report.runs {
        let bytes: Vec<usize> = run.cases.values().filter_map(|c| c.kv_bytes).collect();
        if !bytes.is_empty() {
            let mean = bytes.iter().sum::<usize>() as f64 / bytes.len() as f64;
            eprintln!("kv bytes {key}: {:.0} KiB per compressed cache (mean of {})", mean / 1024.0, bytes.len());
        }
    }
    let runs = timing.run_count.max(1) as f64;
    let sweep = timing.prefill + timing.stats + timing.runs;
    // Re-prefilling means one prefill of a whole prompt per run and question.
    let reprefill = timing.prefill * runs / units.len().max(1) as f64 + timing.runs;

    eprintln!(
        "sweep: {:.1}s ({:.1}s prefill once per case, {:.1}s statistics read-back, {:.1}s in {} compress+decode runs); \
         re-prefilling for every run would take ~{:.1}s: {:.1}x",
        sweep,
        timing.prefill,
        timing.stats,
        timing.runs,
        timing.run_count,
        reprefill,
        reprefill / sweep.max(1e-9)
    );
    if let Some(dir) = &args.plots {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        if report.runs.len() > 1 {
            kvslice_eval::plot::score_vs_budget(&report, &dir.join("scores.png"))?;
        }
        for (key, kept, len) in &heatmaps {
            let file = dir.join(format!("kept-{}.png", key.replace(['@', '%'], "-")));
            kvslice_eval::plot::kept_heatmap(
                kept,
                *len,
                &format!("{key}: kept positions, case {}", units[0].id),
                &file,
            )?;
        }
    }
    Ok(())
}
