//! Passages of public-domain text for the commands that learn from text (`train-policy`,
//! `calibrate`): runs of whole lines (verses, speeches) drawn at seeded random starts from the
//! corpora, alternating between them. A passage is refused when it shares a line with another
//! passage, lies in the first `--skip-lines` lines of its corpus (the perplexity benchmark's
//! text), or holds a line of 24 characters or more that appears in any string of the evaluation
//! suites given by `--exclude` (every `.jsonl` file under the paths): no such text is part of an
//! evaluation.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use kvslice_runtime::Tokenizer;
use kvslice_runtime::policies::splitmix64;

#[derive(clap::Args, Clone)]
pub struct PassageArgs {
    /// Corpora the passages come from, comma-separated (`kjv`, `shakespeare` or files, one
    /// passage unit per line).
    #[arg(long, value_delimiter = ',', default_value = "kjv,shakespeare")]
    pub corpus: Vec<crate::fetch::CorpusChoice>,
    /// Evaluation suites no passage may share a line with: `.jsonl` files or folders of them.
    #[arg(long, value_delimiter = ',', default_value = "tests/eval")]
    pub exclude: Vec<PathBuf>,
    /// Leading lines of every corpus never drawn from.
    #[arg(long, default_value_t = 1500)]
    pub skip_lines: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// One passage: `tokens` ids of whole lines from `first_line` (1-based) of `corpus`.
pub struct Passage {
    pub corpus: String,
    pub first_line: usize,
    pub ids: Vec<u32>,
}

/// Every string value of every `.jsonl` file under `paths`, joined by newlines.
fn excluded_text(paths: &[PathBuf]) -> Result<String> {
    fn strings(v: &serde_json::Value, out: &mut String) {
        match v {
            serde_json::Value::String(s) => {
                out.push_str(s);
                out.push('\n');
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
            serde_json::Value::Object(o) => o.values().for_each(|x| strings(x, out)),
            _ => {}
        }
    }
    fn files(p: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
        if p.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("reading {}", p.display()))?
                .flatten()
                .map(|e| e.path())
                .collect();
            entries.sort();
            for e in entries {
                files(&e, out)?;
            }
        } else if p.extension().is_some_and(|e| e == "jsonl") {
            out.push(p.to_path_buf());
        } else if !p.exists() {
            bail!("--exclude {}: no such file or folder", p.display());
        }
        Ok(())
    }
    let mut list = Vec::new();
    for p in paths {
        files(p, &mut list)?;
    }
    if list.is_empty() {
        bail!("--exclude names no .jsonl suite: nothing would keep the training text out of the evaluations");
    }
    let mut out = String::new();
    for f in &list {
        let text = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let v: serde_json::Value =
                serde_json::from_str(line).with_context(|| format!("{} line {}: not JSON", f.display(), i + 1))?;
            strings(&v, &mut out);
        }
    }
    eprintln!("excluding {} suites ({} KiB of text)", list.len(), out.len() / 1024);
    Ok(out)
}

impl PassageArgs {
    /// `count` passages of exactly `total` tokens (see the module docs).
    pub fn draw(&self, tokenizer: &Tokenizer, count: usize, total: usize, verbose: bool) -> Result<Vec<Passage>> {
        let excluded = excluded_text(&self.exclude)?;
        let mut corpora = Vec::new();
        for c in &self.corpus {
            let path = c.path(!verbose)?;
            let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
            let lines: Vec<String> = text.lines().map(str::to_string).collect();
            if lines.len() <= self.skip_lines + 1 {
                bail!("{} has {} lines, not more than --skip-lines {}", path.display(), lines.len(), self.skip_lines);
            }
            corpora.push((path, lines));
        }
        let mut used: Vec<(usize, usize, usize)> = Vec::new(); // (corpus, first line, end line)
        let mut passages: Vec<Passage> = Vec::new();
        let mut draw = 0u64;
        while passages.len() < count {
            if draw > 200 * count as u64 {
                bail!("found only {} passages that share no line with the suites or each other", passages.len());
            }
            let ci = passages.len() % corpora.len();
            let lines = &corpora[ci].1;
            let span = lines.len() - self.skip_lines;
            let start = self.skip_lines + (splitmix64(self.seed, draw) % span as u64) as usize;
            draw += 1;
            let mut end = start;
            let mut ids = Vec::new();
            while end < lines.len() && ids.len() < total {
                end = (end + 16).min(lines.len());
                ids = tokenizer.encode(&lines[start..end].join("\n"), true)?;
            }
            if ids.len() < total {
                continue;
            }
            // the fewest lines that give `total` tokens
            while end > start + 1 {
                let shorter = tokenizer.encode(&lines[start..end - 1].join("\n"), true)?;
                if shorter.len() < total {
                    break;
                }
                end -= 1;
                ids = shorter;
            }
            ids.truncate(total);
            let overlaps = used.iter().any(|&(c, a, b)| c == ci && start < b && a < end);
            let shared = lines[start..end].iter().any(|l| l.len() >= 24 && excluded.contains(l.as_str()));
            if overlaps || shared {
                continue;
            }
            used.push((ci, start, end));
            let corpus = corpora[ci].0.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            passages.push(Passage { corpus, first_line: start + 1, ids });
        }
        Ok(passages)
    }
}
