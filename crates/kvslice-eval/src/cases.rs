//! The cases file: JSON Lines, one case per line, in either of two forms:
//!
//! - a **prompt** `{"id", "prompt", "answer"}`: the whole prompt (context, question and answer
//!   prefix) is prefilled and compressed together — the question is known when the cache is
//!   compressed (query-aware);
//! - a **document** `{"id", "context", "questions": [{"question", "answer"}, …]}`: the context is
//!   prefilled and compressed alone, then each question (the text that follows the context, on
//!   its own line) is fed into a copy of the compressed cache and answered — the questions are
//!   not known when the cache is compressed (query-agnostic).
//!
//! Blank lines are skipped. A line that is neither form, a missing or empty field, a document
//! without questions, or an id seen before is an error naming the 1-based line; a file with no
//! case is an error too.

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{EvalError, Result, io_err};

/// One retrieval case: the prompt is fed as plain text; the case passes when `answer` occurs in
/// the model's output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Case {
    pub id: String,
    pub prompt: String,
    pub answer: String,
}

/// One question about a [`Document`]; it passes when `answer` occurs in the model's output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Question {
    pub question: String,
    pub answer: String,
}

/// A context compressed once and asked several questions: question `i` is answered after the
/// text `context + "\n" + question`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Document {
    pub id: String,
    pub context: String,
    pub questions: Vec<Question>,
}

impl Document {
    /// The text the model reads before answering question `i` (0-based).
    pub fn prompt(&self, i: usize) -> String {
        format!("{}\n{}", self.context, self.questions[i].question)
    }

    /// The report's id of question `i` (0-based): `{id}/q{i + 1}`.
    pub fn question_id(&self, i: usize) -> String {
        format!("{}/q{}", self.id, i + 1)
    }
}

/// A line of a cases file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Entry {
    Prompt(Case),
    Document(Document),
}

impl Entry {
    pub fn id(&self) -> &str {
        match self {
            Entry::Prompt(c) => &c.id,
            Entry::Document(d) => &d.id,
        }
    }

    /// The id, to rename (e.g. [`tag_ids`]).
    pub fn id_mut(&mut self) -> &mut String {
        match self {
            Entry::Prompt(c) => &mut c.id,
            Entry::Document(d) => &mut d.id,
        }
    }

    /// The number of questions it asks (1 for a prompt).
    pub fn questions(&self) -> usize {
        match self {
            Entry::Prompt(_) => 1,
            Entry::Document(d) => d.questions.len(),
        }
    }
}

/// Appends `-{tag}` to every id (suites generated over different corpora share ids otherwise).
pub fn tag_ids(entries: &mut [Entry], tag: &str) {
    for entry in entries {
        let id = entry.id_mut();
        id.push('-');
        id.push_str(tag);
    }
}

/// The raw line, with every field optional so a missing one gets its own message.
#[derive(Deserialize)]
struct RawCase {
    id: Option<String>,
    prompt: Option<String>,
    answer: Option<String>,
    context: Option<String>,
    questions: Option<Vec<RawQuestion>>,
}

#[derive(Deserialize)]
struct RawQuestion {
    question: Option<String>,
    answer: Option<String>,
}

/// A required, non-blank string field.
fn field(value: Option<String>, name: &str) -> std::result::Result<String, String> {
    match value {
        None => Err(format!("missing field {name:?}")),
        Some(v) if v.trim().is_empty() => Err(format!("empty field {name:?}")),
        Some(v) => Ok(v),
    }
}

