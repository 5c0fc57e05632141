//! Seeded retrieval cases after RULER's recipes (Hsieh et al., "RULER: What's the Real Context
//! Size of Your Long-Context Language Models?", 2024): passkey, needle-in-a-haystack with one
//! key, several keys or several values, and variable tracking — over a haystack of consecutive
//! KJV verses instead of Paul Graham's essays.
//!
//! A case is built in three steps, all decided by the seed before any sizing:
//! 1. the haystack's first verse, the keys (adjective-noun pairs, e.g. `quiet-harbor`), the
//!    values (7-digit numbers) and where the distractor needles go;
//! 2. the needle the question asks about is inserted at `depth_percent` of the haystack, at a
//!    verse boundary (0 = before the first verse, 100 = after the last); distractors go to
//!    seeded random depths;
//! 3. the haystack is sized with the caller's tokenizer so the whole prompt has at most `tokens`
//!    tokens and is within 1% of it: a binary search on the number of whole verses, then on the
//!    number of words taken from the next verse (about 2·log2 tokenizer calls in all).
//!
//! The prompt is plain text — a preamble, the haystack, the question — ending with an answer
//! prefix, so an instruct model run without its chat template completes it. A case passes when
//! `answer` occurs in the output:
//! - passkey, niah-single, niah-multikey: the one 7-digit value asked for;
//! - niah-multivalue: four values share the key; the answer is all four in order of appearance,
//!   joined by `", "` (stricter than RULER's per-value recall, which needs several answers);
//! - variable-tracking: two chains of five variables (`VAR QXJZP = 1234567.`, then
//!   `VAR MEKOT = VAR QXJZP.`, ...); the question asks for the value of the asked chain's last
//!   variable, which only following its four hops gives (RULER asks for the chain's names
//!   instead, a list).
//!
//! Documents (query-agnostic, [`generate_document`]): the context is compressed before any
//! question is seen, then asked one question per planted fact:
//! - doc-niah: six keys, one value each, at stratified depths (one in each sixth of the
//!   haystack), each in one of four phrasings — two with the key before the value, two with the
//!   value first ("1234567 is the special magic number for quiet-harbor."); one question per key,
//!   in a seeded order;
//! - doc-multikey: two keys, one value each, one in each half of the haystack, both in the
//!   phrasing the question echoes ("The special magic number for quiet-harbor is 1234567.");
//!   one question per key, in a seeded order — RULER's multi-key recipe with every key asked.
//!   With two keys, not more, SmolLM2-135M's full cache answers most questions (more keys and it
//!   gives one salient value for all of them; figures in docs/BENCHMARKS.md);
//! - doc-vt: three chains of five variables, their statements at seeded depths; one question per
//!   chain (the value its last variable is assigned).
//!
//! A document is sized so that the context, a newline and its longest question have at most
//! `tokens` tokens, within 1%.

use std::fmt;
use std::str::FromStr;

use crate::cases::{Case, Document, Entry, Question};
use crate::corpus::Corpus;
use crate::error::{EvalError, Result};
use crate::rng::{SplitMix64, fnv1a};

/// The kinds of case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Passkey,
    NiahSingle,
    NiahMultiKey,
    NiahMultiValue,
    VariableTracking,
    /// A document with six needles and a question about each.
    DocNiah,
    /// A document with two needles, each key before its value as the question words it, and a
    /// question about each.
    DocMultiKey,
    /// A document with three variable chains and a question about each.
    DocVariableTracking,
}

impl Kind {
    /// The kinds that make prompts (query-aware).
    pub const PROMPTS: [Kind; 5] =
        [Kind::Passkey, Kind::NiahSingle, Kind::NiahMultiKey, Kind::NiahMultiValue, Kind::VariableTracking];
    /// The kinds that make documents (query-agnostic).
    pub const DOCUMENTS: [Kind; 3] = [Kind::DocNiah, Kind::DocMultiKey, Kind::DocVariableTracking];
    pub const ALL: [Kind; 8] = [
        Kind::Passkey,
        Kind::NiahSingle,
        Kind::NiahMultiKey,
        Kind::NiahMultiValue,
        Kind::VariableTracking,
        Kind::DocNiah,
        Kind::DocMultiKey,
        Kind::DocVariableTracking,
    ];

    /// Whether it makes documents (a context and several questions) rather than prompts.
    pub fn is_document(self) -> bool {
        Kind::DOCUMENTS.contains(&self)
    }

    /// The kebab-case name used in case ids and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Passkey => "passkey",
            Kind::NiahSingle => "niah-single",
            Kind::NiahMultiKey => "niah-multikey",
            Kind::NiahMultiValue => "niah-multivalue",
            Kind::VariableTracking => "variable-tracking",
            Kind::DocNiah => "doc-niah",
            Kind::DocMultiKey => "doc-multikey",
            Kind::DocVariableTracking => "doc-vt",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Kind {
    type Err = EvalError;

    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        Kind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| EvalError::UnknownKind { name: s.to_string(), known: Kind::ALL.map(Kind::name).join(", ") })
    }
}

/// What to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    pub kind: Kind,
    /// The prompt's token count to aim at (from below, within 1%).
    pub tokens: usize,
    /// Where the asked needle goes, in percent of the haystack (0..=100).
    pub depth_percent: u32,
    pub seed: u64,
}

