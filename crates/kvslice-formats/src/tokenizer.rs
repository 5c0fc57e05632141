//! Tokenizers: from an HF `tokenizer.json`, or rebuilt from GGUF metadata.
//!
//! A GGUF with `tokenizer.ggml.model = "gpt2"` carries a byte-level BPE: the token
//! strings (`tokenizer.ggml.tokens`, in id order), the merges (`tokenizer.ggml.merges`,
//! `"left right"` by rank), token types (`tokenizer.ggml.token_type`: 3 = control,
//! 4 = user defined), special ids, `tokenizer.ggml.add_bos_token` and the chat template.
//! The pre-tokenizer is chosen by `tokenizer.ggml.pre`, following llama.cpp:
//!
//! | `tokenizer.ggml.pre`                               | pre-tokenizer                               |
//! |----------------------------------------------------|---------------------------------------------|
//! | `gpt2` (or absent)                                 | ByteLevel (GPT-2 regex)                     |
//! | `smollm`, `starcoder`, `refact`, `command-r`, ...  | each digit split off, then ByteLevel        |
//! | `qwen2`                                            | Qwen2 regex (single digits), then ByteLevel |
//! | `llama-bpe`                                        | Llama 3 regex (digits in threes), ByteLevel |
//!
//! transformers' own GGUF converter ignores `tokenizer.ggml.pre` and always uses the
//! GPT-2 ByteLevel split; [`GgufPreTokenizer::TransformersCompat`] reproduces that. The
//! two differ only where a run of whitespace precedes a digit (`"x  1"`).

use std::collections::HashMap;
use std::sync::OnceLock;

use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use crate::chat::{ChatMessage, ChatSegment, ChatTemplate, SegmentKind};
use crate::error::{FormatError, Result};
use crate::gguf::{GgufFile, MetadataArray};

const QWEN2_PATTERN: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How to choose the pre-tokenizer of a tokenizer rebuilt from GGUF metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GgufPreTokenizer {
    /// Follow `tokenizer.ggml.pre`, as llama.cpp and the model's own tokenizer.json do.
    #[default]
    FromMetadata,
    /// Plain GPT-2 ByteLevel, as transformers' GGUF loader builds it.
    TransformersCompat,
}

/// The files of an HF tokenizer, as bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct HfTokenizerFiles<'a> {
    /// `tokenizer.json` (required).
    pub tokenizer_json: &'a [u8],
    /// `tokenizer_config.json`: bos/eos tokens, `add_bos_token`, `chat_template`.
    pub tokenizer_config_json: Option<&'a [u8]>,
    /// `chat_template.jinja`, which takes precedence over the config's template.
    pub chat_template_jinja: Option<&'a str>,
}

/// A tokenizer with the model's special ids and chat template.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// `inner` with special-token strings read as plain text, for [`Self::encode_chat`]; made
    /// on first use and kept. A copy per call would leak: tokenizers 0.23 caches each BPE
    /// instance's words in a thread-local map keyed by instance and never prunes it, so every
    /// copy that encodes leaves its words (up to 10,000) behind when it is dropped.
    plain: OnceLock<tokenizers::Tokenizer>,
    bos_token_id: Option<u32>,
    eos_token_id: Option<u32>,
    add_bos_token: bool,
    chat_template: Option<String>,
}

fn tok_err(e: impl std::fmt::Display) -> FormatError {
    FormatError::Tokenizer { reason: e.to_string() }
}

fn bad_key(key: &str, reason: impl Into<String>) -> FormatError {
    FormatError::BadMetadata { key: key.to_string(), reason: reason.into() }
}

/// A token in tokenizer_config.json: a string or `{"content": ...}`.
fn config_token(v: Option<&serde_json::Value>) -> Option<&str> {
    match v? {
        serde_json::Value::String(s) => Some(s),
        serde_json::Value::Object(o) => o.get("content")?.as_str(),
        _ => None,
    }
}

