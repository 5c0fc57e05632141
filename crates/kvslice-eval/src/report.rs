//! The results of `kvslice eval`, in the JSON it writes with `--json` (a stable format):
//!
//! ```json
//! {"runs": {"full": {"passed": 1, "total": 2, "cases": {"id": {"pass": true, "output": "...", "prompt_tokens": 4096}}},
//!           "snapkv@10%": {...}}}
//! ```
//!
//! A run is `full` (the whole cache, always run as the baseline) or `<policy>@<budget>`. Maps are
//! ordered by key, so the same results always give the same bytes.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{EvalError, Result, io_err};

/// The run key of the full cache.
pub const FULL: &str = "full";

/// One case's result in one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaseReport {
    pub pass: bool,
    pub output: String,
    pub prompt_tokens: usize,
    /// K/V storage bytes of the compressed cache (before the question and the answer), from
    /// the real element sizes; absent for the full cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_bytes: Option<usize>,
}

/// One run: a policy at a budget, or the full cache.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunReport {
    pub passed: usize,
    pub total: usize,
    pub cases: BTreeMap<String, CaseReport>,
}

/// Every run of an evaluation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub runs: BTreeMap<String, RunReport>,
}

/// A case passes when its answer occurs in the output (an empty answer never passes).
pub fn passes(output: &str, answer: &str) -> bool {
    !answer.is_empty() && output.contains(answer)
}

/// `policy@budget`.
pub fn run_key(policy: &str, budget: &str) -> String {
    format!("{policy}@{budget}")
}

/// (policy, budget) of a `policy@budget` key; `None` for `full` or a key without `@`.
pub fn split_key(key: &str) -> Option<(&str, &str)> {
    key.split_once('@')
}

/// A budget's number and unit (`"10%"` → (10, "%"), `"128L"` → (128, "L"), `"2048"` → (2048, "")).
pub fn parse_budget(budget: &str) -> Option<(f64, &str)> {
    let end = budget.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(budget.len());
    let value: f64 = budget[..end].parse().ok()?;
    Some((value, &budget[end..]))
}

impl Report {
    /// Records one case of one run, replacing an earlier result for the same case; the run's
    /// `passed` and `total` follow its cases.
    pub fn record(&mut self, run: &str, case_id: &str, result: CaseReport) {
        let r = self.runs.entry(run.to_string()).or_default();
        r.cases.insert(case_id.to_string(), result);
        r.total = r.cases.len();
        r.passed = r.cases.values().filter(|c| c.pass).count();
    }

    /// Adds every case of `other` (its results win where both have one).
    pub fn merge(&mut self, other: Report) {
        for (run, r) in other.runs {
            if r.cases.is_empty() {
                self.runs.entry(run).or_insert(r);
                continue;
            }
            for (id, c) in r.cases {
                self.record(&run, &id, c);
            }
        }
    }

    /// Adds a shard's report (`kvslice eval --shard`): refused when both hold a result for the
    /// same case of the same run, since shards are disjoint. Merging every shard of a sweep gives
    /// the report a single run writes, byte for byte.
    pub fn merge_disjoint(&mut self, other: Report) -> Result<()> {
        for (run, r) in &other.runs {
            if let Some(mine) = self.runs.get(run)
                && let Some(id) = r.cases.keys().find(|id| mine.cases.contains_key(*id))
            {
                return Err(EvalError::Report {
                    reason: format!("case {id} of run {run} is in two reports: shards must be disjoint"),
                });
            }
        }
        self.merge(other);
        Ok(())
    }

    /// Checks that counts agree with the cases.
    pub fn validate(&self) -> Result<()> {
        for (run, r) in &self.runs {
            if r.passed > r.total {
                return Err(EvalError::Report {
                    reason: format!("run {run}: passed {} > total {}", r.passed, r.total),
                });
            }
            let passed = r.cases.values().filter(|c| c.pass).count();
            if !r.cases.is_empty() && (r.total != r.cases.len() || r.passed != passed) {
                return Err(EvalError::Report {
                    reason: format!(
                        "run {run}: counts {}/{} disagree with its {} cases ({passed} passed)",
                        r.passed,
                        r.total,
                        r.cases.len()
                    ),
                });
            }
        }
        Ok(())
    }

