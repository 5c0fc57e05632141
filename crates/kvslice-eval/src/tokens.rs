//! The tokenizer of a model, without its weights: from a `.gguf` file's metadata or an HF
//! folder's `tokenizer.json` (+ `tokenizer_config.json`, `chat_template.jinja`), built exactly as
//! `kvslice_formats::fs::open_model` builds it, so token counts match the runtime's.

use std::path::Path;

use kvslice_formats::{FormatError, HfTokenizerFiles, Tokenizer};

use crate::error::Result;

/// Loads the tokenizer of a `.gguf` file or an HF folder.
pub fn load_tokenizer(path: &Path) -> Result<Tokenizer> {
    if path.is_dir() {
        let read = |name: &str| -> Result<Option<Vec<u8>>> {
            let p = path.join(name);
            if p.is_file() { Ok(Some(kvslice_formats::fs::read(&p)?)) } else { Ok(None) }
        };
        let json = read("tokenizer.json")?.ok_or_else(|| FormatError::MissingFiles {
            files: vec![path.join("tokenizer.json").display().to_string()],
        })?;
        let config = read("tokenizer_config.json")?;
        let jinja = match read("chat_template.jinja")? {
            Some(bytes) => Some(
                String::from_utf8(bytes)
                    .map_err(|_| FormatError::InvalidUtf8 { what: "chat_template.jinja", offset: 0 })?,
            ),
            None => None,
        };
        Ok(Tokenizer::from_hf(HfTokenizerFiles {
            tokenizer_json: &json,
            tokenizer_config_json: config.as_deref(),
            chat_template_jinja: jinja.as_deref(),
        })?)
    } else if path.is_file() {
        Ok(Tokenizer::from_gguf(&kvslice_formats::fs::read_gguf(path)?)?)
    } else {
        Err(FormatError::MissingFiles { files: vec![path.display().to_string()] }.into())
    }
}

/// Tokens of a plain prompt as the runtime feeds it (`LoadedModel::encode_prompt(text, false)`):
/// the tokenizer's encoding with special tokens, a BOS when its config asks for one.
pub fn count_plain(tokenizer: &Tokenizer, text: &str) -> Result<usize> {
    Ok(tokenizer.encode(text, true)?.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_paths_are_errors() {
        let err = load_tokenizer(Path::new("/nonexistent/model.gguf")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/model.gguf"), "{err}");
        let dir = std::env::temp_dir().join(format!("kvslice-eval-tok-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let err = load_tokenizer(&dir).unwrap_err();
        assert!(err.to_string().contains("tokenizer.json"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The default model's tokenizer (`kvslice fetch`, which scripts/test.sh runs first), the
    /// one the committed suites are sized with, against transformers' encodings of the same GGUF (tests/golden/tokenizer).
    #[test]
    fn default_model_counts_match_transformers() {
        let cache = std::env::var_os("KVSLICE_CACHE_DIR")
            .filter(|d| !d.is_empty())
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| Path::new(&std::env::var("HOME").unwrap()).join(".cache/kvslice"));
        let path = cache.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
        assert!(path.is_file(), "{} missing: run `kvslice fetch` (scripts/test.sh does)", path.display());
        let tok = load_tokenizer(&path).unwrap();
        let golden: serde_json::Value =
            serde_json::from_str(include_str!("../../../tests/golden/tokenizer/smollm2.json")).unwrap();
        for case in golden["cases"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let want = case["smollm2"].as_array().unwrap().len();
            assert_eq!(count_plain(&tok, text).unwrap(), want, "{text:?}");
        }
    }
}