fn pre_tokenizer_for(pre: &str) -> Result<PreTokenizerWrapper> {
    let byte_level = |use_regex| {
        PreTokenizerWrapper::ByteLevel(tokenizers::pre_tokenizers::byte_level::ByteLevel::new(false, true, use_regex))
    };
    let split = |pattern: &str| -> Result<PreTokenizerWrapper> {
        Ok(PreTokenizerWrapper::Split(
            Split::new(SplitPattern::Regex(pattern.to_string()), SplitDelimiterBehavior::Isolated, false)
                .map_err(tok_err)?,
        ))
    };
    Ok(match pre {
        "gpt2" | "default" => byte_level(true),
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva" => {
            PreTokenizerWrapper::Sequence(Sequence::new(vec![
                PreTokenizerWrapper::Digits(Digits::new(true)),
                byte_level(true),
            ]))
        }
        "qwen2" => PreTokenizerWrapper::Sequence(Sequence::new(vec![split(QWEN2_PATTERN)?, byte_level(false)])),
        "llama-bpe" | "llama3" => {
            PreTokenizerWrapper::Sequence(Sequence::new(vec![split(LLAMA3_PATTERN)?, byte_level(false)]))
        }
        other => {
            return Err(FormatError::UnsupportedTokenizer { what: "tokenizer.ggml.pre", value: other.to_string() });
        }
    })
}

impl Tokenizer {
    /// Load an HF tokenizer (`tokenizer.json`, optionally `tokenizer_config.json` and
    /// `chat_template.jinja`).
    pub fn from_hf(files: HfTokenizerFiles<'_>) -> Result<Self> {
        // `tokenizers` panics (`expect("Helper")` in its decoder's deserializer) where the
        // `decoder` value is not valid JSON (bad syntax, invalid UTF-8 or a lone surrogate in a
        // string) instead of returning the error: read that value first, as it would.
        #[derive(serde::Deserialize)]
        struct DecoderSection {
            #[allow(dead_code)]
            decoder: Option<serde_json::Value>,
        }
        serde_json::from_slice::<DecoderSection>(files.tokenizer_json)
            .map_err(|e| tok_err(format!("tokenizer.json: {e}")))?;
        let inner = tokenizers::Tokenizer::from_bytes(files.tokenizer_json).map_err(tok_err)?;
        let config: serde_json::Value = match files.tokenizer_config_json {
            Some(b) => serde_json::from_slice(b).map_err(|e| tok_err(format!("tokenizer_config.json: {e}")))?,
            None => serde_json::Value::Null,
        };
        let id_of = |field: &str| -> Result<Option<u32>> {
            match config_token(config.get(field)) {
                None => Ok(None),
                Some(t) => inner
                    .token_to_id(t)
                    .map(Some)
                    .ok_or_else(|| tok_err(format!("tokenizer_config.json: {field} {t:?} is not in the vocabulary"))),
            }
        };
        let bos_token_id = id_of("bos_token")?;
        let eos_token_id = id_of("eos_token")?;
        let add_bos_token = config.get("add_bos_token").and_then(|v| v.as_bool()).unwrap_or(false);
        let chat_template = match files.chat_template_jinja {
            Some(t) => Some(t.to_string()),
            None => match config.get("chat_template") {
                Some(serde_json::Value::String(s)) => Some(s.clone()),
                // A list of named templates: use the one named "default".
                Some(serde_json::Value::Array(list)) => list
                    .iter()
                    .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                    .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
                _ => None,
            },
        };
        Ok(Tokenizer { inner, plain: OnceLock::new(), bos_token_id, eos_token_id, add_bos_token, chat_template })
    }

    /// Rebuild the tokenizer from GGUF metadata, choosing the pre-tokenizer from
    /// `tokenizer.ggml.pre`.
    pub fn from_gguf<B: AsRef<[u8]>>(gguf: &GgufFile<B>) -> Result<Self> {
        Self::from_gguf_with(gguf, GgufPreTokenizer::FromMetadata)
    }