fn entry(raw: RawCase) -> std::result::Result<Entry, String> {
    let id = field(raw.id, "id")?;
    match (raw.prompt, raw.context) {
        (Some(_), Some(_)) => Err("both \"prompt\" and \"context\": a case is one form or the other".into()),
        (Some(prompt), None) => {
            if raw.questions.is_some() {
                return Err("\"questions\" belong with a \"context\", not a \"prompt\"".into());
            }
            Ok(Entry::Prompt(Case { id, prompt: field(Some(prompt), "prompt")?, answer: field(raw.answer, "answer")? }))
        }
        (None, Some(context)) => {
            if raw.answer.is_some() {
                return Err("a document's answers go with its questions, not at the top level".into());
            }
            let context = field(Some(context), "context")?;
            let raw_questions = raw.questions.ok_or("missing field \"questions\"")?;
            if raw_questions.is_empty() {
                return Err("a document needs at least one question".into());
            }
            let questions = raw_questions
                .into_iter()
                .enumerate()
                .map(|(i, q)| {
                    let at = |e: String| format!("question {}: {e}", i + 1);
                    Ok(Question {
                        question: field(q.question, "question").map_err(at)?,
                        answer: field(q.answer, "answer").map_err(at)?,
                    })
                })
                .collect::<std::result::Result<Vec<_>, String>>()?;
            Ok(Entry::Document(Document { id, context, questions }))
        }
        (None, None) => Err("missing field \"prompt\" (or \"context\" with \"questions\")".into()),
    }
}

/// Parses a cases file's text, in either form.
pub fn parse_entries(text: &str) -> Result<Vec<Entry>> {
    let mut entries = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let bad = |reason: String| EvalError::CaseLine { line: line_no, reason };
        let raw: RawCase = serde_json::from_str(line).map_err(|e| bad(format!("not a case object: {e}")))?;
        let entry = entry(raw).map_err(bad)?;
        if let Some(&first_line) = seen.get(entry.id()) {
            return Err(EvalError::DuplicateId { line: line_no, id: entry.id().to_string(), first_line });
        }
        seen.insert(entry.id().to_string(), line_no);
        entries.push(entry);
    }
    if entries.is_empty() {
        return Err(EvalError::NoCases);
    }
    Ok(entries)
}

/// Reads and parses a cases file, in either form.
pub fn read_entries(path: &Path) -> Result<Vec<Entry>> {
    let text = std::fs::read_to_string(path).map_err(io_err(path))?;
    parse_entries(&text)
}

/// Parses a cases file's text that holds prompts only (a document line is an error).
pub fn parse_cases(text: &str) -> Result<Vec<Case>> {
    let entries = parse_entries(text)?;
    let mut cases = Vec::with_capacity(entries.len());
    for (line, entry) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()).zip(entries) {
        match entry {
            Entry::Prompt(c) => cases.push(c),
            Entry::Document(_) => {
                return Err(EvalError::CaseLine {
                    line: line.0 + 1,
                    reason: "a document (\"context\"); only prompt cases are accepted here".into(),
                });
            }
        }
    }
    Ok(cases)
}

/// Reads and parses a cases file of prompts only.
pub fn read_cases(path: &Path) -> Result<Vec<Case>> {
    let text = std::fs::read_to_string(path).map_err(io_err(path))?;
    parse_cases(&text)
}

/// The JSON Lines text of `cases`, one object per line, each line ending in `\n`.
pub fn cases_to_jsonl(cases: &[Case]) -> Result<String> {
    let mut out = String::new();
    for c in cases {
        out.push_str(&serde_json::to_string(c)?);
        out.push('\n');
    }
    Ok(out)
}

/// The JSON Lines text of `entries`, one object per line, each line ending in `\n`.
pub fn entries_to_jsonl(entries: &[Entry]) -> Result<String> {
    let mut out = String::new();
    for e in entries {
        out.push_str(&serde_json::to_string(e)?);
        out.push('\n');
    }
    Ok(out)
}

