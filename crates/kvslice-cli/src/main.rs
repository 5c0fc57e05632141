//! The `kvslice` command-line tool.

mod bench;
mod calibrate;
mod cases;
mod doctor;
mod eval;
mod fetch;
mod passages;
mod ppl;
mod progress;
mod train;

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use kvslice_runtime::{
    Compression, DeviceChoice, GenerateOptions, Generator, LoadedModel, Sampler, Session, init_device, policies,
};

#[derive(Parser)]
#[command(
    name = "kvslice",
    version,
    about = "LLM inference with adaptive KV-cache eviction, on any GPU WebGPU reaches"
)]
struct Cli {
    /// Print the adapter and loading details on stderr.
    #[arg(short, long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Clone)]
pub(crate) struct ModelArgs {
    /// An HF model folder or a .gguf file; default: the fetched SmolLM2-135M-Instruct.
    #[arg(long)]
    model: Option<PathBuf>,
    /// `wgpu` (default; `wgpu:vulkan|metal|dx12|gl` pins the API, `wgpu:API:INDEX` one adapter
    /// as `kvslice doctor` lists them), `cpu`, or `auto` (wgpu on a hardware adapter, else the
    /// CPU backend).
    #[arg(long, default_value = "wgpu")]
    device: String,
    /// Prompts run in passes of this many tokens, layer by layer, so that activation memory is
    /// bounded by the chunk (0: the whole prompt in one pass). The eviction policies keep what
    /// they keep after one pass.
    #[arg(long, default_value_t = kvslice_runtime::PREFILL_CHUNK)]
    prefill_chunk: usize,
    /// Low-rank keys written by `kvslice calibrate`: each key is its group's reconstruction
    /// from the latent, rotated by RoPE after it.
    #[arg(long)]
    low_rank_keys: Option<PathBuf>,
    /// How the cache holds low-rank keys after the prefill: `latent` (each group's latent row,
    /// shared by its heads, which then keep the same entries) or `full` (every head's rebuilt
    /// key, evicted per head).
    #[arg(long, default_value = "latent", value_parser = ["latent", "full"], requires = "low_rank_keys")]
    key_storage: String,
}

#[derive(clap::Args, Clone)]
struct EvictionArgs {
    /// Eviction policy with its options, `NAME[:KEY=VALUE,...]` (`kvslice policies -v` lists
    /// them, e.g. `snapkv:window=32,kernel=7`, `cake:gamma=200`); default: keep the whole cache.
    #[arg(long, requires = "budget")]
    policy: Option<String>,
    /// KV budget: `10%` of the prompt, `128L` tokens per layer on average, `2048` flat.
    #[arg(long, requires = "policy")]
    budget: Option<String>,
    /// Compress after the whole prefill even where the policy cascades layer by layer (CAKE).
    #[arg(long, requires = "policy")]
    one_shot: bool,
    /// How the compressed cache stores its entries: `f32`, `f16`, or KIVI's `q8`/`q4` (keys per
    /// channel, values per token, the newest entries at full precision until their group of 64
    /// fills).
    #[arg(long, default_value = "f32", requires = "policy")]
    kv_dtype: kvslice_runtime::KvDtype,
}

#[derive(Subcommand)]
enum ReportCommand {
    /// Join the reports of `kvslice eval --shard K/N` runs into the report of one run (the
    /// shards must be disjoint).
    Merge {
        /// The shards' `--json` reports.
        #[arg(required = true)]
        reports: Vec<PathBuf>,
        /// Where to write the merged report (default: standard output).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Draw a `kvslice ppl --json` file as perplexity per span against position (PNG).
    PlotPpl {
        /// The `kvslice ppl --json` file.
        json: PathBuf,
        /// The PNG to write.
        #[arg(long)]
        out: PathBuf,
        /// Predictions per span (default: the file's).
        #[arg(long)]
        span: Option<usize>,
    },
}

#[derive(clap::Args)]
struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// 0 picks a free port (printed on stderr).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Default eviction policy of requests that name none (`kv_policy` in a request overrides
    /// it; `none` there asks for the full cache).
    #[arg(long, requires = "budget")]
    policy: Option<String>,
    /// Default KV budget (`kv_budget` in a request overrides it).
    #[arg(long, requires = "policy")]
    budget: Option<String>,
    /// Conversations whose cache is kept between requests; the least recently used goes first.
    #[arg(long, default_value_t = 16)]
    max_sessions: usize,
    /// KV storage the kept conversations may hold together, in MiB.
    #[arg(long, default_value_t = 2048)]
    kv_memory_mib: u64,
    /// A kept conversation unused for this many seconds is dropped.
    #[arg(long, default_value_t = 600)]
    session_ttl: u64,
    /// Generations run at once (interleaved a token at a time).
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// Requests that may wait for a free generation slot; more are answered 429.
    #[arg(long, default_value_t = 64)]
    queue: usize,
}

#[derive(Subcommand)]
enum Command {
    /// Download the default model (SmolLM2-135M-Instruct) into the cache folder.
    Fetch {
        /// Download again even if the model is present.
        #[arg(long)]
        force: bool,
        /// Also fetch the public-domain texts that `kvslice cases` and `kvslice ppl` draw from
        /// (the KJV and Shakespeare's plays).
        #[arg(long)]
        corpus: bool,
    },
    /// List the eviction policies, one line each with its paper; with `-v`, each policy's
    /// options (`--policy NAME:KEY=VALUE,...`), defaults and ranges.
    Policies,
    /// Write generated retrieval cases (JSON Lines) for `kvslice eval`.
    Cases(cases::CasesArgs),
    /// Run retrieval cases with the full cache and under every policy × budget.
    Eval(eval::EvalArgs),
    /// Generate text from a prompt, streamed to stdout.
    Generate {
        #[command(flatten)]
        model: ModelArgs,
        #[arg(long)]
        prompt: String,
        /// Wrap the prompt in the model's chat template as one user message.
        #[arg(long)]
        chat: bool,
        #[arg(long, default_value_t = 64)]
        max_new_tokens: usize,
        /// 0 = greedy.
        #[arg(long, default_value_t = 0.0)]
        temperature: f32,
        #[arg(long, default_value_t = 1.0)]
        top_p: f32,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Keep generating past end-of-sequence tokens, up to --max-new-tokens (for soak and
        /// speed runs).
        #[arg(long)]
        ignore_eos: bool,
        #[command(flatten)]
        eviction: EvictionArgs,
    },
    /// Print the prompt's token ids and the top-K logits of its last position as JSON.
    Logits {
        #[command(flatten)]
        model: ModelArgs,
        #[arg(long)]
        text: String,
        #[arg(long, default_value_t = 20)]
        top: usize,
    },
    /// Measure prefill and decode speed.
    Bench(bench::BenchArgs),
    /// Perplexity of a long text decoded token by token with each policy's cache (and the full
    /// cache), per span of positions.
    Ppl(ppl::PplArgs),
    /// Train DistillCache's per-head eviction networks on traces recorded from public-domain
    /// text (none of it in the evaluation suites) and write their weights.
    TrainPolicy(train::TrainArgs),
    /// Calibrate low-rank keys (KV heads grouped by CKA, a grouped SVD of the key projection)
    /// on public-domain text (none of it in the evaluation suites) and write them for
    /// `--low-rank-keys`.
    Calibrate(calibrate::CalibrateArgs),
    /// Work on `kvslice eval` reports.
    #[command(subcommand)]
    Report(ReportCommand),
    /// Serve the model over an OpenAI-compatible HTTP API (`/v1/chat/completions`,
    /// `/v1/completions`, `/v1/models`, `/health`, `/metrics`); conversations keep their
    /// (compressed) KV cache between requests.
    Serve(ServeArgs),
    /// Check every adapter wgpu finds (Vulkan, Metal, DX12, GL) and Burn's CPU backend: the
    /// kernel conformance suite and the default model's logits against transformers', one row
    /// per device; exits with an error when a device fails a check.
    Doctor(doctor::DoctorArgs),
    /// Run the kernel conformance suite (every WGSL kernel against its CPU twin) on a wgpu
    /// adapter; exits with an error when a case fails.
    Conformance {
        /// `wgpu`, `wgpu:vulkan|metal|dx12|gl`, or one adapter, `wgpu:API:INDEX` (as `kvslice
        /// doctor` lists them).
        #[arg(long, default_value = "wgpu")]
        device: String,
        /// Print the results as JSON `[{kernel, case, passed, failure, checked}]` (the page's
        /// format) instead of one line per case.
        #[arg(long)]
        json: bool,
    },
}

fn main() {
    quiet_vulkan_loader();
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// Without a display session (a server, CI, ssh), Mesa's device-select Vulkan layer has no
/// display to pick a GPU by and prints "XDG_RUNTIME_DIR is invalid" for every Vulkan instance,
/// which reads as a failure; it only reorders adapters, and wgpu picks its adapter itself, so
/// it is turned off there. An explicit `NODEVICE_SELECT` is left as set.
fn quiet_vulkan_loader() {
    #[cfg(target_os = "linux")]
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() && std::env::var_os("NODEVICE_SELECT").is_none() {
        // SAFETY: first statement of `main`, before any other thread exists: nothing reads the
        // environment concurrently.
        #[allow(unsafe_code)]
        unsafe {
            std::env::set_var("NODEVICE_SELECT", "1");
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Fetch { force, corpus } => {
            let path = fetch::fetch(force, false)?;
            println!("{}", path.display());
            if corpus {
                for path in fetch::fetch_corpora(force, false)? {
                    println!("{}", path.display());
                }
            }
            Ok(())
        }
        Command::Policies => {
            print!("{}", if cli.verbose { policies::listing_verbose() } else { policies::listing() });
            Ok(())
        }
        Command::Cases(args) => cases::run(args),
        Command::Eval(args) => eval::run(args, cli.verbose),
        Command::Generate { model, prompt, chat, max_new_tokens, temperature, top_p, seed, ignore_eos, eviction } => {
            let compression = match (&eviction.policy, &eviction.budget) {
                (Some(p), Some(b)) => Some((p.clone(), b.clone())),
                _ => None,
            };
            let loaded = open(&model, cli.verbose)?;
            let sampler = Sampler::new(temperature, top_p, seed).map_err(anyhow::Error::msg)?;
            let ids = loaded.encode_prompt(&prompt, chat)?;
            let compression = match compression {
                Some((p, b)) => {
                    let c = Compression::new(&p, &b, &Compression::model_info(&loaded.model))?
                        .with_kv_dtype(eviction.kv_dtype)
                        .with_reconstruction(loaded.reconstruction_prompt()?);
                    Some(if eviction.one_shot { c.one_shot() } else { c })
                }
                None => None,
            };
            let stop_tokens = if ignore_eos { Vec::new() } else { loaded.stop_tokens() };
            let options = GenerateOptions { max_new_tokens, sampler, stop_tokens };
            let bar = progress::prefill("prefill", ids.len());
            let generator = pollster::block_on(Generator::prefill(&loaded.model, &ids, options, compression.as_ref()));
            drop(bar);
            let mut generator = generator?.with_tokenizer(&loaded.tokenizer);
            let mut stdout = std::io::stdout();
            while let Some(token) = pollster::block_on(generator.next())? {
                stdout.write_all(token.text.as_bytes())?;
                stdout.flush()?;
            }
            println!("{}", generator.rest()?);
            eprintln!("{}", generator.stats());
            let report = generator.report();
            if let (Some(r), Some(c)) = (report, &compression) {
                let cfg = &loaded.model.config;
                let prompt_entries = r.prompt_tokens * cfg.num_layers * cfg.num_kv_heads;
                // The cache as it stands after the generation, against the full cache of every
                // token it has seen (the prompt's alone understates what a long generation saves).
                let session = generator.session();
                let seen = session.position() as usize;
                let full_now = seen * cfg.num_layers * cfg.num_kv_heads * session.cache().entry_bytes();
                let mib = |b: usize| b as f64 / (1 << 20) as f64;
                eprintln!(
                    "{}: kept {} of {} prompt KV entries ({:.1}%); KV storage {:.2} MiB after {seen} tokens instead of \
                     {:.2} MiB for the full cache (after the prompt: {:.2} MiB instead of {:.2} MiB, peak {:.2} MiB); \
                     planning {:.0} ms, compaction {:.0} ms",
                    c.label(),
                    r.kept_entries,
                    prompt_entries,
                    100.0 * r.kept_entries as f64 / prompt_entries.max(1) as f64,
                    mib(session.cache().storage_bytes()),
                    mib(full_now),
                    mib(r.compressed_bytes),
                    mib(r.full_bytes),
                    mib(r.peak_bytes),
                    r.plan_time.as_secs_f64() * 1e3,
                    r.compact_time.as_secs_f64() * 1e3,
                );
            }
            Ok(())
        }
        Command::Logits { model, text, top } => {
            let loaded = open(&model, cli.verbose)?;
            let ids = loaded.encode_prompt(&text, false)?;
            let mut session = Session::new(&loaded.model, ids.len())?;
            let logits = pollster::block_on(session.next_logits(&ids))?;
            let top = top_k(&logits, top);
            let json = serde_json::json!({
                "tokens": ids,
                "top": top.iter().map(|&(id, l)| serde_json::json!([id, l])).collect::<Vec<_>>(),
            });
            println!("{json}");
            Ok(())
        }
        Command::Bench(args) => bench::run(args, cli.verbose),
        Command::Serve(args) => serve(args, cli.verbose),
        Command::Ppl(args) => ppl::run(args, cli.verbose),
        Command::TrainPolicy(args) => train::run(args, cli.verbose),
        Command::Calibrate(args) => calibrate::run(args, cli.verbose),
        Command::Report(ReportCommand::Merge { reports, out }) => {
            let mut merged = kvslice_eval::Report::default();
            for path in &reports {
                let report = kvslice_eval::Report::read(path).with_context(|| format!("reading {}", path.display()))?;
                merged.merge_disjoint(report).with_context(|| format!("merging {}", path.display()))?;
            }
            match out {
                Some(path) => merged.write(&path)?,
                None => print!("{}", merged.to_json()?),
            }
            Ok(())
        }
        Command::Report(ReportCommand::PlotPpl { json, out, span }) => {
            let (runs, file_span, tokens) = ppl::read_runs(&json)?;
            ppl::plot(&runs, span.unwrap_or(file_span), tokens, &out)
        }
        Command::Conformance { device, json } => conformance(&device, json),
        Command::Doctor(args) => doctor::run(args),
    }
}

/// `kvslice serve`: loads the model, then serves until Ctrl-C.
fn serve(args: ServeArgs, verbose: bool) -> Result<()> {
    let path = model_path(&args.model)?;
    let model_name = path.file_stem().map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned());
    let options = kvslice_server::ServeOptions {
        host: args.host,
        port: args.port,
        queue: args.queue,
        model_name,
        engine: kvslice_server::EngineConfig {
            default_kv: args.policy.zip(args.budget),
            max_sessions: args.max_sessions,
            kv_memory: args.kv_memory_mib.saturating_mul(1 << 20),
            parallel: args.parallel,
            session_ttl: std::time::Duration::from_secs(args.session_ttl),
        },
    };
    let model = args.model.clone();
    kvslice_server::serve(
        options,
        move || open(&model, verbose),
        |addr| {
            eprintln!("listening on http://{addr}");
        },
    )
}

/// `kvslice conformance`: the portable suite the browser page runs, on a native adapter.
fn conformance(device: &str, json: bool) -> Result<()> {
    let choice: DeviceChoice = device.parse()?;
    if matches!(choice, DeviceChoice::Cpu | DeviceChoice::Auto) {
        anyhow::bail!("the conformance suite checks wgpu kernels: use --device wgpu or wgpu:API");
    }
    let (device, info) = pollster::block_on(init_device(choice))?;
    let results = pollster::block_on(kvslice_runtime::conformance::run_all(&device));
    let failed = results.iter().filter(|r| !r.passed()).count();
    if json {
        let out: Vec<_> = results.iter().map(|r| r.report()).collect();
        println!("{}", serde_json::to_string(&out)?);
    } else {
        println!("{info}");
        for r in &results {
            match &r.failure {
                None => println!("ok     {} [{}] ({} values)", r.kernel, r.case, r.checked),
                Some(f) => println!("FAILED {} [{}]: {f}", r.kernel, r.case),
            }
        }
        println!("{} passed, {failed} failed", results.len() - failed);
    }
    if failed > 0 {
        anyhow::bail!("{failed} of {} conformance cases failed on {}", results.len(), info.name);
    }
    Ok(())
}

/// Opens the model on the chosen device.
pub(crate) fn open(args: &ModelArgs, verbose: bool) -> Result<LoadedModel> {
    let choice: DeviceChoice = args.device.parse()?;
    let path = model_path(args)?;
    let (device, info) = pollster::block_on(init_device(choice))?;
    if verbose {
        eprintln!("device: {info}");
    }
    let t0 = std::time::Instant::now();
    let mut loaded = LoadedModel::open(&path, &device).with_context(|| format!("loading {}", path.display()))?;
    loaded.model.set_prefill_chunk(args.prefill_chunk);
    if let Some(path) = &args.low_rank_keys {
        let keys = kvslice_runtime::lowrank::LowRankKeys::read(path)?;
        loaded.model.set_low_rank_keys(&keys).with_context(|| format!("--low-rank-keys {}", path.display()))?;
        loaded.model.set_latent_storage(args.key_storage == "latent");
    }
    if verbose {
        let c = &loaded.model.config;
        eprintln!(
            "model: {} ({:?}, {} layers, {} heads, {} kv heads, head_dim {}, vocab {}, {:.1}M parameters) loaded in {:.1}s",
            path.display(),
            c.architecture,
            c.num_layers,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            c.vocab_size,
            c.num_parameters() as f64 / 1e6,
            t0.elapsed().as_secs_f64()
        );
    }
    Ok(loaded)
}

/// `--model`, or the fetched default model.
fn model_path(args: &ModelArgs) -> Result<PathBuf> {
    match &args.model {
        Some(p) => Ok(p.clone()),
        None => {
            let p = fetch::default_model_path()?;
            if !p.exists() {
                anyhow::bail!("no --model given and the default model is not fetched yet: run `kvslice fetch`");
            }
            Ok(p)
        }
    }
}

/// Policy specs from a comma-separated list whose entries may carry options of their own
/// (`snapkv:window=32,kernel=7,h2o` is two policies): a piece without `:` that holds `=` is an
/// option of the policy before it.
pub(crate) fn policy_list(pieces: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for piece in pieces.iter().flat_map(|p| p.split(',')) {
        match out.last_mut() {
            Some(last) if last.contains(':') && !piece.contains(':') && piece.contains('=') => {
                last.push(',');
                last.push_str(piece);
            }
            _ => out.push(piece.to_string()),
        }
    }
    out.retain(|p| !p.is_empty());
    out
}

/// The `k` largest logits, highest first; ties by lower id.
fn top_k(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    idx.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
    idx.truncate(k);
    idx.into_iter().map(|i| (i, logits[i as usize])).collect()
}