    /// Rebuild the tokenizer from GGUF metadata with an explicit pre-tokenizer choice.
    pub fn from_gguf_with<B: AsRef<[u8]>>(gguf: &GgufFile<B>, pre: GgufPreTokenizer) -> Result<Self> {
        let model = gguf.get_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(FormatError::UnsupportedTokenizer { what: "tokenizer.ggml.model", value: model.to_string() });
        }
        let strings = |key: &str| -> Result<&[String]> {
            gguf.get(key)
                .ok_or_else(|| FormatError::MissingKey { key: key.to_string() })?
                .as_array()
                .and_then(MetadataArray::as_strings)
                .ok_or_else(|| bad_key(key, "expected an array of strings"))
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        // GGUF writers drop an empty merges array, so a missing key means "no merges" (a
        // byte-level vocabulary with no multi-byte tokens), as llama.cpp and transformers read it.
        let merges_raw: &[String] = match gguf.get("tokenizer.ggml.merges") {
            None => &[],
            Some(_) => strings("tokenizer.ggml.merges")?,
        };
        let n = tokens.len();
        if n == 0 || u32::try_from(n).is_err() {
            return Err(bad_key("tokenizer.ggml.tokens", format!("{n} tokens")));
        }
        let types: Option<Vec<i64>> = match gguf.get("tokenizer.ggml.token_type") {
            None => None,
            Some(v) => {
                let t = v
                    .as_array()
                    .and_then(MetadataArray::to_i64s)
                    .ok_or_else(|| bad_key("tokenizer.ggml.token_type", "expected an integer array"))?;
                if t.len() != n {
                    return Err(bad_key("tokenizer.ggml.token_type", format!("{} types for {n} tokens", t.len())));
                }
                Some(t)
            }
        };

        let mut vocab: HashMap<String, u32> = HashMap::with_capacity(n);
        for (i, t) in tokens.iter().enumerate() {
            if vocab.insert(t.clone(), i as u32).is_some() {
                return Err(bad_key("tokenizer.ggml.tokens", format!("token {t:?} appears twice")));
            }
        }
        let mut merges = Vec::with_capacity(merges_raw.len());
        for m in merges_raw {
            let (a, b) = m
                .split_once(' ')
                .filter(|(a, b)| !a.is_empty() && !b.is_empty() && !b.contains(' '))
                .ok_or_else(|| {
                    bad_key("tokenizer.ggml.merges", format!("merge {m:?} is not two tokens separated by one space"))
                })?;
            merges.push((a.to_string(), b.to_string()));
        }
        let vocab: Vocab = vocab.into_iter().collect();
        let bpe = BPE::builder().vocab_and_merges(vocab, merges).build().map_err(tok_err)?;
        let mut inner = tokenizers::Tokenizer::new(bpe);

        let pre_name = match pre {
            GgufPreTokenizer::TransformersCompat => "gpt2",
            GgufPreTokenizer::FromMetadata => match gguf.get("tokenizer.ggml.pre") {
                None => "gpt2",
                Some(v) => v.as_str().ok_or_else(|| bad_key("tokenizer.ggml.pre", "expected a string"))?,
            },
        };
        inner.with_pre_tokenizer(Some(pre_tokenizer_for(pre_name)?));
        inner.with_decoder(Some(ByteLevel::new(true, true, true)));

        let id_key = |key: &str| -> Result<Option<u32>> {
            match gguf.get_u64(key)? {
                None => Ok(None),
                Some(id) if id < n as u64 => Ok(Some(id as u32)),
                Some(id) => Err(bad_key(key, format!("token id {id} is outside the vocabulary of {n}"))),
            }
        };
        let bos_token_id = id_key("tokenizer.ggml.bos_token_id")?;
        let eos_token_id = id_key("tokenizer.ggml.eos_token_id")?;
        let add_bos_token = gguf.get_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(false);
        if add_bos_token {
            let bos =
                bos_token_id.ok_or_else(|| FormatError::MissingKey { key: "tokenizer.ggml.bos_token_id".into() })?;
            let bos_str = tokens[bos as usize].clone();
            let template = TemplateProcessing::builder()
                .try_single(format!("{bos_str} $A"))
                .map_err(tok_err)?
                .try_pair(format!("{bos_str} $A {bos_str} $B:1"))
                .map_err(tok_err)?
                .special_tokens(vec![(bos_str.as_str(), bos)])
                .build()
                .map_err(tok_err)?;
            inner.with_post_processor(Some(PostProcessorWrapper::Template(template)));
        } else {
            inner.with_post_processor(Some(PostProcessorWrapper::ByteLevel(
                tokenizers::pre_tokenizers::byte_level::ByteLevel::new(true, false, true),
            )));
        }

        if let Some(types) = &types {
            // 3 = control (special), 4 = user defined (added, not special).
            let special: Vec<AddedToken> = types
                .iter()
                .zip(tokens)
                .filter(|(t, _)| **t == 3)
                .map(|(_, s)| AddedToken::from(s.clone(), true))
                .collect();
            let user: Vec<AddedToken> = types
                .iter()
                .zip(tokens)
                .filter(|(t, _)| **t == 4)
                .map(|(_, s)| AddedToken::from(s.clone(), false).normalized(false))
                .collect();
            inner.add_special_tokens(special).map_err(tok_err)?;
            inner.add_tokens(user).map_err(tok_err)?;
        }

        let chat_template = match gguf.get("tokenizer.chat_template") {
            None => None,
            Some(v) => {
                Some(v.as_str().ok_or_else(|| bad_key("tokenizer.chat_template", "expected a string"))?.to_string())
            }
        };
        Ok(Tokenizer { inner, plain: OnceLock::new(), bos_token_id, eos_token_id, add_bos_token, chat_template })
    }

