//! File-system helpers (native targets only): open a `.gguf` file or an HF folder.

use std::path::{Path, PathBuf};

use crate::config::ModelConfig;
use crate::error::{FormatError, Result};
use crate::gguf::GgufFile;
use crate::tokenizer::{HfTokenizerFiles, Tokenizer};
use crate::weights::{GgufWeights, SafetensorsWeights, WeightSource, safetensors_index_files};

/// Which kind of files a model came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFormat {
    Gguf,
    HfFolder,
}

/// Weights, configuration and tokenizer of one model.
pub struct LoadedModel {
    pub format: ModelFormat,
    pub weights: Box<dyn WeightSource + Send + Sync>,
    pub tokenizer: Tokenizer,
}

impl LoadedModel {
    pub fn config(&self) -> &ModelConfig {
        self.weights.config()
    }
}

impl std::fmt::Debug for LoadedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedModel").field("format", &self.format).field("config", self.config()).finish()
    }
}

/// Read a whole file.
pub fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| FormatError::Io { path: path.display().to_string(), source })
}

/// Read and parse a GGUF file.
pub fn read_gguf(path: &Path) -> Result<GgufFile<Vec<u8>>> {
    GgufFile::parse(read(path)?)
}

/// Open a model: a `.gguf` file (tokenizer from its metadata) or an HF folder with
/// `config.json`, `tokenizer.json` and `model.safetensors` or
/// `model.safetensors.index.json` plus its shards.
pub fn open_model(path: &Path) -> Result<LoadedModel> {
    if path.is_dir() { open_hf_folder(path) } else { open_gguf(path) }
}

/// Open only the weights (and configuration) of a `.gguf` file or an HF folder; no
/// tokenizer is needed.
pub fn open_weights(path: &Path) -> Result<Box<dyn WeightSource + Send + Sync>> {
    if path.is_dir() {
        let (config, shards) = read_hf_weights(path)?;
        Ok(Box::new(SafetensorsWeights::new(config, shards)?))
    } else if path.is_file() {
        Ok(Box::new(GgufWeights::new(read(path)?)?))
    } else {
        Err(FormatError::MissingFiles { files: vec![path.display().to_string()] })
    }
}

/// A safetensors file: its name and bytes.
type Shard = (String, Vec<u8>);

/// config.json and the safetensors shards of an HF folder, checking that all exist.
fn read_hf_weights(dir: &Path) -> Result<(ModelConfig, Vec<Shard>)> {
    let (config, shards, missing) = hf_files(dir)?;
    if !missing.is_empty() {
        return Err(FormatError::MissingFiles { files: missing });
    }
    let config = ModelConfig::from_hf_json(&read(&config)?)?;
    let shards = shards.iter().map(|s| Ok((s.clone(), read(&dir.join(s))?))).collect::<Result<Vec<_>>>()?;
    Ok((config, shards))
}

/// (config.json path, shard names, missing files).
fn hf_files(dir: &Path) -> Result<(PathBuf, Vec<String>, Vec<String>)> {
    let p = |name: &str| dir.join(name);
    let name = |p: &PathBuf| p.display().to_string();
    let mut missing = Vec::new();
    if !p("config.json").is_file() {
        missing.push(name(&p("config.json")));
    }
    let index = p("model.safetensors.index.json");
    let shard_names = if index.is_file() {
        safetensors_index_files(&read(&index)?)?
    } else if p("model.safetensors").is_file() {
        vec!["model.safetensors".to_string()]
    } else {
        missing.push(format!("{} (or {})", name(&p("model.safetensors")), name(&index)));
        vec![]
    };
    for s in &shard_names {
        if !p(s).is_file() {
            missing.push(name(&p(s)));
        }
    }
    Ok((p("config.json"), shard_names, missing))
}

/// Open a `.gguf` model file.
pub fn open_gguf(path: &Path) -> Result<LoadedModel> {
    if !path.is_file() {
        return Err(FormatError::MissingFiles { files: vec![path.display().to_string()] });
    }
    let weights = GgufWeights::new(read(path)?)?;
    let tokenizer = Tokenizer::from_gguf(weights.file())?;
    Ok(LoadedModel { format: ModelFormat::Gguf, weights: Box::new(weights), tokenizer })
}

/// Open an HF folder.
pub fn open_hf_folder(dir: &Path) -> Result<LoadedModel> {
    let (_, _, mut missing) = hf_files(dir)?;
    if !dir.join("tokenizer.json").is_file() {
        // After config.json, before the weights.
        let at = usize::from(!dir.join("config.json").is_file());
        missing.insert(at, dir.join("tokenizer.json").display().to_string());
    }
    if !missing.is_empty() {
        return Err(FormatError::MissingFiles { files: missing });
    }
    let (config, shards) = read_hf_weights(dir)?;
    let weights = SafetensorsWeights::new(config, shards)?;

    let p = |name: &str| dir.join(name);
    let tokenizer_json = read(&p("tokenizer.json"))?;
    let tokenizer_config = p("tokenizer_config.json");
    let tokenizer_config = if tokenizer_config.is_file() { Some(read(&tokenizer_config)?) } else { None };
    let jinja = p("chat_template.jinja");
    let jinja = if jinja.is_file() {
        Some(
            String::from_utf8(read(&jinja)?)
                .map_err(|_| FormatError::InvalidUtf8 { what: "chat_template.jinja", offset: 0 })?,
        )
    } else {
        None
    };
    let tokenizer = Tokenizer::from_hf(HfTokenizerFiles {
        tokenizer_json: &tokenizer_json,
        tokenizer_config_json: tokenizer_config.as_deref(),
        chat_template_jinja: jinja.as_deref(),
    })?;
    Ok(LoadedModel { format: ModelFormat::HfFolder, weights: Box::new(weights), tokenizer })
}
