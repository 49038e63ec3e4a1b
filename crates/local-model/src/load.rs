//! Opening a GGUF model for inference.
//!
//! - candle 0.11 has no SIMD kernel for Q4_1, so a model with Q4_1 tensors
//!   is re-quantized to Q8_0 once and cached next to it ([`crate::cache_path`];
//!   written to a temporary file and renamed, so a half-written cache is
//!   never read). Decode is about 3× faster on the cache; when the cache
//!   cannot be written the model runs on its native Q4_1 tensors.
//! - The tokenizer is built from the GGUF metadata. candle's builder does
//!   not know the `smollm` pre-tokenizer and falls back to a byte-level one
//!   that adds a prefix space and keeps digits together; for `smollm` it is
//!   replaced by individual digits then byte-level without a prefix space,
//!   which gives the ids llama.cpp gives.
//! - The file is read, never memory-mapped (no `unsafe`).

use std::fs::File;
use std::io::{BufReader, BufWriter, Seek};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use candle_core::quantized::gguf_file::{self, Content};
use candle_core::quantized::{GgmlDType, QTensor, tokenizer::TokenizerFromGguf as _};
use candle_core::{Device, Tensor};
use candle_transformers::models::quantized_llama::{MAX_SEQ_LEN, ModelWeights};
use tokenizers::Tokenizer;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;

/// Why a model cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file is missing or unreadable.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not a GGUF model this provider can run.
    #[error("{path} is not a usable GGUF chat model: {reason}")]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// The system prompt SmolLM2's chat template inserts when a conversation
/// has none.
pub const SMOLLM_SYSTEM_PROMPT: &str =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

/// A loaded model: weights without any KV cache (each turn clones them —
/// the tensors are shared — and gets its own cache), the tokenizer, and
/// what the prompt builder needs to know.
#[derive(Debug, Clone)]
pub struct LoadedModel {
    /// The weights, never run directly (clone per turn).
    pub weights: ModelWeights,
    /// The tokenizer, set to encode special-token text as plain text.
    pub tokenizer: Tokenizer,
    /// `<|im_start|>`.
    pub im_start: u32,
    /// `<|im_end|>`.
    pub im_end: u32,
    /// Ids that end generation (`<|im_end|>`, the eos, `<|endoftext|>`).
    pub stop_ids: Vec<u32>,
    /// Used when the conversation has no system prompt.
    pub default_system_prompt: Option<String>,
    /// Positions the model can attend to (the GGUF's context length, capped
    /// by candle's rotary table).
    pub context_length: usize,
    /// Which file the weights came from (the cache or the model).
    pub weights_path: PathBuf,
    /// Time from open to ready.
    pub load_time: Duration,
}

fn unsupported(path: &Path, reason: impl std::fmt::Display) -> LoadError {
    LoadError::Unsupported {
        path: path.to_owned(),
        reason: reason.to_string(),
    }
}

fn open(path: &Path) -> Result<(Content, BufReader<File>), LoadError> {
    let io = |source| LoadError::Io {
        path: path.to_owned(),
        source,
    };
    let mut reader = BufReader::new(File::open(path).map_err(io)?);
    let content = Content::read(&mut reader).map_err(|e| unsupported(path, e))?;
    Ok((content, reader))
}

fn md_u32(content: &Content, key: &str) -> Option<u32> {
    content.metadata.get(key).and_then(|v| v.to_u32().ok())
}

fn md_str<'a>(content: &'a Content, key: &str) -> Option<&'a str> {
    content
        .metadata
        .get(key)
        .and_then(|v| v.to_string().ok())
        .map(String::as_str)
}

