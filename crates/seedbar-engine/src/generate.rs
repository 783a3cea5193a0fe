//! Single-sequence generation: chunked prefill, decode with a KV cache, seeded sampling,
//! stop on EOS or the token budget, text streamed as it completes.

use std::time::Instant;

use mlx_rs::Array;

use crate::{
    error::{EngineError, Result},
    kv_cache::KvCache,
    model::Model,
    models::Logits,
    sampling::{self, SamplingParams},
};

/// Prompts are prefilled in chunks that start at multiples of this absolute position, so a
/// prompt's numerics never depend on how it arrived.
pub const PREFILL_CHUNK: usize = 512;

#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token.
    Stop,
    /// `max_tokens` reached.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub text: String,
    pub finish_reason: FinishReason,
    pub prompt_tokens: usize,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
}

impl Model {
    /// Run `tokens` through the model in aligned chunks; returns the last position's logits.
    pub fn prefill(&self, tokens: &[u32], caches: &mut [KvCache]) -> Result<Vec<f32>> {
        let mut start = caches.first().map_or(0, |c| c.len() as usize);
        let mut remaining = tokens;
        let mut logits = None;
        while !remaining.is_empty() {
            let take = (PREFILL_CHUNK - start % PREFILL_CHUNK).min(remaining.len());
            let (chunk, rest) = remaining.split_at(take);
            logits = Some(self.step(chunk, caches)?);
            remaining = rest;
            start += take;
        }
        logits.ok_or_else(|| EngineError::InvalidRequest("the prompt is empty".into()))
    }

    /// One forward pass over `tokens` appended to the cache; last position's logits.
    pub fn step(&self, tokens: &[u32], caches: &mut [KvCache]) -> Result<Vec<f32>> {
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let input = Array::from_slice(&ids, &[1, ids.len() as i32]);
        let logits = self.transformer.forward(&input, caches, Logits::Last)?;
        logits.eval()?;
        Ok(logits.as_slice::<f32>().to_vec())
    }

    pub fn generate(
        &self,
        request: &GenerateRequest,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation> {
        request
            .sampling
            .validate()
            .map_err(EngineError::InvalidRequest)?;
        let vocab = self.config().vocab_size as usize;
        if let Some(bad) = request.prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::InvalidRequest(format!(
                "token id {bad} is outside the vocabulary ({vocab})"
            )));
        }
        let mut caches = self.transformer.new_caches();
        let started = Instant::now();
        let mut logits = self.prefill(&request.prompt, &mut caches)?;
        let prefill_seconds = started.elapsed().as_secs_f64();
        let decode_started = Instant::now();
        let mut stream = self.tokenizer.stream();
        let mut tokens = Vec::new();
        let mut finish_reason = FinishReason::Length;
        while tokens.len() < request.max_tokens {
            let position = (request.prompt.len() + tokens.len()) as u64;
            let token = sampling::sample(&logits, &request.sampling, position);
            if self.eos_ids.contains(&token) {
                finish_reason = FinishReason::Stop;
                break;
            }
            tokens.push(token);
            let delta = stream.push(token)?;
            if !delta.is_empty() {
                on_text(&delta);
            }
            if tokens.len() < request.max_tokens {
                logits = self.step(&[token], &mut caches)?;
            }
        }
        let rest = stream.finish()?;
        if !rest.is_empty() {
            on_text(&rest);
        }
        Ok(Generation {
            text: self.tokenizer.decode(&tokens)?,
            tokens,
            finish_reason,
            prompt_tokens: request.prompt.len(),
            prefill_seconds,
            decode_seconds: decode_started.elapsed().as_secs_f64(),
        })
    }
}
