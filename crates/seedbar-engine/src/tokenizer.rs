//! Text <-> token ids through the `tokenizers` crate, built from `tokenizer.json` or from a
//! GGUF file's vocabulary (byte-level BPE, or SentencePiece BPE with byte fallback), plus a
//! streaming decoder that only ever emits whole characters.

use std::{collections::HashSet, ops::Range, path::Path};

use tokenizers::{
    decoders::{
        byte_fallback::ByteFallback, byte_level::ByteLevel as ByteLevelDecoder, fuse::Fuse,
        sequence::Sequence as DecoderSequence, strip::Strip, DecoderWrapper,
    },
    models::bpe::BPE,
    normalizers::{NormalizerWrapper, Prepend, Replace, Sequence as NormalizerSequence},
    pre_tokenizers::{
        byte_level::ByteLevel, digits::Digits, sequence::Sequence, split::Split,
        PreTokenizerWrapper,
    },
    AddedToken, SplitDelimiterBehavior,
};

use crate::error::{EngineError, Result};

/// GPT-2 style split used by Llama 3 (`llama-bpe`): numbers in runs of up to three digits.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split: like Llama 3's with single digits.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GGUF token types (llama.cpp's `llama_token_type`).
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// SentencePiece's word boundary, which stands for a space.
const SPACE_MARK: &str = "\u{2581}";

