//! `kvslice cases`: writes generated retrieval cases (JSON Lines) for `kvslice eval`. Only the
//! model's tokenizer is loaded, to size prompts; no weights, no GPU.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use kvslice_eval::{Corpus, Kind};

#[derive(clap::Args, Clone)]
pub struct CasesArgs {
    /// Case kinds, comma-separated: prompts (passkey, niah-single, niah-multikey,
    /// niah-multivalue, variable-tracking) or documents asked several questions each (doc-niah,
    /// doc-vt).
    #[arg(long, value_delimiter = ',', required = true)]
    pub kind: Vec<Kind>,
    /// Prompt lengths in tokens (each prompt is within 1% below), comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub tokens: Vec<usize>,
    /// Depths of the asked needle in percent of the haystack, comma-separated (prompt kinds;
    /// documents place their needles themselves).
    #[arg(long, value_delimiter = ',', default_value = "25,50,75")]
    pub depths: Vec<u32>,
    /// Seeds, comma-separated: the whole suite once per seed, in that order.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub seed: Vec<u64>,
    /// Output file; default: stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// A .gguf file or HF folder whose tokenizer sizes the prompts; default: the fetched
    /// SmolLM2-135M-Instruct.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The haystack's text, one verse or speech per line: `kjv` (the default) or `shakespeare`
    /// (fetched on first use; ids end in `-shakespeare`), or a file path.
    #[arg(long, default_value = "kjv")]
    pub corpus: crate::fetch::CorpusChoice,
}

pub fn run(args: CasesArgs) -> Result<()> {
    if args.tokens.contains(&0) {
        bail!("--tokens: every length must be positive");
    }
    if let Some(d) = args.depths.iter().find(|&&d| d > 100) {
        bail!("--depths: {d} is above 100");
    }
    let model = match args.model {
        Some(p) => p,
        None => crate::fetch::default_model_path()?,
    };
    let tokenizer = kvslice_eval::tokens::load_tokenizer(&model)
        .with_context(|| format!("loading the tokenizer of {} (run `kvslice fetch` first?)", model.display()))?;
    let corpus_path = args.corpus.path(false)?;
    let corpus = Corpus::load(&corpus_path)?;
    // The tokenizer does not fail on plain text; if it ever did, the count is too large to fit
    // and generation reports it.
    let count = |text: &str| kvslice_eval::tokens::count_plain(&tokenizer, text).unwrap_or(usize::MAX);
    let mut cases = Vec::new();
    for &seed in &args.seed {
        cases.extend(kvslice_eval::suite(&corpus, &args.kind, &args.tokens, &args.depths, seed, &count)?);
    }
    if let Some(tag) = args.corpus.id_suffix() {
        kvslice_eval::tag_ids(&mut cases, tag);
    }
    let text = kvslice_eval::entries_to_jsonl(&cases)?;
    match args.out {
        Some(path) => {
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
            eprintln!("{} cases written to {}", cases.len(), path.display());
        }
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())?;
            out.flush()?;
        }
    }
    Ok(())
}