impl Spec {
    /// `kind-tokens-dDEPTH-sSEED`, e.g. `niah-single-4096-d50-s1`; documents, which place
    /// their needles themselves, `kind-tokens-sSEED`.
    pub fn id(&self) -> String {
        if self.kind.is_document() {
            format!("{}-{}-s{}", self.kind, self.tokens, self.seed)
        } else {
            format!("{}-{}-d{}-s{}", self.kind, self.tokens, self.depth_percent, self.seed)
        }
    }

    /// The name mixed into the seed (the id without the seed).
    fn name(&self) -> String {
        if self.kind.is_document() {
            format!("{}-{}", self.kind, self.tokens)
        } else {
            format!("{}-{}-d{}", self.kind, self.tokens, self.depth_percent)
        }
    }
}

const ADJECTIVES: [&str; 40] = [
    "amber", "ancient", "bitter", "bold", "brave", "bright", "calm", "clever", "crimson", "curious", "distant",
    "dusty", "eager", "faint", "fierce", "gentle", "golden", "hidden", "hollow", "humble", "icy", "jolly", "lively",
    "lonely", "lucky", "misty", "narrow", "noble", "pale", "proud", "quiet", "rapid", "rusty", "silent", "silver",
    "steady", "swift", "tender", "velvet", "wild",
];
const NOUNS: [&str; 40] = [
    "anchor", "badger", "basket", "beacon", "canyon", "cello", "comet", "compass", "falcon", "feather", "garden",
    "glacier", "harbor", "hammer", "island", "kettle", "lantern", "meadow", "mirror", "needle", "orchard", "otter",
    "pebble", "pepper", "piano", "planet", "quarry", "ribbon", "saddle", "shovel", "spider", "teapot", "thimble",
    "tunnel", "violin", "walnut", "whistle", "window", "wizard", "zebra",
];

/// What a case plants and asks, before the haystack is sized.
struct Plan {
    preamble: String,
    /// (depth in [0, 1], sentence), in the order they must appear when depths tie.
    needles: Vec<(f64, String)>,
    /// (question, answer): one for a prompt, one per planted fact for a document.
    questions: Vec<(String, String)>,
}

fn draw_values(rng: &mut SplitMix64, n: usize) -> Vec<u64> {
    let mut values = Vec::with_capacity(n);
    while values.len() < n {
        let v = 1_000_000 + rng.below(9_000_000);
        if !values.contains(&v) {
            values.push(v);
        }
    }
    values
}

