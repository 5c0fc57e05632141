//! The cases file: JSON Lines, one `{"id", "prompt", "answer"}` object per line.
//!
//! Blank lines are skipped. A line that is not such an object, a missing or empty field, or an
//! id seen before is an error naming the 1-based line; a file with no case is an error too.

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

/// The raw line, with every field optional so a missing one gets its own message.
#[derive(Deserialize)]
struct RawCase {
    id: Option<String>,
    prompt: Option<String>,
    answer: Option<String>,
}

/// Parses a cases file's text.
pub fn parse_cases(text: &str) -> Result<Vec<Case>> {
    let mut cases = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let bad = |reason: String| EvalError::CaseLine { line: line_no, reason };
        let raw: RawCase = serde_json::from_str(line).map_err(|e| bad(format!("not a case object: {e}")))?;
        let field = |value: Option<String>, name: &str| match value {
            None => Err(bad(format!("missing field {name:?}"))),
            Some(v) if v.trim().is_empty() => Err(bad(format!("empty field {name:?}"))),
            Some(v) => Ok(v),
        };
        let case = Case {
            id: field(raw.id, "id")?,
            prompt: field(raw.prompt, "prompt")?,
            answer: field(raw.answer, "answer")?,
        };
        if let Some(&first_line) = seen.get(&case.id) {
            return Err(EvalError::DuplicateId { line: line_no, id: case.id, first_line });
        }
        seen.insert(case.id.clone(), line_no);
        cases.push(case);
    }
    if cases.is_empty() {
        return Err(EvalError::NoCases);
    }
    Ok(cases)
}

/// Reads and parses a cases file.
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
        assert_eq!((line, reason.as_str()), (2, "missing field \"prompt\""));
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