/// A vocabulary as GGUF stores it.
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: `gpt2` (byte-level BPE) or `llama` / `gemma` (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`, e.g. `smollm`, `llama-bpe`, `qwen2`.
    pub pre: String,
    pub tokens: Vec<String>,
    pub merges: Vec<String>,
    pub token_types: Vec<i32>,
    /// SentencePiece: each token's score (a merge making a higher-scored token goes first).
    pub scores: Vec<f32>,
    /// SentencePiece: whether a space is put before the text (`tokenizer.ggml.add_space_prefix`).
    pub add_space_prefix: bool,
}

#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
}

fn tok_err(e: impl std::fmt::Display) -> EngineError {
    EngineError::Tokenizer(e.to_string())
}

impl Tokenizer {
    pub fn from_file(path: &Path) -> Result<Self> {
        if !path.exists() {
            return Err(EngineError::MissingFile {
                path: path.to_path_buf(),
            });
        }
        let mut inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| EngineError::bad_file(path, format!("invalid tokenizer.json: {e}")))?;
        // The engine cuts and pads sequences itself; a tokenizer.json saved from training
        // (e.g. a BERT's, padded to a fixed 128) must not do it behind its back.
        inner.with_padding(None);
        inner
            .with_truncation(None)
            .map_err(|e| EngineError::bad_file(path, format!("invalid tokenizer.json: {e}")))?;
        Ok(Tokenizer { inner })
    }

    /// Rebuild the tokenizer a GGUF file describes.
    pub fn from_gguf(vocab: GgufVocab) -> Result<Self> {
        let mut inner = match vocab.model.as_str() {
            "gpt2" => byte_level_bpe(&vocab)?,
            "llama" | "gemma" => sentencepiece_bpe(&vocab)?,
            other => {
                return Err(EngineError::Tokenizer(format!(
                    "GGUF tokenizer model `{other}` is not supported (byte-level BPE `gpt2` \
                     and SentencePiece `llama` and `gemma` are)"
                )))
            }
        };
        let (special, user): (Vec<_>, Vec<_>) = vocab
            .tokens
            .iter()
            .zip(vocab.token_types.iter())
            .filter(|(_, t)| matches!(**t, TOKEN_TYPE_CONTROL | TOKEN_TYPE_USER_DEFINED))
            .partition(|(_, t)| **t == TOKEN_TYPE_CONTROL);
        let added = |list: Vec<(&String, &i32)>, special: bool| -> Vec<AddedToken> {
            list.into_iter()
                .map(|(t, _)| AddedToken::from(t.clone(), special).normalized(false))
                .collect()
        };
        inner.add_special_tokens(&added(special, true));
        inner.add_tokens(&added(user, false));
        Ok(Tokenizer { inner })
    }
    /// Encode text; special-token strings in it (e.g. `<|im_start|>`) map to their ids.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self
            .inner
            .encode_fast(text, false)
            .map_err(tok_err)?
            .get_ids()
            .to_vec())
    }

    /// Encode text with the special tokens the tokenizer's post-processor adds around it
    /// (a BERT's `[CLS]` ... `[SEP]`), as an encoder model's input.
    pub fn encode_with_special_tokens(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self
            .inner
            .encode_fast(text, true)
            .map_err(tok_err)?
            .get_ids()
            .to_vec())
    }

    /// Encode a pair of texts as an encoder's input (a BERT's `[CLS] a [SEP] b [SEP]`, as the
    /// post-processor says): the ids, and each token's type (0 for `a`'s part, 1 for `b`'s).
    pub fn encode_pair(&self, a: &str, b: &str) -> Result<(Vec<u32>, Vec<u32>)> {
        let encoding = self.inner.encode_fast((a, b), true).map_err(tok_err)?;
        Ok((
            encoding.get_ids().to_vec(),
            encoding.get_type_ids().to_vec(),
        ))
    }

    /// The texts of the special (control) tokens, e.g. `<|im_end|>`: the strings that
    /// [`encode`](Self::encode) turns into control ids.
    pub(crate) fn special_tokens(&self) -> Vec<String> {
        self.inner
            .get_added_tokens_decoder()
            .into_values()
            .filter(|token| token.special)
            .map(|token| token.content)
            .collect()
    }

    /// Encode `text` as [`encode`](Self::encode) does, except that a special token
    /// overlapping one of the `literal` byte ranges becomes the ordinary tokens that spell
    /// its text: that text is something written, not a control token.
    pub(crate) fn encode_with_literals(
        &self,
        text: &str,
        literal: &[Range<usize>],
    ) -> Result<Vec<u32>> {
        let special_ids: HashSet<u32> = self
            .inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, token)| token.special)
            .map(|(id, _)| id)
            .collect();
        // With byte offsets (`encode_fast` leaves them out); the ids are the same.
        let encoding = self.inner.encode(text, false).map_err(tok_err)?;
        let mut spelling: Option<tokenizers::Tokenizer> = None;
        let mut ids = Vec::with_capacity(encoding.len());
        for (&id, &(start, end)) in encoding.get_ids().iter().zip(encoding.get_offsets()) {
            if !special_ids.contains(&id) || !literal.iter().any(|r| r.start < end && start < r.end)
            {
                ids.push(id);
                continue;
            }
            let written = text.get(start..end).ok_or_else(|| {
                EngineError::Tokenizer(format!(
                    "token {id} has offsets {start}..{end} off the text"
                ))
            })?;
            let spelling = spelling.get_or_insert_with(|| {
                let mut plain = self.inner.clone();
                plain.set_encode_special_tokens(true);
                plain
            });
            ids.extend(
                spelling
                    .encode_fast(written, false)
                    .map_err(tok_err)?
                    .get_ids(),
            );
        }
        Ok(ids)
    }

    /// Decode ids to text, leaving out special tokens.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, true).map_err(tok_err)
    }

    /// Every token's bytes as it writes them into the text, by id, for grammars that reason
    /// about bytes: byte-level BPE tokens map their characters back through GPT-2's byte
    /// alphabet, byte-fallback (SentencePiece) tokens spell `<0xAB>` as that byte and `▁` as a
    /// space. Special and added control tokens are [`TokenBytes::Special`].
    pub fn token_bytes(&self) -> Result<Vec<TokenBytes>> {
        let spelling = Spelling::of(self.inner.get_decoder())?;
        let added = self.inner.get_added_tokens_decoder();
        (0..self.inner.get_vocab_size(true) as u32)
            .map(|id| match added.get(&id) {
                Some(token) if token.special => Ok(TokenBytes::Special(token.content.clone())),
                Some(token) => Ok(TokenBytes::Text(token.content.clone().into_bytes())),
                None => match self.inner.id_to_token(id) {
                    Some(piece) => spelling.bytes(&piece).map(TokenBytes::Text),
                    None => Ok(TokenBytes::Text(Vec::new())),
                },
            })
            .collect()
    }

    /// Whether `other` has this vocabulary: the same tokens at the same ids (a draft model
    /// for speculative decoding must).
    pub fn same_vocabulary(&self, other: &Tokenizer) -> bool {
        let size = self.inner.get_vocab_size(true);
        size == other.inner.get_vocab_size(true)
            && (0..size as u32).all(|id| self.inner.id_to_token(id) == other.inner.id_to_token(id))
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The vocabulary's string for `id` (a special token's text as it is written).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        self.inner
            .save(path, false)
            .map_err(|e| EngineError::bad_file(path, format!("cannot write tokenizer: {e}")))
    }
}

/// Each token of `vocab` with its id.
fn token_ids(vocab: &GgufVocab) -> tokenizers::models::bpe::Vocab {
    vocab
        .tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect()
}

/// Byte-level BPE (`gpt2`): the vocabulary's merges and the pre-tokenizer `pre` names.
fn byte_level_bpe(vocab: &GgufVocab) -> Result<tokenizers::Tokenizer> {
    let ids = token_ids(vocab);
    let merges = vocab
        .merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| EngineError::Tokenizer(format!("malformed merge `{m}`")))
        })
        .collect::<Result<Vec<_>>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(ids, merges)
        .ignore_merges(vocab.pre == "llama-bpe")
        .build()
        .map_err(tok_err)?;
    let byte_level = ByteLevel::new(false, true, true);
    let regex_then_bytes = |pattern: &str| -> Result<PreTokenizerWrapper> {
        let split = Split::new(
            tokenizers::pre_tokenizers::split::SplitPattern::Regex(pattern.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(tok_err)?;
        Ok(Sequence::new(vec![
            split.into(),
            ByteLevel::new(false, true, false).into(),
        ])
        .into())
    };
    let pre: PreTokenizerWrapper = match vocab.pre.as_str() {
        "smollm" | "starcoder" | "refact" => {
            Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into()
        }
        "gpt2" | "default" | "gpt-2" => byte_level.into(),
        "llama-bpe" | "llama3" | "smaug-bpe" => regex_then_bytes(LLAMA3_SPLIT)?,
        "qwen2" => regex_then_bytes(QWEN2_SPLIT)?,
        other => {
            return Err(EngineError::Tokenizer(format!(
                "GGUF pre-tokenizer `{other}` is not supported"
            )))
        }
    };
    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(pre));
    inner.with_decoder(Some(ByteLevelDecoder::default()));
    Ok(inner)
}

/// SentencePiece BPE (`llama`, `gemma`), as llama.cpp runs it: spaces become `▁` (one put
/// before the text when `add_space_prefix`), adjacent pieces merge into the vocabulary's
/// highest-scored token first, and characters without a token fall back to `<0xAB>` byte
/// tokens. Merges are derived from the scores: every split of a token into two tokens is a
/// merge ranked by the whole token's score.
fn sentencepiece_bpe(vocab: &GgufVocab) -> Result<tokenizers::Tokenizer> {
    if vocab.scores.len() != vocab.tokens.len() {
        return Err(EngineError::Tokenizer(format!(
            "GGUF SentencePiece vocabulary has {} tokens but {} scores",
            vocab.tokens.len(),
            vocab.scores.len()
        )));
    }
    let ids = token_ids(vocab);
    let mut ranked: Vec<(f32, u32, u32, &str, &str)> = vec![];
    for (token, &score) in vocab.tokens.iter().zip(&vocab.scores) {
        for (at, _) in token.char_indices().skip(1) {
            let (left, right) = token.split_at(at);
            if let (Some(&l), Some(&r)) = (ids.get(left), ids.get(right)) {
                ranked.push((score, l, r, left, right));
            }
        }
    }
    // Highest score first; ties in the order of the pieces' ids (as Hugging Face does).
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
    let merges = ranked
        .into_iter()
        .map(|(_, _, _, l, r)| (l.to_string(), r.to_string()))
        .collect();
    let mut bpe = BPE::builder()
        .vocab_and_merges(ids.clone(), merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if ids.contains_key("<unk>") {
        bpe = bpe.unk_token("<unk>".into());
    }
    let mut inner = tokenizers::Tokenizer::new(bpe.build().map_err(tok_err)?);
    let mut normalizers: Vec<NormalizerWrapper> = vec![];
    let mut decoders: Vec<DecoderWrapper> = vec![
        Replace::new(SPACE_MARK, " ").map_err(tok_err)?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if vocab.add_space_prefix {
        normalizers.push(Prepend::new(SPACE_MARK.into()).into());
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    normalizers.push(Replace::new(" ", SPACE_MARK).map_err(tok_err)?.into());
    inner.with_normalizer(Some(NormalizerSequence::new(normalizers)));
    inner.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(inner)
}

/// What one token writes, as [`Tokenizer::token_bytes`] gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenBytes {
    Text(Vec<u8>),
    /// A control token (`<|im_end|>`): never part of written text.
    Special(String),
}

/// How a vocabulary spells bytes in its token strings.
enum Spelling {
    /// GPT-2's printable alphabet: each byte is one character.
    ByteLevel(std::collections::HashMap<char, u8>),
    /// SentencePiece: `<0xAB>` tokens for raw bytes, `▁` for a space.
    ByteFallback,
}

impl Spelling {
    fn of(decoder: Option<&tokenizers::DecoderWrapper>) -> Result<Self> {
        use tokenizers::DecoderWrapper;
        fn find(decoder: &DecoderWrapper) -> Option<Spelling> {
            match decoder {
                DecoderWrapper::ByteLevel(_) => Some(Spelling::ByteLevel(byte_alphabet())),
                DecoderWrapper::ByteFallback(_) => Some(Spelling::ByteFallback),
                DecoderWrapper::Sequence(sequence) => sequence.get_decoders().iter().find_map(find),
                _ => None,
            }
        }
        decoder.and_then(find).ok_or_else(|| {
            EngineError::Tokenizer(
                "this tokenizer is neither byte-level BPE nor SentencePiece with byte fallback"
                    .into(),
            )
        })
    }

    fn bytes(&self, piece: &str) -> Result<Vec<u8>> {
        match self {
            Spelling::ByteLevel(alphabet) => piece
                .chars()
                .map(|c| {
                    alphabet.get(&c).copied().ok_or_else(|| {
                        EngineError::Tokenizer(format!("token `{piece}` is not byte-level"))
                    })
                })
                .collect(),
            Spelling::ByteFallback => Ok(
                match piece
                    .strip_prefix("<0x")
                    .and_then(|hex| hex.strip_suffix('>'))
                    .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                {
                    Some(byte) if piece.len() == 6 => vec![byte],
                    _ => piece.replace('\u{2581}', " ").into_bytes(),
                },
            ),
        }
    }
}

/// GPT-2's byte-to-character map, inverted: printable Latin-1 bytes stand for themselves,
/// the rest are shifted to U+0100 onward in byte order.
fn byte_alphabet() -> std::collections::HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut shifted = 0x100u32;
    (0..=255u8)
        .map(|b| {
            let c = if printable(b) {
                char::from(b)
            } else {
                shifted += 1;
                char::from_u32(shifted - 1).expect("U+0100..U+0143 are characters")
            };
            (c, b)
        })
        .collect()
}

/// Turns a growing list of token ids into text deltas whose concatenation equals
/// `decode(all ids)`. A delta is held back while it ends in an incomplete character. Each
/// push decodes only a short window of recent ids (the `tokenizers` crate's stream
/// decoding: the window's text less what it already handed out), so a token costs the same
/// at any reply length; decoding every id each time made a long reply's tokens ever dearer.
/// The caller keeps the ids (a reply already has them) and passes them all each time.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    /// Recent ids, the window the next delta is decoded from.
    window: Vec<u32>,
    /// The window's text already handed out, and the window ids it spans.
    prefix: String,
    prefix_ids: usize,
    /// Bytes of the decoded text handed out so far.
    emitted: usize,
}

/// Ids a window restarts from after a decoder's text was not stable over it.
const WINDOW_RESTART: usize = 4;

impl StreamDecoder {
    /// The new text once `ids` (every token so far) gained one; empty while a character
    /// is incomplete.
    pub fn push(&mut self, tokenizer: &Tokenizer, ids: &[u32]) -> Result<String> {
        let Some(&id) = ids.last() else {
            return Ok(String::new());
        };
        let step = tokenizers::tokenizer::step_decode_stream(
            &tokenizer.inner,
            vec![id],
            true,
            &mut self.window,
            &mut self.prefix,
            &mut self.prefix_ids,
        );
        match step {
            Ok(delta) => {
                let delta = delta.unwrap_or_default();
                self.emitted += delta.len();
                Ok(delta)
            }
            // A decoder whose text over the window is not the earlier text continued: take
            // the delta from the whole text (once its last character is whole), and restart
            // the window from the last few ids.
            Err(_) => {
                let text = tokenizer.decode(ids)?;
                if text.ends_with('\u{FFFD}') {
                    return Ok(String::new());
                }
                self.window = ids[ids.len().saturating_sub(WINDOW_RESTART)..].to_vec();
                self.prefix.clear();
                self.prefix_ids = 0;
                Ok(self.take_from(text))
            }
        }
    }

    /// Everything not yet handed out (call once the stream ends).
    pub fn finish(&mut self, tokenizer: &Tokenizer, ids: &[u32]) -> Result<String> {
        let text = tokenizer.decode(ids)?;
        Ok(self.take_from(text))
    }

    fn take_from(&mut self, text: String) -> String {
        if text.len() < self.emitted || !text.is_char_boundary(self.emitted) {
            return String::new();
        }
        let delta = text[self.emitted..].to_string();
        self.emitted = text.len();
        delta
    }
}