/// Loads `path`, using (and, for Q4_1 models, first writing) its Q8_0 cache.
pub fn load(path: &Path) -> Result<LoadedModel, LoadError> {
    let started = Instant::now();
    let (content, reader) = open(path)?;
    let arch = md_str(&content, "general.architecture").unwrap_or("");
    if arch != "llama" {
        return Err(unsupported(
            path,
            format!("architecture {arch:?} (only llama-architecture models are supported)"),
        ));
    }
    let tokenizer = build_tokenizer(path, &content)?;
    let token = |t: &str| {
        tokenizer
            .token_to_id(t)
            .ok_or_else(|| unsupported(path, format!("no {t} token: not a ChatML model")))
    };
    let im_start = token("<|im_start|>")?;
    let im_end = token("<|im_end|>")?;
    let mut stop_ids = vec![im_end];
    stop_ids.extend(md_u32(&content, "tokenizer.ggml.eos_token_id"));
    stop_ids.extend(tokenizer.token_to_id("<|endoftext|>"));
    stop_ids.sort_unstable();
    stop_ids.dedup();
    let template = md_str(&content, "tokenizer.chat_template").unwrap_or("");
    let default_system_prompt = template
        .contains(SMOLLM_SYSTEM_PROMPT)
        .then(|| SMOLLM_SYSTEM_PROMPT.to_owned());
    let context_length = md_u32(&content, "llama.context_length")
        .map_or(MAX_SEQ_LEN, |n| n as usize)
        .min(MAX_SEQ_LEN);

    let needs_cache = content
        .tensor_infos
        .values()
        .any(|t| t.ggml_dtype == GgmlDType::Q4_1);
    let (weights, weights_path) = if needs_cache {
        let cache = crate::cache_path(path);
        match cached_weights(path, content, reader, &cache) {
            Ok(w) => (w, cache),
            Err(err) => {
                tracing::warn!(cache = %cache.display(), error = %err, "cannot use the Q8_0 cache; running the slower native Q4_1 weights");
                let (content, mut reader) = open(path)?;
                let w = ModelWeights::from_gguf(content, &mut reader, &Device::Cpu)
                    .map_err(|e| unsupported(path, e))?;
                (w, path.to_owned())
            }
        }
    } else {
        let mut reader = reader;
        let w = ModelWeights::from_gguf(content, &mut reader, &Device::Cpu)
            .map_err(|e| unsupported(path, e))?;
        (w, path.to_owned())
    };
    Ok(LoadedModel {
        weights,
        tokenizer,
        im_start,
        im_end,
        stop_ids,
        default_system_prompt,
        context_length,
        weights_path,
        load_time: started.elapsed(),
    })
}

/// The tokenizer from the GGUF metadata, fixed for `smollm`, encoding
/// special-token text as plain text (control ids are spliced in by the
/// prompt builder, so user text can never produce one).
fn build_tokenizer(path: &Path, content: &Content) -> Result<Tokenizer, LoadError> {
    let mut tokenizer = Tokenizer::from_gguf(content).map_err(|e| unsupported(path, e))?;
    if md_str(content, "tokenizer.ggml.pre") == Some("smollm") {
        let fixed = Sequence::new(vec![
            PreTokenizerWrapper::Digits(Digits::new(true)),
            PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true)),
        ]);
        tokenizer.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(fixed)));
    }
    tokenizer.set_encode_special_tokens(true);
    Ok(tokenizer)
}

/// The weights from the Q8_0 cache, writing it first when it is missing or
/// unreadable.
fn cached_weights(
    source: &Path,
    content: Content,
    mut reader: BufReader<File>,
    cache: &Path,
) -> Result<ModelWeights, String> {
    if let Ok((cached, mut cache_reader)) = open(cache)
        && cached.tensor_infos.len() == content.tensor_infos.len()
    {
        match ModelWeights::from_gguf(cached, &mut cache_reader, &Device::Cpu) {
            Ok(w) => return Ok(w),
            Err(e) => {
                tracing::warn!(cache = %cache.display(), error = %e, "unreadable Q8_0 cache; writing it again");
            }
        }
    }
    let started = Instant::now();
    write_q8_cache(&content, &mut reader, cache)?;
    tracing::info!(source = %source.display(), cache = %cache.display(), elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX), "wrote the Q8_0 cache of the local model (once)");
    let (cached, mut cache_reader) = open(cache).map_err(|e| e.to_string())?;
    ModelWeights::from_gguf(cached, &mut cache_reader, &Device::Cpu).map_err(|e| e.to_string())
}

/// Writes `content` with every Q4_1 tensor re-quantized to Q8_0, through a
/// temporary file renamed into place.
pub fn write_q8_cache<R: std::io::Read + Seek>(
    content: &Content,
    reader: &mut R,
    cache: &Path,
) -> Result<(), String> {
    let device = Device::Cpu;
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let mut tensors = Vec::with_capacity(names.len());
    for name in names {
        let t = content
            .tensor(reader, name, &device)
            .map_err(|e| format!("tensor {name}: {e}"))?;
        let t = if t.dtype() == GgmlDType::Q4_1 {
            let f: Tensor = t.dequantize(&device).map_err(|e| e.to_string())?;
            QTensor::quantize(&f, GgmlDType::Q8_0).map_err(|e| e.to_string())?
        } else {
            t
        };
        tensors.push((name.as_str(), t));
    }
    let mut metadata: Vec<(&str, &gguf_file::Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    metadata.sort_by_key(|(k, _)| *k);
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = cache.with_extension(format!("tmp{}-{n}", std::process::id()));
    let result = (|| {
        let mut w = BufWriter::new(File::create(&tmp).map_err(|e| e.to_string())?);
        let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (*n, t)).collect();
        gguf_file::write(&mut w, &metadata, &refs).map_err(|e| e.to_string())?;
        let file = w.into_inner().map_err(|e| e.to_string())?;
        file.sync_all().map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, cache).map_err(|e| e.to_string())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
