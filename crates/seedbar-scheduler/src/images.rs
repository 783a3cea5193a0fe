//! Images in a request's prompt. At submission their soft tokens are swapped for keys
//! derived from the image's content ([`key_images`]), so the prefix caches, which compare
//! token ids, never give one image's KV to another; a step feeds the model's own soft token
//! there ([`fed_token`]) and embeds the image's features instead ([`ImageFeatures`]), which
//! are encoded on the engine thread the first time a prefill chunk covers the image.

use std::collections::VecDeque;

use mlx_rs::Array;
use seedbar_engine::{
    step::{groups::rows_in, Embedded, RowPositions},
    ImageTokens, Model,
};
use seedbar_images::Pixels;

use crate::{
    request::{PromptImage, Request},
    row::Row,
};

/// Set on every image key: vocabularies are far smaller, so a key is never a token id.
const IMAGE_KEY: u32 = 1 << 31;

/// Encoded images kept for later rows (the same image in another request or choice).
const KEPT: usize = 8;

/// The key of the `k`-th soft token of the image whose content digest is `digest`.
fn image_key(digest: &[u8; 32], k: usize) -> u32 {
    let seed = u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"));
    // splitmix64 of the digest and the position: each key is its own 31 bits.
    let mut z = seed.wrapping_add((k as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    IMAGE_KEY | (z as u32 & !IMAGE_KEY)
}

/// Whether `token` is an image key rather than a token id.
pub(crate) fn is_image_key(token: u32) -> bool {
    token & IMAGE_KEY != 0
}

/// The id a step feeds for `token`: the model's soft token for an image key (its embedding
/// is replaced by the image's features), the token itself otherwise.
pub(crate) fn fed_token(token: u32, soft_token: u32) -> u32 {
    if is_image_key(token) {
        soft_token
    } else {
        token
    }
}

/// How a model takes images, as the scheduler checks and feeds them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ImageSlots {
    pub(crate) soft_token: u32,
    pub(crate) tokens: ImageTokens,
}

impl ImageSlots {
    pub(crate) fn of(model: &Model) -> Option<ImageSlots> {
        model.vision.as_ref().map(|v| ImageSlots {
            soft_token: v.prompt.image_token,
            tokens: v.prompt.tokens,
        })
    }
}

/// Where a request's tokens sit for RoPE (on its images' grids for a multimodal-RoPE model).
pub(crate) fn row_positions(request: &Request, slots: Option<ImageSlots>) -> RowPositions {
    match slots {
        Some(slots) if !request.images.is_empty() => slots
            .tokens
            .row_positions(request.images.iter().map(|i| (i.at, &*i.pixels))),
        _ => RowPositions::default(),
    }
}

/// Check that each image of `images` stands on a run of the model's soft tokens in `prompt`
/// (apart from the others) and put its keys there.
pub(crate) fn key_images(
    prompt: &mut [u32],
    images: &[PromptImage],
    slots: Option<ImageSlots>,
) -> Result<(), String> {
    if images.is_empty() {
        return Ok(());
    }
    let Some(slots) = slots else {
        return Err("this model does not take images".into());
    };
    for image in images {
        let n = slots.tokens.of(&image.pixels);
        let span = image.at..image.at + n;
        let soft = prompt
            .get(span.clone())
            .is_some_and(|run| run.iter().all(|&t| t == slots.soft_token));
        if !soft {
            return Err(format!(
                "an image at prompt position {} does not stand on {n} of the model's image tokens",
                image.at
            ));
        }
        for (k, t) in prompt[span].iter_mut().enumerate() {
            *t = image_key(&image.digest, k);
        }
    }
    Ok(())
}

/// Images' features, encoded on the engine thread and kept for the most recent few.
#[derive(Default)]
pub(crate) struct ImageFeatures {
    kept: VecDeque<([u8; 32], Array)>,
}

impl ImageFeatures {
    /// `image`'s features (`[tokens, D]`), encoded now unless kept.
    fn of(
        &mut self,
        model: &Model,
        digest: &[u8; 32],
        pixels: &Pixels,
    ) -> seedbar_engine::Result<Array> {
        if let Some((_, features)) = self.kept.iter().find(|(d, _)| d == digest) {
            return Ok(features.clone());
        }
        let vision = model.vision.as_ref().ok_or_else(|| {
            seedbar_engine::EngineError::InvalidRequest("this model does not take images".into())
        })?;
        let features = vision.encode(pixels)?;
        if self.kept.len() == KEPT {
            self.kept.pop_front();
        }
        self.kept.push_back((*digest, features.clone()));
        Ok(features)
    }

    /// The features a step embeds for prefill chunks that cover images: `chunks` are the
    /// step's rows in order with the number of input tokens each runs; a prefilling row's
    /// chunk starts at its `fed` length. Positions are the step's input positions.
    pub(crate) fn for_step<'r>(
        &mut self,
        model: &Model,
        chunks: impl Iterator<Item = (&'r Row, usize)>,
    ) -> seedbar_engine::Result<Vec<(usize, Array)>> {
        let mut embeds = Vec::new();
        let mut base = 0;
        let Some(slots) = ImageSlots::of(model) else {
            return Ok(embeds);
        };
        for (row, len) in chunks {
            if row.prefilling() {
                let (start, end) = (row.fed.len(), row.fed.len() + len);
                for image in &row.request.images {
                    if image.at >= end || image.at + slots.tokens.of(&image.pixels) <= start {
                        continue;
                    }
                    let features = self.of(model, &image.digest, &image.pixels)?;
                    if let Some((offset, rows)) = rows_in(image.at, &features, start, end) {
                        embeds.push((base + offset, rows));
                    }
                }
            }
            base += len;
        }
        Ok(embeds)
    }
}

/// The step's [`Embedded`] views of `embeds`.
pub(crate) fn embedded(embeds: &[(usize, Array)]) -> Vec<Embedded<'_>> {
    embeds
        .iter()
        .map(|(at, features)| Embedded { at: *at, features })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn image(at: usize, byte: u8) -> PromptImage {
        PromptImage {
            at,
            digest: [byte; 32],
            pixels: Arc::new(Pixels {
                height: 0,
                width: 0,
                data: Vec::new(),
            }),
        }
    }

    #[test]
    fn keys_tell_images_and_positions_apart_and_are_never_token_ids() {
        let slots = Some(ImageSlots {
            soft_token: 7,
            tokens: ImageTokens::Fixed(3),
        });
        let mut a = vec![1, 7, 7, 7, 2];
        let mut b = a.clone();
        key_images(&mut a, &[image(1, 1)], slots).unwrap();
        key_images(&mut b, &[image(1, 2)], slots).unwrap();
        assert_eq!((a[0], a[4]), (1, 2));
        assert!(a[1..4].iter().all(|&t| is_image_key(t)));
        assert_ne!(a[1..4], b[1..4]);
        assert_ne!(a[1], a[2]);
        assert_eq!(fed_token(a[2], 7), 7);
        assert_eq!(fed_token(5, 7), 5);
        let mut again = vec![1, 7, 7, 7, 2];
        key_images(&mut again, &[image(1, 1)], slots).unwrap();
        assert_eq!(again, a, "the same image keys the same way");
    }

    #[test]
    fn an_image_off_its_soft_tokens_or_for_a_text_model_is_refused() {
        let slots = Some(ImageSlots {
            soft_token: 7,
            tokens: ImageTokens::Fixed(3),
        });
        let mut prompt = vec![1, 7, 7, 2];
        assert!(key_images(&mut prompt, &[image(1, 1)], slots).is_err());
        assert!(key_images(&mut prompt, &[image(9, 1)], slots).is_err());
        let err = key_images(&mut prompt, &[image(1, 1)], None).unwrap_err();
        assert!(err.contains("does not take images"), "{err}");
        assert!(key_images(&mut prompt, &[], None).is_ok());
    }
}
