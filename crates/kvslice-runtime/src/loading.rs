//! A model ready to run: decoder weights on a device plus its tokenizer.

use burn::tensor::Device;
use kvslice_formats::{ChatMessage, Tokenizer, WeightSource};
use kvslice_model::Llama;

use crate::error::Result;

/// A decoder on its device and the tokenizer that goes with it.
pub struct LoadedModel {
    pub model: Llama,
    pub tokenizer: Tokenizer,
    /// The bytes the model's tensors take in their files (`None` for weights with no file).
    pub file_bytes: Option<u64>,
}

impl LoadedModel {
    /// Uploads `weights` to `device`. The weights were already checked against their config.
    /// On a device opened by [`crate::init_device`], projections use the skinny-product kernel
    /// up to the adapter's own row count ([`crate::DeviceInfo::skinny_rows`]), and the
    /// quantized projections compute the adapter's own rows per invocation
    /// ([`crate::DeviceInfo::projection_rows`]); on a CPU adapter the host flushes the queue
    /// every few launches ([`crate::DeviceInfo::flush_interval`]).
    /// A weight larger than the adapter's buffer limits is refused before anything is uploaded.
    pub fn from_parts(weights: &dyn WeightSource, tokenizer: Tokenizer, device: &Device) -> Result<Self> {
        let info = crate::device::device_info(device);
        if let Some(info) = &info {
            crate::limits::check(&crate::limits::weight_buffers(weights.config()), info)?;
        }
        let mut model = kvslice_model::load::load_llama(weights, device)?;
        if let Some(info) = info {
            model.set_skinny_rows(info.skinny_rows());
            model.set_projection_rows(info.projection_rows())?;
            if info.flush_interval() > 0 {
                kvslice_kernels::set_flush_interval(info.flush_interval());
            }
        }
        let file_bytes = kvslice_formats::model_file_bytes(weights);
        Ok(Self { model, tokenizer, file_bytes })
    }

    /// Opens a `.gguf` file or an HF folder (native targets).
    #[cfg(not(target_family = "wasm"))]
    pub fn open(path: &std::path::Path, device: &Device) -> Result<Self> {
        let files = kvslice_formats::fs::open_model(path)?;
        let loaded = Self::from_parts(files.weights.as_ref(), files.tokenizer, device)?;
        Ok(loaded)
    }

    /// Token ids of a prompt. With `chat`, the text becomes one user message in the model's
    /// chat template (with the assistant's turn opened), where special-token strings in the
    /// text stay text (a user cannot close their turn or open a system one); otherwise it is
    /// tokenized as is, with a BOS only when the tokenizer's config asks for one.
    pub fn encode_prompt(&self, text: &str, chat: bool) -> Result<Vec<u32>> {
        let ids = if chat {
            self.tokenizer.encode_chat(&[ChatMessage::user(text)], true)?
        } else {
            self.tokenizer.encode(text, true)?
        };
        if ids.is_empty() {
            return Err(crate::RuntimeError::Options("the prompt encodes to no tokens".into()));
        }
        let context = self.model.config.max_position_embeddings;
        if ids.len() > context {
            return Err(kvslice_model::ModelError::ContextOverflow { tokens: ids.len(), context }.into());
        }
        Ok(ids)
    }

    /// Text of generated ids (special tokens kept out).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        Ok(self.tokenizer.decode(ids, true)?)
    }

    /// KVzip's reconstruction prompt in this tokenizer (kvpress's wording and chunking; the turn
    /// change of a model without a chat template).
    pub fn reconstruction_prompt(&self) -> Result<crate::ReconstructionPrompt> {
        use crate::evict::reconstruct as r;
        Ok(crate::ReconstructionPrompt {
            first: self.tokenizer.encode(r::FIRST, false)?,
            next: self.tokenizer.encode(r::NEXT, false)?,
            suffix: self.tokenizer.encode(r::SUFFIX, false)?,
            chunk: r::CHUNK,
            sinks: r::SINKS,
        })
    }

    /// Tokens that end a generation: the config's EOS ids and the tokenizer's.
    pub fn stop_tokens(&self) -> Vec<u32> {
        let mut stop = self.model.config.eos_token_ids.clone();
        if let Some(e) = self.tokenizer.eos_token_id()
            && !stop.contains(&e)
        {
            stop.push(e);
        }
        stop
    }
}