fn draw_keys(rng: &mut SplitMix64, n: usize) -> Vec<String> {
    let mut keys: Vec<String> = Vec::with_capacity(n);
    while keys.len() < n {
        let a = ADJECTIVES[rng.below(ADJECTIVES.len() as u64) as usize];
        let b = NOUNS[rng.below(NOUNS.len() as u64) as usize];
        let key = format!("{a}-{b}");
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys
}

fn draw_variables(rng: &mut SplitMix64, n: usize) -> Vec<String> {
    let mut names: Vec<String> = Vec::with_capacity(n);
    while names.len() < n {
        let name: String = (0..5).map(|_| (b'A' + rng.below(26) as u8) as char).collect();
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

const NIAH_PREAMBLE: &str = "Some special magic numbers are hidden within the following text. Make sure to memorize it. I will quiz you about the numbers afterwards.";

fn niah_needle(key: &str, value: u64) -> String {
    format!("One of the special magic numbers for {key} is: {value}.")
}

fn niah_question_one(key: &str) -> String {
    format!(
        "What is the special magic number for {key} mentioned in the provided text? The special magic number for {key} mentioned in the provided text is"
    )
}

fn plan(kind: Kind, depth: f64, rng: &mut SplitMix64) -> Plan {
    match kind {
        Kind::Passkey => {
            let v = draw_values(rng, 1)[0];
            Plan {
                preamble: "There is an important piece of information hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you about the important information there.".into(),
                needles: vec![(depth, format!("The pass key is {v}. Remember it. {v} is the pass key."))],
                questions: vec![("What is the pass key? The pass key is".into(), v.to_string())],
            }
        }
        Kind::NiahSingle => {
            let key = draw_keys(rng, 1).remove(0);
            let v = draw_values(rng, 1)[0];
            Plan {
                preamble: NIAH_PREAMBLE.into(),
                needles: vec![(depth, niah_needle(&key, v))],
                questions: vec![(niah_question_one(&key), v.to_string())],
            }
        }
        Kind::NiahMultiKey => {
            let keys = draw_keys(rng, 4);
            let values = draw_values(rng, 4);
            let mut needles = vec![(depth, niah_needle(&keys[0], values[0]))];
            for (k, v) in keys.iter().zip(&values).skip(1) {
                needles.push((rng.unit(), niah_needle(k, *v)));
            }
            Plan {
                preamble: NIAH_PREAMBLE.into(),
                needles,
                questions: vec![(niah_question_one(&keys[0]), values[0].to_string())],
            }
        }
        Kind::NiahMultiValue => {
            let key = draw_keys(rng, 1).remove(0);
            let values = draw_values(rng, 4);
            // The first value at the depth, the others after it, in order.
            let mut depths: Vec<f64> = (0..3).map(|_| depth + (1.0 - depth) * rng.unit()).collect();
            depths.sort_by(f64::total_cmp);
            depths.insert(0, depth);
            let needles = depths.iter().zip(&values).map(|(d, v)| (*d, niah_needle(&key, *v))).collect();
            Plan {
                preamble: NIAH_PREAMBLE.into(),
                needles,
                questions: vec![(
                    format!(
                        "What are all the special magic numbers for {key} mentioned in the provided text? The special magic numbers for {key} mentioned in the provided text are"
                    ),
                    values.iter().map(u64::to_string).collect::<Vec<_>>().join(", "),
                )],
            }
        }
        Kind::VariableTracking => {
            let names = draw_variables(rng, 10);
            let values = draw_values(rng, 2);
            let asked = chain(&names[..5], values[0]);
            let other = chain(&names[5..], values[1]);
            let mut depths: Vec<f64> = (0..4).map(|_| depth + (1.0 - depth) * rng.unit()).collect();
            depths.sort_by(f64::total_cmp);
            depths.insert(0, depth);
            let mut other_depths: Vec<f64> = (0..5).map(|_| rng.unit()).collect();
            other_depths.sort_by(f64::total_cmp);
            let mut needles: Vec<(f64, String)> = depths.into_iter().zip(asked).collect();
            needles.extend(other_depths.into_iter().zip(other));
            Plan {
                preamble: VT_PREAMBLE.into(),
                needles,
                questions: vec![(vt_question(&names[4]), values[0].to_string())],
            }
        }
        Kind::DocNiah => doc_niah_plan(rng, 6, None),
        Kind::DocMultiKey => doc_niah_plan(rng, 2, Some(1)),
        Kind::DocVariableTracking => {
            const CHAINS: usize = 3;
            let names = draw_variables(rng, 5 * CHAINS);
            let values = draw_values(rng, CHAINS);
            let mut needles = Vec::with_capacity(5 * CHAINS);
            for (c, value) in values.iter().enumerate() {
                let mut depths: Vec<f64> = (0..5).map(|_| rng.unit()).collect();
                depths.sort_by(f64::total_cmp);
                needles.extend(depths.into_iter().zip(chain(&names[5 * c..5 * c + 5], *value)));
            }
            let order = shuffled(rng, CHAINS);
            Plan {
                preamble: VT_PREAMBLE.into(),
                needles,
                questions: order.iter().map(|&c| (vt_question(&names[5 * c + 4]), values[c].to_string())).collect(),
            }
        }
    }
}

/// `needles` keys with one value each, needle `i` at a seeded depth in the `i`-th of `needles`
/// equal slices of the haystack (away from the slice's edges), in `phrasing` or a seeded one of
/// [`NIAH_PHRASINGS`]; one question per key, in a seeded order.
fn doc_niah_plan(rng: &mut SplitMix64, needles: usize, phrasing: Option<usize>) -> Plan {
    let keys = draw_keys(rng, needles);
    let values = draw_values(rng, needles);
    let mut planted = Vec::with_capacity(needles);
    for (i, (key, value)) in keys.iter().zip(&values).enumerate() {
        let depth = (i as f64 + 0.1 + 0.8 * rng.unit()) / needles as f64;
        let phrasing = phrasing.unwrap_or_else(|| rng.below(NIAH_PHRASINGS as u64) as usize);
        planted.push((depth, niah_phrasing(phrasing, key, *value)));
    }
    let order = shuffled(rng, needles);
    Plan {
        preamble: NIAH_PREAMBLE.into(),
        needles: planted,
        questions: order.iter().map(|&i| (niah_question_one(&keys[i]), values[i].to_string())).collect(),
    }
}

const VT_PREAMBLE: &str = "Memorize and track the chains of variable assignment hidden in the following text.";

/// `VAR A = value.`, then `VAR B = VAR A.`, … for `names` in order.
fn chain(names: &[String], value: u64) -> Vec<String> {
    let mut s = vec![format!("VAR {} = {value}.", names[0])];
    s.extend(names.windows(2).map(|w| format!("VAR {} = VAR {}.", w[1], w[0])));
    s
}

fn vt_question(last: &str) -> String {
    format!(
        "Question: Following the chain of assignments in the text above, what number is VAR {last} assigned? Answer: VAR {last} is assigned the number"
    )
}

const NIAH_PHRASINGS: usize = 4;

/// A needle in one of [`NIAH_PHRASINGS`] phrasings: 0 and 1 put the key first, 2 and 3 the value.
fn niah_phrasing(phrasing: usize, key: &str, value: u64) -> String {
    match phrasing {
        0 => niah_needle(key, value),
        1 => format!("The special magic number for {key} is {value}."),
        2 => format!("{value} is the special magic number for {key}."),
        _ => format!("Remember {value}: it is the special magic number for {key}."),
    }
}

/// `0..n` in a seeded order (Fisher–Yates).
fn shuffled(rng: &mut SplitMix64, n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    order
}

/// The context (preamble and haystack) with `n` whole verses of `window` and the first
/// `tail_words` words of verse `n`; a prompt is the context, a newline and a question.
fn render(plan: &Plan, window: &[String], n: usize, tail_words: usize) -> String {
    let tail: String;
    let mut units: Vec<&str> = window[..n].iter().map(String::as_str).collect();
    if tail_words > 0 {
        tail = window[n].split_whitespace().take(tail_words).collect::<Vec<_>>().join(" ");
        units.push(&tail);
    }
    let m = units.len();
    let mut at: Vec<(usize, usize)> =
        plan.needles.iter().enumerate().map(|(i, (d, _))| (((d * m as f64).round() as usize).min(m), i)).collect();
    at.sort_unstable();
    let mut parts: Vec<&str> = Vec::with_capacity(m + at.len());
    let mut needles = at.iter().peekable();
    for i in 0..=m {
        while let Some(&(_, j)) = needles.next_if(|(at, _)| *at == i) {
            parts.push(&plan.needles[j].1);
        }
        if let Some(unit) = units.get(i) {
            parts.push(unit);
        }
    }
    format!("{}\n{}", plan.preamble, parts.join(" "))
}

/// Generates one prompt case. `count_tokens` gives a text's token count as the model will see
/// it (for the runtime's plain prompts: the tokenizer's encoding with special tokens, BOS
/// included when the tokenizer adds one); it is called about 2·log2(`tokens`) times.
pub fn generate(corpus: &Corpus, spec: &Spec, count_tokens: &dyn Fn(&str) -> usize) -> Result<Case> {
    if spec.kind.is_document() {
        return Err(EvalError::Spec { reason: format!("{} makes documents, not prompts", spec.kind) });
    }
    let (plan, context) = build(corpus, spec, count_tokens)?;
    let (question, answer) = plan.questions.into_iter().next().expect("a prompt plan has its question");
    Ok(Case { id: spec.id(), prompt: format!("{context}\n{question}"), answer })
}

/// Generates one document (doc-niah, doc-vt): its context and longest question together have at
/// most `spec.tokens` tokens, within 1%; every question's prompt fits too. `spec.depth_percent`
/// is not used (the kind places its needles).
pub fn generate_document(corpus: &Corpus, spec: &Spec, count_tokens: &dyn Fn(&str) -> usize) -> Result<Document> {
    if !spec.kind.is_document() {
        return Err(EvalError::Spec { reason: format!("{} makes prompts, not documents", spec.kind) });
    }
    let (plan, context) = build(corpus, spec, count_tokens)?;
    let questions = plan.questions.into_iter().map(|(question, answer)| Question { question, answer }).collect();
    Ok(Document { id: spec.id(), context, questions })
}

/// A prompt case or a document, as `spec.kind` makes.
pub fn generate_entry(corpus: &Corpus, spec: &Spec, count_tokens: &dyn Fn(&str) -> usize) -> Result<Entry> {
    if spec.kind.is_document() {
        generate_document(corpus, spec, count_tokens).map(Entry::Document)
    } else {
        generate(corpus, spec, count_tokens).map(Entry::Prompt)
    }
}

/// The plan and its context, sized so that the context, a newline and the plan's longest
/// question (by token count) have at most `spec.tokens` tokens.
fn build(corpus: &Corpus, spec: &Spec, count_tokens: &dyn Fn(&str) -> usize) -> Result<(Plan, String)> {
    if spec.depth_percent > 100 {
        return Err(EvalError::Spec { reason: format!("depth {}% is above 100%", spec.depth_percent) });
    }
    if spec.tokens == 0 {
        return Err(EvalError::Spec { reason: "a case needs a positive token count".into() });
    }
    let mut rng = SplitMix64::new(spec.seed ^ fnv1a(&spec.name()));
    let verses = corpus.verses();
    let max_n = spec.tokens.min(verses.len());
    let start = rng.below((verses.len() - max_n + 1) as u64) as usize;
    let window = &verses[start..];
    let plan = plan(spec.kind, f64::from(spec.depth_percent) / 100.0, &mut rng);
    let longest = if plan.questions.len() == 1 {
        0
    } else {
        let lengths: Vec<usize> = plan.questions.iter().map(|(q, _)| count_tokens(q)).collect();
        (0..lengths.len()).max_by_key(|&i| (lengths[i], std::cmp::Reverse(i))).unwrap_or(0)
    };
    let question = &plan.questions[longest].0;

    let count = |n: usize, w: usize| count_tokens(&format!("{}\n{question}", render(&plan, window, n, w)));
    let base = count(0, 0);
    if base > spec.tokens {
        return Err(EvalError::TooFewTokens { kind: spec.kind.to_string(), tokens: spec.tokens, needed: base });
    }
    // Largest n with count(n, 0) <= tokens; `got` is the count at `lo`.
    let (mut lo, mut hi, mut got) = (0usize, max_n, base);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        let c = count(mid, 0);
        if c <= spec.tokens {
            (lo, got) = (mid, c);
        } else {
            hi = mid - 1;
        }
    }
    let mut n = lo;
    let mut w = 0;
    if n < window.len() {
        let (mut lo, mut hi) = (0usize, window[n].split_whitespace().count());
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            let c = count(n, mid);
            if c <= spec.tokens {
                (lo, got) = (mid, c);
            } else {
                hi = mid - 1;
            }
        }
        w = lo;
    }
    if got * 100 < spec.tokens * 99 && n == max_n && w == 0 {
        return Err(EvalError::CorpusTooSmall { verses: verses.len(), tokens: spec.tokens });
    }
    // Another question may tokenize one or two tokens longer where it meets the context.
    if plan.questions.len() > 1 {
        let fits = |n: usize, w: usize| {
            let context = render(&plan, window, n, w);
            plan.questions.iter().all(|(q, _)| count_tokens(&format!("{context}\n{q}")) <= spec.tokens)
        };
        while !fits(n, w) && (n, w) != (0, 0) {
            if w > 0 {
                w -= 1;
            } else {
                n -= 1;
            }
        }
    }
    let context = render(&plan, window, n, w);
    Ok((plan, context))
}

/// Every kind × tokens × depth, in that order, all with `seed`; a document kind makes one
/// document per token count (it places its own needles).
pub fn suite(
    corpus: &Corpus,
    kinds: &[Kind],
    tokens: &[usize],
    depths: &[u32],
    seed: u64,
    count_tokens: &dyn Fn(&str) -> usize,
) -> Result<Vec<Entry>> {
    let mut entries = Vec::with_capacity(kinds.len() * tokens.len() * depths.len());
    for &kind in kinds {
        for &t in tokens {
            let depths = if kind.is_document() { &[0][..] } else { depths };
            for &depth_percent in depths {
                entries.push(generate_entry(corpus, &Spec { kind, tokens: t, depth_percent, seed }, count_tokens)?);
            }
        }
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// Whitespace words plus one for a BOS: a tokenizer whose counts are easy to do by hand.
    fn words(text: &str) -> usize {
        text.split_whitespace().count() + 1
    }

    /// 600 verses of 3..=22 words, each word unique to its verse.
    fn synthetic() -> Corpus {
        let text: String = (0..600)
            .map(|i| {
                let n = 3 + (i * 7) % 20;
                let mut v: Vec<String> = (0..n).map(|j| format!("v{i}w{j}")).collect();
                v.push("end.".into());
                v.join(" ") + "\n"
            })
            .collect();
        Corpus::from_text(&text).unwrap()
    }

    fn spec(kind: Kind, tokens: usize, depth_percent: u32, seed: u64) -> Spec {
        Spec { kind, tokens, depth_percent, seed }
    }

    #[test]
    fn kind_names_round_trip() {
        let names = [
            "passkey",
            "niah-single",
            "niah-multikey",
            "niah-multivalue",
            "variable-tracking",
            "doc-niah",
            "doc-multikey",
            "doc-vt",
        ];
        assert_eq!(names.len(), Kind::ALL.len());
        for (k, n) in Kind::ALL.iter().zip(names) {
            assert_eq!(k.to_string(), n);
            assert_eq!(n.parse::<Kind>().unwrap(), *k);
        }
        let err = "niah".parse::<Kind>().unwrap_err().to_string();
        assert!(err.contains("\"niah\"") && err.contains("variable-tracking"), "{err}");
        assert_eq!(spec(Kind::NiahSingle, 4096, 50, 1).id(), "niah-single-4096-d50-s1");
        assert_eq!(spec(Kind::DocNiah, 4096, 50, 1).id(), "doc-niah-4096-s1");
        assert!(Kind::DOCUMENTS.iter().all(|k| k.is_document()) && !Kind::PROMPTS.iter().any(|k| k.is_document()));
    }

    const PASSKEY_PREAMBLE: &str = "There is an important piece of information hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you about the important information there.";

    /// Worked by hand: preamble 28 words, needle 12, question 9, BOS 1 = 50 without haystack;
    /// the verses add 2, 3 and 1 words.
    #[test]
    fn hand_computed_passkey() {
        let corpus = Corpus::from_text("Alpha beta.\nGamma delta epsilon.\nZeta.\n").unwrap();
        let needle = |v: &str| format!("The pass key is {v}. Remember it. {v} is the pass key.");
        let question = "What is the pass key? The pass key is";
        // 55 tokens: two whole verses (55), the third's one word would make 56.
        let case = generate(&corpus, &spec(Kind::Passkey, 55, 50, 3), &words).unwrap();
        let v = &case.answer;
        assert_eq!(v.len(), 7);
        assert!(v.bytes().all(|b| b.is_ascii_digit()) && !v.starts_with('0'));
        let want = format!("{PASSKEY_PREAMBLE}\nAlpha beta. {} Gamma delta epsilon.\n{question}", needle(v));
        assert_eq!(case.prompt, want);
        assert_eq!(words(&case.prompt), 55);
        assert_eq!(case.id, "passkey-55-d50-s3");
        // 54 tokens: one verse (52) and two words of the next (54); depth 50% of 2 units = 1.
        let case = generate(&corpus, &spec(Kind::Passkey, 54, 50, 3), &words).unwrap();
        let v = &case.answer;
        assert_eq!(case.prompt, format!("{PASSKEY_PREAMBLE}\nAlpha beta. {} Gamma delta\n{question}", needle(v)));
        // Depth 0 and 100: before the first verse, after the last.
        let case = generate(&corpus, &spec(Kind::Passkey, 55, 0, 3), &words).unwrap();
        let v = &case.answer;
        assert_eq!(
            case.prompt,
            format!("{PASSKEY_PREAMBLE}\n{} Alpha beta. Gamma delta epsilon.\n{question}", needle(v))
        );
        let case = generate(&corpus, &spec(Kind::Passkey, 55, 100, 3), &words).unwrap();
        let v = &case.answer;
        assert_eq!(
            case.prompt,
            format!("{PASSKEY_PREAMBLE}\nAlpha beta. Gamma delta epsilon. {}\n{question}", needle(v))
        );
    }

    #[test]
    fn bad_specs_are_errors() {
        let corpus = Corpus::from_text("Alpha beta.\nGamma delta epsilon.\nZeta.\n").unwrap();
        assert!(matches!(generate(&corpus, &spec(Kind::Passkey, 55, 101, 1), &words), Err(EvalError::Spec { .. })));
        assert!(matches!(generate(&corpus, &spec(Kind::Passkey, 0, 50, 1), &words), Err(EvalError::Spec { .. })));
        match generate(&corpus, &spec(Kind::Passkey, 49, 50, 1), &words) {
            Err(EvalError::TooFewTokens { needed: 50, tokens: 49, .. }) => {}
            other => panic!("{other:?}"),
        }
        // All three verses give 56 tokens, far below 99% of 1000.
        assert!(matches!(
            generate(&corpus, &spec(Kind::Passkey, 1000, 50, 1), &words),
            Err(EvalError::CorpusTooSmall { verses: 3, tokens: 1000 })
        ));
    }

    #[test]
    fn sizes_within_one_percent_with_few_tokenizer_calls() {
        let corpus = synthetic();
        for kind in Kind::PROMPTS {
            for tokens in [300, 2048, 5000] {
                let calls = Cell::new(0usize);
                let count = |t: &str| {
                    calls.set(calls.get() + 1);
                    words(t)
                };
                let case = generate(&corpus, &spec(kind, tokens, 25, 7), &count).unwrap();
                let got = words(&case.prompt);
                assert!(got <= tokens && got * 100 >= tokens * 99, "{kind} {tokens}: {got}");
                // 1 + ceil(log2(max_n + 1)) + ceil(log2(23 + 1)).
                let bound = 1 + (usize::BITS - tokens.min(600).leading_zeros()) as usize + 5;
                assert!(calls.get() <= bound, "{kind} {tokens}: {} calls > {bound}", calls.get());
                let needle = case.answer.split(", ").next().unwrap();
                assert!(case.prompt.contains(needle));
            }
        }
    }

    #[test]
    fn same_seed_same_case_other_seed_other_case() {
        let corpus = synthetic();
        for kind in Kind::PROMPTS {
            let a = generate(&corpus, &spec(kind, 1000, 50, 11), &words).unwrap();
            let b = generate(&corpus, &spec(kind, 1000, 50, 11), &words).unwrap();
            let c = generate(&corpus, &spec(kind, 1000, 50, 12), &words).unwrap();
            assert_eq!(a, b);
            assert_ne!(a.prompt, c.prompt);
            assert_ne!(a.answer, c.answer);
        }
    }

    /// Share of the haystack's words before `needle`.
    fn relative_depth(case: &Case, needle: &str) -> f64 {
        let body = case.prompt.split('\n').nth(1).unwrap();
        let at = body.find(needle).unwrap();
        let before = body[..at].split_whitespace().filter(|w| w.starts_with('v')).count();
        let total = body.split_whitespace().filter(|w| w.starts_with('v')).count();
        before as f64 / total as f64
    }

    #[test]
    fn the_asked_needle_sits_at_its_depth() {
        let corpus = synthetic();
        for depth in [0, 10, 25, 50, 75, 100] {
            let case = generate(&corpus, &spec(Kind::NiahSingle, 3000, depth, 1), &words).unwrap();
            let needle = format!("is: {}.", case.answer);
            assert_eq!(case.prompt.matches(&needle).count(), 1);
            let got = relative_depth(&case, &needle);
            // Within one verse (at most 23 of ~2900 words).
            assert!((got - f64::from(depth) / 100.0).abs() < 0.01, "depth {depth}: {got}");
            let key = case.prompt.split("special magic number for ").nth(1).unwrap().split(' ').next().unwrap();
            assert!(case.prompt.ends_with(&format!(
                "What is the special magic number for {key} mentioned in the provided text? The special magic number for {key} mentioned in the provided text is"
            )));
            assert!(case.prompt.contains(&format!("One of the special magic numbers for {key} is: {}.", case.answer)));
        }
    }

    fn numbers_for(prompt: &str, key: &str) -> Vec<String> {
        let pat = format!("One of the special magic numbers for {key} is: ");
        prompt.split(&pat).skip(1).map(|rest| rest[..7].to_string()).collect()
    }

    #[test]
    fn multikey_has_four_keys_and_asks_one() {
        let case = generate(&synthetic(), &spec(Kind::NiahMultiKey, 2000, 75, 2), &words).unwrap();
        let keys: Vec<&str> = case
            .prompt
            .split("One of the special magic numbers for ")
            .skip(1)
            .map(|r| r.split(' ').next().unwrap())
            .collect();
        assert_eq!(keys.len(), 4);
        let mut distinct = keys.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 4);
        let asked = case.prompt.rsplit("special magic number for ").next().unwrap().split(' ').next().unwrap();
        assert_eq!(numbers_for(&case.prompt, asked), vec![case.answer.clone()]);
        assert_eq!(case.prompt.matches(&case.answer).count(), 1);
    }

    #[test]
    fn multivalue_answer_lists_the_values_in_order() {
        let case = generate(&synthetic(), &spec(Kind::NiahMultiValue, 2000, 25, 4), &words).unwrap();
        let key = case.prompt.rsplit("special magic numbers for ").next().unwrap().split(' ').next().unwrap();
        let values = numbers_for(&case.prompt, key);
        assert_eq!(values.len(), 4);
        assert_eq!(case.answer, values.join(", "));
        assert!((relative_depth(&case, &values[0]) - 0.25).abs() < 0.01);
        assert!(
            case.prompt.ends_with(&format!("The special magic numbers for {key} mentioned in the provided text are"))
        );
    }

    #[test]
    fn variable_tracking_answer_follows_the_chain() {
        for seed in 1..6 {
            let case = generate(&synthetic(), &spec(Kind::VariableTracking, 1500, 50, seed), &words).unwrap();
            // Resolve by reading the statements `VAR NAME = VAR NAME.` / `VAR NAME = 1234567.` back.
            let mut assign = std::collections::HashMap::new();
            for (at, _) in case.prompt.match_indices("VAR ") {
                let rest = &case.prompt[at + 4..];
                if let Some(rhs) = rest.get(5..).and_then(|r| r.strip_prefix(" = ")) {
                    let value = rhs.strip_prefix("VAR ").unwrap_or(rhs);
                    let end = value.find('.').unwrap();
                    assign.insert(rest[..5].to_string(), value[..end].to_string());
                }
            }
            assert_eq!(assign.len(), 10);
            let asked = case.prompt.rsplit("what number is VAR ").next().unwrap().split(' ').next().unwrap();
            let (mut cur, mut hops) = (asked.to_string(), 0);
            while let Some(next) = assign.get(&cur) {
                if next.len() == 7 && next.bytes().all(|b| b.is_ascii_digit()) {
                    cur = next.clone();
                    break;
                }
                cur = next.clone();
                hops += 1;
            }
            assert_eq!((cur.as_str(), hops), (case.answer.as_str(), 4), "seed {seed}");
            // Two chains: ten variables, two values.
            assert_eq!(case.prompt.matches(" = VAR ").count(), 8);
        }
    }

    #[test]
    fn suite_order_and_ids() {
        let cases = suite(&synthetic(), &[Kind::Passkey, Kind::NiahSingle], &[400, 800], &[25, 75], 1, &words).unwrap();
        let ids: Vec<&str> = cases.iter().map(Entry::id).collect();
        assert_eq!(
            ids,
            [
                "passkey-400-d25-s1",
                "passkey-400-d75-s1",
                "passkey-800-d25-s1",
                "passkey-800-d75-s1",
                "niah-single-400-d25-s1",
                "niah-single-400-d75-s1",
                "niah-single-800-d25-s1",
                "niah-single-800-d75-s1"
            ]
        );
    }

    #[test]
    fn suites_make_one_document_per_length() {
        let entries = suite(&synthetic(), &[Kind::DocNiah, Kind::Passkey], &[900], &[25, 75], 1, &words).unwrap();
        let ids: Vec<&str> = entries.iter().map(Entry::id).collect();
        assert_eq!(ids, ["doc-niah-900-s1", "passkey-900-d25-s1", "passkey-900-d75-s1"]);
        assert!(matches!(entries[0], Entry::Document(_)) && matches!(entries[1], Entry::Prompt(_)));
        assert!(matches!(
            generate(&synthetic(), &spec(Kind::DocVariableTracking, 900, 0, 1), &words),
            Err(EvalError::Spec { .. })
        ));
        assert!(matches!(
            generate_document(&synthetic(), &spec(Kind::Passkey, 900, 0, 1), &words),
            Err(EvalError::Spec { .. })
        ));
    }

    /// (phrasing, value) of every needle for `key`, read back with the four phrasings written out.
    fn planted(text: &str, key: &str) -> Vec<(usize, String)> {
        let digits = |s: &str| s.len() == 7 && s.bytes().all(|b| b.is_ascii_digit());
        let mut found = Vec::new();
        for (i, prefix) in [
            format!("One of the special magic numbers for {key} is: "),
            format!("The special magic number for {key} is "),
        ]
        .iter()
        .enumerate()
        {
            for (at, _) in text.match_indices(prefix.as_str()) {
                let v = &text[at + prefix.len()..at + prefix.len() + 7];
                assert!(digits(v) && text[at + prefix.len() + 7..].starts_with('.'));
                found.push((i, v.to_string()));
            }
        }
        for (i, suffix) in
            [" is the special magic number for ", ": it is the special magic number for "].iter().enumerate()
        {
            for (at, _) in text.match_indices(&format!("{suffix}{key}.")) {
                if i == 0 && text[..at].ends_with(": it") {
                    continue; // the other value-first phrasing
                }
                let v = &text[at - 7..at];
                assert!(digits(v));
                assert_eq!(text[..at - 7].ends_with("Remember "), i == 1);
                found.push((i + 2, v.to_string()));
            }
        }
        found
    }

    #[test]
    fn doc_niah_asks_about_every_needle_in_every_phrasing() {
        let mut phrasings = [0usize; 4];
        for seed in 1..9 {
            let d = generate_document(&synthetic(), &spec(Kind::DocNiah, 2500, 0, seed), &words).unwrap();
            assert_eq!(d.id, format!("doc-niah-2500-s{seed}"));
            assert_eq!(d.questions.len(), 6);
            assert!(d.context.starts_with(NIAH_PREAMBLE) && !d.context.contains("What is"));
            let mut keys = Vec::new();
            for q in &d.questions {
                let key = q.question.split("magic number for ").nth(1).unwrap().split(' ').next().unwrap();
                assert_eq!(q.question, niah_question_one(key));
                // Exactly one needle for the key, holding the asked answer.
                let found = planted(&d.context, key);
                assert_eq!(found.len(), 1, "seed {seed} key {key}: {found:?}");
                assert_eq!(found[0].1, q.answer);
                phrasings[found[0].0] += 1;
                keys.push(key.to_string());
            }
            keys.sort();
            keys.dedup();
            assert_eq!(keys.len(), 6);
            // Stratified: needle i in the i-th sixth of the haystack's words.
            let body = d.context.split('\n').nth(1).unwrap();
            let total = body.split_whitespace().filter(|w| w.starts_with('v')).count() as f64;
            let mut depths: Vec<f64> = d
                .questions
                .iter()
                .map(|q| {
                    let at = body.find(&q.answer).unwrap();
                    body[..at].split_whitespace().filter(|w| w.starts_with('v')).count() as f64 / total
                })
                .collect();
            depths.sort_by(f64::total_cmp);
            for (i, depth) in depths.iter().enumerate() {
                let (lo, hi) = ((i as f64 + 0.1) / 6.0, (i as f64 + 0.9) / 6.0);
                assert!(*depth >= lo - 0.01 && *depth <= hi + 0.01, "seed {seed}: needle {i} at {depth}");
            }
            // Every question's prompt fits, the longest within 1%.
            let counts: Vec<usize> = (0..6).map(|i| words(&d.prompt(i))).collect();
            assert!(counts.iter().all(|&c| c <= 2500), "{counts:?}");
            assert!(counts.iter().max().unwrap() * 100 >= 2500 * 99, "{counts:?}");
        }
        assert!(phrasings.iter().all(|&n| n > 0), "every phrasing used across seeds: {phrasings:?}");
    }

    #[test]
    fn doc_multikey_plants_two_keys_first_and_asks_each() {
        for seed in 1..9 {
            let d = generate_document(&synthetic(), &spec(Kind::DocMultiKey, 1800, 0, seed), &words).unwrap();
            assert_eq!(d.id, format!("doc-multikey-1800-s{seed}"));
            assert_eq!(d.questions.len(), 2);
            let body = d.context.split('\n').nth(1).unwrap();
            let total = body.split_whitespace().filter(|w| w.starts_with('v')).count() as f64;
            let mut depths = Vec::new();
            for q in &d.questions {
                let key = q.question.split("magic number for ").nth(1).unwrap().split(' ').next().unwrap();
                // One needle per key, in the phrasing "The special magic number for KEY is VALUE."
                assert_eq!(planted(&d.context, key), vec![(1, q.answer.clone())], "seed {seed} key {key}");
                let needle = format!("The special magic number for {key} is {}.", q.answer);
                let at = body.find(&needle).unwrap();
                depths.push(body[..at].split_whitespace().filter(|w| w.starts_with('v')).count() as f64 / total);
            }
            depths.sort_by(f64::total_cmp);
            for (i, depth) in depths.iter().enumerate() {
                let (lo, hi) = ((i as f64 + 0.1) / 2.0, (i as f64 + 0.9) / 2.0);
                assert!(*depth >= lo - 0.01 && *depth <= hi + 0.01, "seed {seed}: needle {i} at {depth}");
            }
            let counts: Vec<usize> = (0..2).map(|i| words(&d.prompt(i))).collect();
            assert!(counts.iter().all(|&c| c <= 1800) && counts.iter().max().unwrap() * 100 >= 1800 * 99, "{counts:?}");
        }
    }

    #[test]
    fn doc_vt_asks_about_every_chain() {
        for seed in 1..6 {
            let d = generate_document(&synthetic(), &spec(Kind::DocVariableTracking, 1500, 0, seed), &words).unwrap();
            let mut assign = std::collections::HashMap::new();
            for (at, _) in d.context.match_indices("VAR ") {
                let rest = &d.context[at + 4..];
                if let Some(rhs) = rest.get(5..).and_then(|r| r.strip_prefix(" = ")) {
                    let value = rhs.strip_prefix("VAR ").unwrap_or(rhs);
                    let end = value.find('.').unwrap();
                    assign.insert(rest[..5].to_string(), value[..end].to_string());
                }
            }
            assert_eq!(assign.len(), 15);
            assert_eq!(d.questions.len(), 3);
            let mut answers = Vec::new();
            for q in &d.questions {
                let asked = q.question.rsplit("what number is VAR ").next().unwrap().split(' ').next().unwrap();
                let (mut cur, mut hops) = (asked.to_string(), 0);
                while let Some(next) = assign.get(&cur) {
                    cur = next.clone();
                    if next.bytes().all(|b| b.is_ascii_digit()) {
                        break;
                    }
                    hops += 1;
                }
                assert_eq!((cur.as_str(), hops), (q.answer.as_str(), 4), "seed {seed}");
                answers.push(q.answer.clone());
            }
            answers.sort();
            answers.dedup();
            assert_eq!(answers.len(), 3);
            assert!((0..3).all(|i| words(&d.prompt(i)) <= 1500));
        }
    }
}