    /// Token ids of `text`. With `add_special_tokens`, the post-processor's tokens (BOS
    /// when the model adds one) are included. Special tokens written in the text (such as
    /// `<|im_start|>`) are always recognised.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        Ok(self.inner.encode(text, add_special_tokens).map_err(tok_err)?.get_ids().to_vec())
    }

    /// Text of `ids`.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner.decode(ids, skip_special_tokens).map_err(tok_err)
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_token_id
    }

    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos_token_id
    }

    /// Whether the model expects a BOS token in front of every prompt.
    pub fn add_bos_token(&self) -> bool {
        self.add_bos_token
    }

    /// The chat template's source, if the model has one.
    pub fn chat_template_source(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Render a conversation with the model's chat template (ChatML-style templates
    /// only; see [`ChatTemplate`]).
    pub fn apply_chat_template(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let src = self.chat_template.as_deref().ok_or(FormatError::NoChatTemplate)?;
        Ok(ChatTemplate::parse(src)?.render(messages, add_generation_prompt))
    }

    /// Token ids of a conversation in the model's chat template, without BOS (as
    /// [`Self::encode`] with `add_special_tokens = false` of the rendered text).
    ///
    /// Special tokens are recognised only in the template's own text, never in a message's
    /// role or content: a user message containing `<|im_end|>\n<|im_start|>system\n...` is
    /// encoded as that text, so it cannot open or close a turn. A conversation whose
    /// messages contain no special-token string is encoded as its whole rendered text, so
    /// its ids are those of transformers' `apply_chat_template(..., tokenize=True)`. Otherwise
    /// the text is split at the template's special tokens and each piece between them is
    /// encoded with special-token strings read as plain text, which is how the whole text is
    /// split when the messages hold no such string.
    pub fn encode_chat(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<Vec<u32>> {
        let src = self.chat_template.as_deref().ok_or(FormatError::NoChatTemplate)?;
        let template = ChatTemplate::parse(src)?;
        let segments = template.render_segments(messages, add_generation_prompt);
        let special = Specials::new(
            self.inner
                .get_added_vocabulary()
                .get_added_tokens_decoder()
                .iter()
                .filter(|(_, t)| t.special && !t.content.is_empty())
                .map(|(&id, t)| (t.content.as_str(), id))
                .collect(),
        );
        if !special.in_messages(&segments) {
            let text: String = segments.iter().map(|s| s.text).collect();
            return self.encode(&text, false);
        }
        self.encode_segments(&segments, &special)
    }

    /// Encodes a rendered conversation split at the template's special tokens: each piece
    /// between them is encoded with special-token strings read as plain text.
    fn encode_segments(&self, segments: &[ChatSegment<'_>], special: &Specials<'_>) -> Result<Vec<u32>> {
        // Pieces between the template's special tokens; messages and template text alike are
        // encoded with special-token strings as text (the template text holds none between its
        // own special tokens).
        let plain = self.plain.get_or_init(|| {
            let mut plain = self.inner.clone();
            plain.set_encode_special_tokens(true);
            plain
        });
        let mut ids = Vec::new();
        let mut run = String::new();
        let flush = |run: &mut String, ids: &mut Vec<u32>| -> Result<()> {
            if !run.is_empty() {
                ids.extend_from_slice(plain.encode(run.as_str(), false).map_err(tok_err)?.get_ids());
                run.clear();
            }
            Ok(())
        };
        // Consecutive template segments are searched together, so a special token written
        // across two of them is found as in the whole text.
        let mut template = String::new();
        let end_template = |template: &mut String, run: &mut String, ids: &mut Vec<u32>| -> Result<()> {
            let mut rest = template.as_str();
            while let Some((start, len, id)) = special.find(rest) {
                run.push_str(&rest[..start]);
                flush(run, ids)?;
                ids.push(id);
                rest = &rest[start + len..];
            }
            run.push_str(rest);
            template.clear();
            Ok(())
        };
        for seg in segments {
            match seg.kind {
                SegmentKind::Template => template.push_str(seg.text),
                SegmentKind::Message => {
                    end_template(&mut template, &mut run, &mut ids)?;
                    run.push_str(seg.text);
                }
            }
        }
        end_template(&mut template, &mut run, &mut ids)?;
        flush(&mut run, &mut ids)?;
        Ok(ids)
    }

    /// The underlying `tokenizers` tokenizer (for streaming decode and the like).
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// The special tokens of a tokenizer: (text, id), none empty.
struct Specials<'a> {
    tokens: Vec<(&'a str, u32)>,
    /// Whether some token starts with this byte.
    first: [bool; 256],
}

impl<'a> Specials<'a> {
    fn new(tokens: Vec<(&'a str, u32)>) -> Self {
        let mut first = [false; 256];
        for (t, _) in &tokens {
            first[usize::from(t.as_bytes()[0])] = true;
        }
        Specials { tokens, first }
    }

    /// The leftmost special token in `text` (the longest one where several start there):
    /// its byte offset, byte length and id.
    fn find(&self, text: &str) -> Option<(usize, usize, u32)> {
        text.bytes().enumerate().filter(|&(_, b)| self.first[usize::from(b)]).find_map(|(i, _)| {
            // A token's first byte is never a UTF-8 continuation byte, so `i` is a char boundary.
            self.tokens
                .iter()
                .filter(|(s, _)| text.as_bytes()[i..].starts_with(s.as_bytes()))
                .max_by_key(|(s, _)| s.len())
                .map(|&(s, id)| (i, s.len(), id))
        })
    }

    /// Whether a special token would be read in the messages of a rendered conversation: a
    /// message contains a special-token string, or one found in the whole text overlaps a
    /// message (begins in it and ends in the template text, say).
    fn in_messages(&self, segments: &[ChatSegment<'_>]) -> bool {
        if segments
            .iter()
            .any(|s| s.kind == SegmentKind::Message && self.tokens.iter().any(|(t, _)| s.text.contains(t)))
        {
            return true;
        }
        let text: String = segments.iter().map(|s| s.text).collect();
        // Byte ranges of the message segments.
        let mut messages = Vec::new();
        let mut pos = 0;
        for s in segments {
            if s.kind == SegmentKind::Message && !s.text.is_empty() {
                messages.push(pos..pos + s.text.len());
            }
            pos += s.text.len();
        }
        let mut from = 0;
        while let Some((start, len, _)) = self.find(&text[from..]) {
            let (a, b) = (from + start, from + start + len);
            if messages.iter().any(|m| a < m.end && m.start < b) {
                return true;
            }
            from = b;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    fn splits(pre: &str, text: &str) -> Vec<String> {
        let p = pre_tokenizer_for(pre).unwrap();
        let mut s = PreTokenizedString::from(text);
        p.pre_tokenize(&mut s).unwrap();
        s.get_splits(OffsetReferential::Original, OffsetType::Byte).into_iter().map(|(s, _, _)| s.to_string()).collect()
    }

    /// The split at the template's special tokens gives the ids of the whole rendered text
    /// when the messages hold no special-token string (the tiny fixture, which reproduces
    /// transformers' ids).
    #[test]
    fn split_encoding_equals_whole_text_for_benign_messages() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/tokenizer/tiny");
        let json = std::fs::read(dir.join("tokenizer.json")).unwrap();
        let cfg = std::fs::read(dir.join("tokenizer_config.json")).unwrap();
        let files =
            HfTokenizerFiles { tokenizer_json: &json, tokenizer_config_json: Some(&cfg), chat_template_jinja: None };
        let tok = Tokenizer::from_hf(files).unwrap();
        let template = ChatTemplate::parse(tok.chat_template_source().unwrap()).unwrap();
        let tokens = tok.inner.get_added_vocabulary().get_added_tokens_decoder().clone();
        let special = Specials::new(tokens.iter().map(|(&id, t)| (t.content.as_str(), id)).collect());
        let conversations = [
            vec![ChatMessage::user("What is the capital of France?")],
            vec![ChatMessage::new("system", "Be brief."), ChatMessage::user("Hi!")],
            vec![ChatMessage::user("\n\n  leading space, 12345 digits\n"), ChatMessage::new("assistant", " é\t")],
            vec![ChatMessage::user(""), ChatMessage::new("", "x")],
        ];
        for msgs in &conversations {
            for gen_prompt in [false, true] {
                let segments = template.render_segments(msgs, gen_prompt);
                assert!(!special.in_messages(&segments));
                let whole = tok.encode(&template.render(msgs, gen_prompt), false).unwrap();
                assert!(whole.len() > 10 && whole.contains(&1) && whole.contains(&2), "{whole:?}");
                assert_eq!(tok.encode_segments(&segments, &special).unwrap(), whole, "{msgs:?}");
            }
        }
    }

    #[test]
    fn pre_tokenizer_digit_rules() {
        // Hand-derived from each regex: Ġ is the byte-level form of a space.
        assert_eq!(splits("gpt2", "ab 12345"), ["ab", "Ġ12345"]);
        assert_eq!(splits("smollm", "ab 12345"), ["ab", "Ġ", "1", "2", "3", "4", "5"]);
        assert_eq!(splits("qwen2", "ab 12345"), ["ab", "Ġ", "1", "2", "3", "4", "5"]);
        assert_eq!(splits("llama-bpe", "ab 12345"), ["ab", "Ġ", "123", "45"]);
        assert_eq!(splits("smollm", "x  1"), ["x", "ĠĠ", "1"]);
        assert_eq!(splits("gpt2", "x  1"), ["x", "Ġ", "Ġ1"]);
        assert!(matches!(pre_tokenizer_for("falcon"), Err(FormatError::UnsupportedTokenizer { .. })));
    }
}