    /// Pretty JSON with a final newline.
    pub fn to_json(&self) -> Result<String> {
        Ok(serde_json::to_string_pretty(self)? + "\n")
    }

    /// Parses and validates a report.
    pub fn from_json(text: &str) -> Result<Self> {
        let report: Report = serde_json::from_str(text)?;
        report.validate()?;
        Ok(report)
    }

    pub fn read(path: &Path) -> Result<Self> {
        Self::from_json(&std::fs::read_to_string(path).map_err(io_err(path))?)
    }

    pub fn write(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.to_json()?).map_err(io_err(path))
    }

    /// Budgets that appear in `policy@budget` keys: by number, largest first, when they all share
    /// one unit; otherwise in key order.
    pub fn budgets(&self) -> Vec<String> {
        let mut budgets: Vec<String> = Vec::new();
        for key in self.runs.keys() {
            if let Some((_, b)) = split_key(key)
                && !budgets.iter().any(|x| x == b)
            {
                budgets.push(b.to_string());
            }
        }
        let parsed: Vec<_> = budgets.iter().map(|b| parse_budget(b)).collect();
        if let Some(Some((_, unit))) = parsed.first()
            && parsed.iter().all(|p| matches!(p, Some((_, u)) if u == unit))
        {
            budgets.sort_by(|a, b| {
                let (a, b) = (parse_budget(a).unwrap().0, parse_budget(b).unwrap().0);
                b.total_cmp(&a)
            });
        }
        budgets
    }

    /// Policies of the `policy@budget` keys, in name order.
    pub fn policies(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for key in self.runs.keys() {
            if let Some((p, _)) = split_key(key)
                && !out.iter().any(|x| x == p)
            {
                out.push(p.to_string());
            }
        }
        out
    }

    /// A text table: one row per policy, one column per budget, cells `passed/total`; the full
    /// cache's row first, its score repeated under every budget for comparison. Missing runs
    /// are `-`.
    pub fn table(&self) -> String {
        let budgets = self.budgets();
        let columns: Vec<String> = if budgets.is_empty() { vec!["score".into()] } else { budgets.clone() };
        let cell = |key: &str| self.runs.get(key).map(|r| format!("{}/{}", r.passed, r.total)).unwrap_or("-".into());
        let mut rows: Vec<(String, Vec<String>)> = Vec::new();
        if self.runs.contains_key(FULL) {
            rows.push((FULL.into(), vec![cell(FULL); columns.len()]));
        }
        for p in self.policies() {
            rows.push((p.clone(), budgets.iter().map(|b| cell(&run_key(&p, b))).collect()));
        }
        let first = rows.iter().map(|r| r.0.len()).chain(["policy".len()]).max().unwrap_or(0);
        let widths: Vec<usize> = columns
            .iter()
            .enumerate()
            .map(|(i, c)| rows.iter().map(|r| r.1[i].len()).chain([c.len()]).max().unwrap_or(0))
            .collect();
        let line = |name: &str, cells: &[String]| {
            let mut s = format!("{name:<first$}");
            for (c, w) in cells.iter().zip(&widths) {
                s.push_str(&format!("  {c:>w$}"));
            }
            s.push('\n');
            s
        };
        let mut out = line("policy", &columns);
        for (name, cells) in &rows {
            out.push_str(&line(name, cells));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(pass: bool, output: &str, tokens: usize) -> CaseReport {
        CaseReport { pass, output: output.into(), prompt_tokens: tokens, kv_bytes: None }
    }

    fn sample() -> Report {
        let mut r = Report::default();
        for (run, results) in [
            ("full", [true, true, false]),
            ("snapkv@10%", [true, false, false]),
            ("snapkv@50%", [true, true, false]),
            ("tova@10%", [false, false, false]),
            ("snapkv@5%", [false, false, false]),
            ("tova@50%", [true, true, true]),
        ] {
            for (i, pass) in results.into_iter().enumerate() {
                r.record(run, &format!("c{i}"), case(pass, "out", 100 + i));
            }
        }
        r
    }

    #[test]
    fn shard_reports_merge_into_the_single_run_report() {
        let whole = sample();
        // the shards as `eval --shard K/3` records them: every run, the cases of one slice
        let shards: Vec<Report> = (0..3)
            .map(|k| {
                let shard = crate::shard::Shard { index: k, count: 3 };
                let mut r = Report::default();
                for (run, rr) in &whole.runs {
                    for (i, (id, c)) in rr.cases.iter().enumerate() {
                        if shard.owns(i) {
                            r.record(run, id, c.clone());
                        }
                    }
                }
                r
            })
            .collect();
        let mut merged = Report::default();
        for s in shards.iter().rev() {
            merged.merge_disjoint(Report::from_json(&s.to_json().unwrap()).unwrap()).unwrap();
        }
        assert_eq!(merged.to_json().unwrap(), whole.to_json().unwrap());
        // the same shard twice is refused
        let e = merged.merge_disjoint(shards[1].clone()).unwrap_err().to_string();
        assert!(e.contains("c1") && e.contains("disjoint"), "{e}");
    }

    #[test]
    fn passes_is_substring() {
        assert!(passes(" The number is 1234567.", "1234567"));
        assert!(!passes("123456 7", "1234567"));
        assert!(!passes("anything", ""));
    }

    #[test]
    fn record_keeps_counts() {
        let mut r = Report::default();
        r.record("full", "a", case(true, "x", 5));
        r.record("full", "b", case(false, "y", 6));
        assert_eq!((r.runs["full"].passed, r.runs["full"].total), (1, 2));
        r.record("full", "b", case(true, "z", 6));
        assert_eq!((r.runs["full"].passed, r.runs["full"].total), (2, 2));
    }

    #[test]
    fn json_is_the_stable_format() {
        let mut r = Report::default();
        r.record("snapkv@10%", "b", case(false, "12", 7));
        r.record("full", "a", case(true, " 1234567.", 4096));
        let compact = serde_json::to_string(&r).unwrap();
        assert_eq!(
            compact,
            r#"{"runs":{"full":{"passed":1,"total":1,"cases":{"a":{"pass":true,"output":" 1234567.","prompt_tokens":4096}}},"snapkv@10%":{"passed":0,"total":1,"cases":{"b":{"pass":false,"output":"12","prompt_tokens":7}}}}}"#
        );
        assert_eq!(Report::from_json(&r.to_json().unwrap()).unwrap(), r);
    }

    #[test]
    fn inconsistent_reports_are_errors() {
        let bad = r#"{"runs":{"full":{"passed":2,"total":1,"cases":{}}}}"#;
        assert!(matches!(Report::from_json(bad), Err(EvalError::Report { .. })));
        let bad =
            r#"{"runs":{"full":{"passed":1,"total":1,"cases":{"a":{"pass":false,"output":"","prompt_tokens":1}}}}}"#;
        assert!(matches!(Report::from_json(bad), Err(EvalError::Report { .. })));
        assert!(matches!(Report::from_json("{\"runs\":3}"), Err(EvalError::Json(_))));
    }

    #[test]
    fn budgets_sort_by_number() {
        assert_eq!(sample().budgets(), vec!["50%", "10%", "5%"]);
        let mut mixed = Report::default();
        mixed.record("a@128L", "c", case(true, "", 1));
        mixed.record("a@10%", "c", case(true, "", 1));
        assert_eq!(mixed.budgets(), vec!["10%", "128L"]);
        assert_eq!(parse_budget("12.5%"), Some((12.5, "%")));
        assert_eq!(parse_budget("2048"), Some((2048.0, "")));
        assert_eq!(parse_budget("L"), None);
    }

    #[test]
    fn table_by_hand() {
        let want = "\
policy  50%  10%   5%
full    2/3  2/3  2/3
snapkv  2/3  1/3  0/3
tova    3/3  0/3    -
";
        assert_eq!(sample().table(), want);
        let mut only_full = Report::default();
        only_full.record("full", "a", case(true, "", 1));
        assert_eq!(only_full.table(), "policy  score\nfull      1/1\n");
    }

    #[test]
    fn merge_adds_runs_and_replaces_cases() {
        let mut a = Report::default();
        a.record("full", "x", case(false, "", 1));
        a.record("full", "y", case(true, "", 1));
        let mut b = Report::default();
        b.record("full", "x", case(true, "", 1));
        b.record("h2o@5%", "x", case(true, "", 1));
        a.merge(b);
        assert_eq!((a.runs["full"].passed, a.runs["full"].total), (2, 2));
        assert_eq!((a.runs["h2o@5%"].passed, a.runs["h2o@5%"].total), (1, 1));
        a.validate().unwrap();
    }
}