/// Writes `cases` as JSON Lines to any writer.
pub fn write_cases(cases: &[Case], mut out: impl std::io::Write) -> Result<()> {
    let text = cases_to_jsonl(cases)?;
    out.write_all(text.as_bytes())
        .and_then(|_| out.flush())
        .map_err(|source| EvalError::Io { path: "<output>".into(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(id: &str, prompt: &str, answer: &str) -> Case {
        Case { id: id.into(), prompt: prompt.into(), answer: answer.into() }
    }

    #[test]
    fn parses_lines_and_skips_blanks() {
        let text = "{\"id\":\"a\",\"prompt\":\"P \\\"q\\\"\\nx\",\"answer\":\"1234567\"}\n\n   \n{\"answer\":\"9\",\"prompt\":\"Q\",\"id\":\"b\",\"extra\":1}\n";
        let cases = parse_cases(text).unwrap();
        assert_eq!(cases, vec![case("a", "P \"q\"\nx", "1234567"), case("b", "Q", "9")]);
    }

    #[test]
    fn round_trips_through_jsonl() {
        let cases = vec![case("x-1", "line one\nline \"two\" é", "42"), case("x-2", "p", "a")];
        let text = cases_to_jsonl(&cases).unwrap();
        assert_eq!(text.lines().count(), 2);
        assert!(text.ends_with('\n'));
        assert_eq!(parse_cases(&text).unwrap(), cases);
        let mut buf = Vec::new();
        write_cases(&cases, &mut buf).unwrap();
        assert_eq!(String::from_utf8(buf).unwrap(), text);
    }

    fn line_of(err: EvalError) -> (usize, String) {
        match err {
            EvalError::CaseLine { line, reason } => (line, reason),
            other => panic!("expected a line error, got {other:?}"),
        }
    }

    #[test]
    fn malformed_json_names_its_line() {
        let text = "{\"id\":\"a\",\"prompt\":\"p\",\"answer\":\"1\"}\n\n{\"id\":\"b\",\"prompt\":\n";
        let (line, reason) = line_of(parse_cases(text).unwrap_err());
        assert_eq!(line, 3);
        assert!(reason.contains("not a case object"), "{reason}");
        let (line, _) = line_of(parse_cases("[1,2]\n").unwrap_err());
        assert_eq!(line, 1);
        let (line, _) = line_of(parse_cases("{\"id\":1,\"prompt\":\"p\",\"answer\":\"a\"}").unwrap_err());
        assert_eq!(line, 1);
    }

    #[test]
    fn missing_or_empty_fields_are_errors() {
        let (line, reason) = line_of(parse_cases("\n{\"id\":\"a\",\"answer\":\"1\"}").unwrap_err());
        assert_eq!((line, reason.as_str()), (2, "missing field \"prompt\" (or \"context\" with \"questions\")"));
        let (line, reason) = line_of(parse_cases("{\"id\":\"a\",\"prompt\":\"p\",\"answer\":\"  \"}").unwrap_err());
        assert_eq!((line, reason.as_str()), (1, "empty field \"answer\""));
        let (_, reason) = line_of(parse_cases("{\"id\":\"\",\"prompt\":\"p\",\"answer\":\"1\"}").unwrap_err());
        assert_eq!(reason, "empty field \"id\"");
    }

    #[test]
    fn duplicate_id_names_both_lines() {
        let text = "{\"id\":\"a\",\"prompt\":\"p\",\"answer\":\"1\"}\n{\"id\":\"b\",\"prompt\":\"p\",\"answer\":\"1\"}\n\n{\"id\":\"a\",\"prompt\":\"q\",\"answer\":\"2\"}\n";
        match parse_cases(text).unwrap_err() {
            EvalError::DuplicateId { line, id, first_line } => assert_eq!((line, id.as_str(), first_line), (4, "a", 1)),
            other => panic!("{other:?}"),
        }
    }

    fn doc(id: &str, context: &str, qa: &[(&str, &str)]) -> Entry {
        Entry::Document(Document {
            id: id.into(),
            context: context.into(),
            questions: qa.iter().map(|(q, a)| Question { question: (*q).into(), answer: (*a).into() }).collect(),
        })
    }

    #[test]
    fn parses_documents_beside_prompts() {
        let text = concat!(
            "{\"id\":\"p\",\"prompt\":\"P\",\"answer\":\"1\"}\n",
            "{\"id\":\"d\",\"context\":\"Some text.\",\"questions\":[{\"question\":\"Q1?\",\"answer\":\"11\"},",
            "{\"answer\":\"22\",\"question\":\"Q2?\"}]}\n"
        );
        let entries = parse_entries(text).unwrap();
        assert_eq!(
            entries,
            vec![Entry::Prompt(case("p", "P", "1")), doc("d", "Some text.", &[("Q1?", "11"), ("Q2?", "22")])]
        );
        assert_eq!(entries.iter().map(Entry::questions).collect::<Vec<_>>(), [1, 2]);
        let Entry::Document(d) = &entries[1] else { unreachable!() };
        assert_eq!(d.prompt(1), "Some text.\nQ2?");
        assert_eq!(d.question_id(0), "d/q1");
        // Round trip: each form written back as its own fields.
        let jsonl = entries_to_jsonl(&entries).unwrap();
        assert_eq!(
            jsonl.lines().nth(1).unwrap(),
            "{\"id\":\"d\",\"context\":\"Some text.\",\"questions\":[{\"question\":\"Q1?\",\"answer\":\"11\"},{\"question\":\"Q2?\",\"answer\":\"22\"}]}"
        );
        assert_eq!(parse_entries(&jsonl).unwrap(), entries);
        // A prompt-only reader refuses the document and names its line (blank lines counted).
        let (line, reason) = line_of(parse_cases(&format!("\n{text}")).unwrap_err());
        assert_eq!(line, 3);
        assert!(reason.contains("document"), "{reason}");
    }

    #[test]
    fn malformed_documents_are_errors() {
        let err = |text: &str| line_of(parse_entries(text).unwrap_err()).1;
        assert_eq!(err("{\"id\":\"d\",\"context\":\"c\"}"), "missing field \"questions\"");
        assert_eq!(err("{\"id\":\"d\",\"context\":\"c\",\"questions\":[]}"), "a document needs at least one question");
        assert_eq!(
            err(
                "{\"id\":\"d\",\"context\":\"c\",\"questions\":[{\"question\":\"q\",\"answer\":\"1\"},{\"question\":\"q\"}]}"
            ),
            "question 2: missing field \"answer\""
        );
        assert_eq!(
            err("{\"id\":\"d\",\"context\":\"c\",\"questions\":[{\"question\":\" \",\"answer\":\"1\"}]}"),
            "question 1: empty field \"question\""
        );
        assert_eq!(
            err("{\"id\":\"d\",\"context\":\"\",\"questions\":[{\"question\":\"q\",\"answer\":\"1\"}]}"),
            "empty field \"context\""
        );
        assert!(
            err("{\"id\":\"d\",\"prompt\":\"p\",\"context\":\"c\",\"answer\":\"1\"}").contains("one form or the other")
        );
        assert!(
            err("{\"id\":\"d\",\"prompt\":\"p\",\"answer\":\"1\",\"questions\":[]}")
                .contains("belong with a \"context\"")
        );
        assert!(err("{\"id\":\"d\",\"context\":\"c\",\"answer\":\"1\",\"questions\":[{\"question\":\"q\",\"answer\":\"1\"}]}").contains("not at the top level"));
        assert!(
            err("{\"id\":\"d\",\"context\":\"c\",\"questions\":{\"question\":\"q\"}}").contains("not a case object")
        );
        // Ids are unique across both forms.
        let text = "{\"id\":\"a\",\"prompt\":\"p\",\"answer\":\"1\"}\n{\"id\":\"a\",\"context\":\"c\",\"questions\":[{\"question\":\"q\",\"answer\":\"1\"}]}\n";
        assert!(matches!(parse_entries(text).unwrap_err(), EvalError::DuplicateId { line: 2, first_line: 1, .. }));
    }

    #[test]
    fn empty_files_are_errors() {
        assert!(matches!(parse_cases("").unwrap_err(), EvalError::NoCases));
        assert!(matches!(parse_cases("\n  \n").unwrap_err(), EvalError::NoCases));
    }

    #[test]
    fn read_cases_reports_missing_files() {
        let err = read_cases(Path::new("/nonexistent/cases.jsonl")).unwrap_err();
        assert!(matches!(err, EvalError::Io { .. }));
        assert!(err.to_string().contains("/nonexistent/cases.jsonl"));
    }
}
