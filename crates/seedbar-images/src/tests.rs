//! Unit tests: resampling against hand-computed Pillow values, decoding errors, alpha,
//! EXIF orientation, the preprocessor's arithmetic. Bit-exactness against Pillow and
//! transformers on real images is checked by `tests/test_image_processor.py`.

use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::PngEncoder;
use image::{ExtendedColorType, ImageEncoder};

use crate::decode::over_white;
use crate::resample::{resize, Filter};
use crate::{
    decode, digest, media_type, ImageError, Limits, PixelBudget, Preprocessor, Resize, Rgb8, Size,
};

fn rgb(width: u32, height: u32, data: Vec<u8>) -> Rgb8 {
    assert_eq!(data.len(), (width * height * 3) as usize);
    Rgb8 {
        width,
        height,
        data,
    }
}

/// A deterministic, uneven test pattern.
fn pattern(width: u32, height: u32) -> Rgb8 {
    let data = (0..width * height * 3)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    rgb(width, height, data)
}

fn png(width: u32, height: u32, color: ExtendedColorType, data: &[u8]) -> Vec<u8> {
    let mut encoded = Vec::new();
    PngEncoder::new(&mut encoded)
        .write_image(data, width, height, color)
        .unwrap();
    encoded
}

fn jpeg(image: &Rgb8) -> Vec<u8> {
    let mut encoded = Vec::new();
    JpegEncoder::new_with_quality(&mut encoded, 95)
        .write_image(
            &image.data,
            image.width,
            image.height,
            ExtendedColorType::Rgb8,
        )
        .unwrap();
    encoded
}

// ---------------------------------------------------------------------------------------
// Resampling

#[test]
fn resize_to_the_same_size_is_the_identity() {
    let image = pattern(13, 7);
    for filter in [Filter::Bilinear, Filter::Bicubic] {
        assert_eq!(resize(&image, 13, 7, filter), image);
    }
}

#[test]
fn a_constant_image_stays_constant() {
    let image = rgb(9, 5, [12, 200, 255].repeat(45));
    for filter in [Filter::Bilinear, Filter::Bicubic] {
        for (width, height) in [(4, 3), (20, 11), (9, 2), (1, 1), (31, 5)] {
            let resized = resize(&image, width, height, filter);
            assert_eq!(
                resized,
                rgb(
                    width,
                    height,
                    [12, 200, 255].repeat((width * height) as usize)
                )
            );
        }
    }
}

#[test]
fn halving_two_pixels_averages_them_rounding_half_up() {
    // Both weights are 1/2 = 2^21 in 22-bit fixed point; the sum starts at 2^21.
    // (10 + 21) / 2 = 15.5 -> 16, (20 + 40) / 2 = 30, (30 + 61) / 2 = 45.5 -> 46.
    let horizontal = rgb(2, 1, vec![10, 20, 30, 21, 40, 61]);
    let vertical = rgb(1, 2, vec![10, 20, 30, 21, 40, 61]);
    for filter in [Filter::Bilinear, Filter::Bicubic] {
        assert_eq!(resize(&horizontal, 1, 1, filter).data, [16, 30, 46]);
        assert_eq!(resize(&vertical, 1, 1, filter).data, [16, 30, 46]);
    }
}

#[test]
fn bilinear_doubling_interpolates_between_pixel_centres() {
    // Output centres 0.25, 0.75, 1.25, 1.75: the outer ones see only the nearest pixel.
    let image = rgb(2, 1, vec![0, 0, 0, 100, 100, 100]);
    let resized = resize(&image, 4, 1, Filter::Bilinear);
    assert_eq!(
        resized.data,
        [0, 0, 0, 25, 25, 25, 75, 75, 75, 100, 100, 100]
    );
}

#[test]
fn bicubic_overshoot_is_clipped() {
    let image = rgb(
        4,
        1,
        [0, 0, 0, 0, 0, 0, 255, 255, 255, 255, 255, 255].to_vec(),
    );
    let resized = resize(&image, 8, 1, Filter::Bicubic);
    assert!(resized.data.contains(&0) && resized.data.contains(&255));
}

#[test]
fn resample_codes_are_pillows() {
    assert_eq!(Filter::try_from(2), Ok(Filter::Bilinear));
    assert_eq!(Filter::try_from(3), Ok(Filter::Bicubic));
    let refused = Filter::try_from(1).unwrap_err();
    assert!(refused.contains("2 (bilinear) or 3 (bicubic)"), "{refused}");
}

// ---------------------------------------------------------------------------------------
// Decoding

#[test]
fn decode_errors_are_errors() {
    let limits = Limits::default();
    assert_eq!(decode(&[], &limits), Err(ImageError::Empty));
    assert_eq!(
        decode(b"hello, world", &limits),
        Err(ImageError::UnsupportedFormat)
    );
    let message = ImageError::UnsupportedFormat.to_string();
    assert!(message.contains("PNG, JPEG, WebP or GIF"), "{message}");

    let image = pattern(40, 30);
    let encoded_png = png(40, 30, ExtendedColorType::Rgb8, &image.data);
    let encoded_jpeg = jpeg(&image);
    // A JPEG cut anywhere lacks its end marker, which Pillow refuses too; a PNG cut
    // after its pixel data is still whole enough for Pillow and for `image`.
    let cuts = [
        (&encoded_png, vec![8, 40, encoded_png.len() / 2]),
        (
            &encoded_jpeg,
            vec![8, 40, encoded_jpeg.len() / 2, encoded_jpeg.len() - 1],
        ),
    ];
    for (encoded, cuts) in cuts {
        for cut in cuts {
            let result = decode(&encoded[..cut], &limits);
            assert!(
                matches!(result, Err(ImageError::Corrupt(_))),
                "truncated at {cut}: {:?}",
                result.map(|image| (image.width, image.height))
            );
        }
        let small = Limits {
            max_pixels: 40 * 30 - 1,
            ..limits
        };
        assert_eq!(
            decode(encoded, &small),
            Err(ImageError::TooManyPixels {
                width: 40,
                height: 30,
                max: 1199
            })
        );
        let short = Limits {
            max_bytes: encoded.len() - 1,
            ..limits
        };
        assert_eq!(
            decode(encoded, &short),
            Err(ImageError::TooLarge {
                bytes: encoded.len(),
                max: encoded.len() - 1
            })
        );
    }
    // Garbage after valid magic bytes (it may read as a huge size, also an error).
    for magic in [
        &b"\x89PNG\r\n\x1a\n"[..],
        b"\xFF\xD8\xFF",
        b"GIF89a",
        b"RIFF\0\0\0\0WEBP",
    ] {
        let mut bytes = magic.to_vec();
        bytes.extend((0..200u32).map(|i| (i * 37) as u8));
        let result = decode(&bytes, &limits);
        assert!(
            matches!(
                result,
                Err(ImageError::Corrupt(_) | ImageError::TooManyPixels { .. })
            ),
            "{magic:?}: {:?}",
            result.map(|image| (image.width, image.height))
        );
    }
}

#[test]
fn media_types_come_from_magic_bytes() {
    let image = pattern(4, 4);
    assert_eq!(
        media_type(&png(4, 4, ExtendedColorType::Rgb8, &image.data)),
        Some("image/png")
    );
    assert_eq!(media_type(&jpeg(&image)), Some("image/jpeg"));
    assert_eq!(media_type(b"GIF87a..."), Some("image/gif"));
    assert_eq!(media_type(b"RIFF\0\0\0\0WEBPVP8 "), Some("image/webp"));
    assert_eq!(media_type(b"BM\0\0"), None);
    assert_eq!(media_type(b""), None);
}

#[test]
fn png_decodes_exactly() {
    let image = pattern(17, 9);
    let encoded = png(17, 9, ExtendedColorType::Rgb8, &image.data);
    assert_eq!(decode(&encoded, &Limits::default()).unwrap(), image);
}

#[test]
fn grayscale_is_expanded_and_16_bit_gray_clips_like_pillow() {
    let gray = png(3, 1, ExtendedColorType::L8, &[0, 7, 255]);
    let decoded = decode(&gray, &Limits::default()).unwrap();
    assert_eq!(decoded.data, [0, 0, 0, 7, 7, 7, 255, 255, 255]);

    // Pillow opens 16-bit grayscale as `I;16`, and its conversion to RGB clips at 255.
    let samples: Vec<u8> = [200u16, 1000]
        .iter()
        .flat_map(|v| v.to_ne_bytes())
        .collect();
    let deep = png(2, 1, ExtendedColorType::L16, &samples);
    let decoded = decode(&deep, &Limits::default()).unwrap();
    assert_eq!(decoded.data, [200, 200, 200, 255, 255, 255]);
}

#[test]
fn alpha_is_composited_over_white_with_pillows_rounding() {
    // Values from `PIL.Image.alpha_composite(white, pixel)`.
    assert_eq!(over_white([0, 0, 0], 128), [127, 127, 127]);
    assert_eq!(over_white([200, 200, 200], 1), [255, 255, 255]);
    assert_eq!(over_white([10, 10, 10], 254), [11, 11, 11]);
    assert_eq!(over_white([1, 2, 3], 0), [255, 255, 255]);
    assert_eq!(over_white([1, 2, 3], 255), [1, 2, 3]);

    let rgba = [0, 0, 0, 128, 9, 8, 7, 255, 50, 60, 70, 0];
    let encoded = png(3, 1, ExtendedColorType::Rgba8, &rgba);
    let decoded = decode(&encoded, &Limits::default()).unwrap();
    assert_eq!(decoded.data, [127, 127, 127, 9, 8, 7, 255, 255, 255]);
}

#[test]
fn a_flat_jpeg_decodes_flat() {
    let image = rgb(24, 16, [90, 140, 200].repeat(24 * 16));
    let decoded = decode(&jpeg(&image), &Limits::default()).unwrap();
    assert_eq!((decoded.width, decoded.height), (24, 16));
    let first = &decoded.data[..3];
    assert!(decoded.data.chunks(3).all(|pixel| pixel == first));
    for (got, want) in first.iter().zip([90, 140, 200]) {
        assert!(got.abs_diff(want) <= 2, "{first:?}");
    }
}

/// A JPEG with an `APP1` Exif segment holding just the orientation tag.
fn with_exif_orientation(jpeg: &[u8], orientation: u16) -> Vec<u8> {
    let mut tiff = Vec::new();
    tiff.extend(b"MM\0\x2a\0\0\0\x08"); // big-endian TIFF header, first IFD at 8
    tiff.extend(1u16.to_be_bytes()); // one entry
    tiff.extend(0x0112u16.to_be_bytes()); // Orientation
    tiff.extend(3u16.to_be_bytes()); // SHORT
    tiff.extend(1u32.to_be_bytes()); // one value
    tiff.extend(orientation.to_be_bytes());
    tiff.extend([0, 0]); // value padding
    tiff.extend(0u32.to_be_bytes()); // no next IFD
    let mut segment = b"Exif\0\0".to_vec();
    segment.extend(tiff);
    let mut out = jpeg[..2].to_vec(); // SOI
    out.extend([0xFF, 0xE1]);
    out.extend((segment.len() as u16 + 2).to_be_bytes());
    out.extend(segment);
    out.extend(&jpeg[2..]);
    out
}

/// `image` turned as `PIL.Image.transpose` does for each EXIF orientation.
fn transposed(image: &Rgb8, orientation: u16) -> Rgb8 {
    let (width, height) = (image.width as usize, image.height as usize);
    let swaps = orientation >= 5;
    let (out_width, out_height) = if swaps {
        (height, width)
    } else {
        (width, height)
    };
    let mut data = Vec::with_capacity(image.data.len());
    for y in 0..out_height {
        for x in 0..out_width {
            let (source_x, source_y) = match orientation {
                2 => (width - 1 - x, y),
                3 => (width - 1 - x, height - 1 - y),
                4 => (x, height - 1 - y),
                5 => (y, x),
                6 => (y, height - 1 - x),
                7 => (width - 1 - y, height - 1 - x),
                8 => (width - 1 - y, x),
                _ => (x, y),
            };
            let at = (source_y * width + source_x) * 3;
            data.extend_from_slice(&image.data[at..at + 3]);
        }
    }
    rgb(out_width as u32, out_height as u32, data)
}

#[test]
fn jpeg_exif_orientation_is_applied() {
    let encoded = jpeg(&pattern(16, 8));
    let upright = decode(&encoded, &Limits::default()).unwrap();
    for orientation in 1..=8 {
        let oriented = with_exif_orientation(&encoded, orientation);
        let decoded = decode(&oriented, &Limits::default()).unwrap();
        assert_eq!(
            decoded,
            transposed(&upright, orientation),
            "orientation {orientation}"
        );
    }
}

#[test]
fn xmp_orientation_is_the_fallback() {
    let encoded = jpeg(&pattern(16, 8));
    let upright = decode(&encoded, &Limits::default()).unwrap();
    let xmp = b"http://ns.adobe.com/xap/1.0/\0<x:xmpmeta><tiff:Orientation>6</tiff:Orientation>";
    let mut oriented = encoded[..2].to_vec();
    oriented.extend([0xFF, 0xE1]);
    oriented.extend((xmp.len() as u16 + 2).to_be_bytes());
    oriented.extend(xmp);
    oriented.extend(&encoded[2..]);
    let decoded = decode(&oriented, &Limits::default()).unwrap();
    assert_eq!(decoded, transposed(&upright, 6));
}

// ---------------------------------------------------------------------------------------
// Preprocessing

const GEMMA_LIKE: &str = r#"{
    "do_convert_rgb": null, "do_normalize": true, "do_rescale": true, "do_resize": true,
    "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Gemma3ImageProcessor",
    "image_std": [0.5, 0.5, 0.5], "resample": 2, "rescale_factor": 0.00392156862745098,
    "size": {"height": 4, "width": 3}
}"#;

#[test]
fn a_config_reads_and_defaults() {
    let preprocessor = Preprocessor::from_json(GEMMA_LIKE).unwrap();
    assert_eq!(
        preprocessor.resize,
        Resize::Fixed(Size {
            height: 4,
            width: 3
        })
    );
    assert_eq!(preprocessor.resample, Filter::Bilinear);
    assert_eq!(preprocessor.rescale_factor, 1.0 / 255.0);

    let minimal = r#"{"size": {"height": 2, "width": 2}, "resample": 3,
        "image_mean": [0.1, 0.2, 0.3], "image_std": [1, 1, 1]}"#;
    let preprocessor = Preprocessor::from_json(minimal).unwrap();
    assert!(preprocessor.do_resize && preprocessor.do_rescale && preprocessor.do_normalize);

    for bad in [
        r#"{"size": {"height": 2, "width": 2}, "resample": 0, "image_mean": [0,0,0], "image_std": [1,1,1]}"#,
        r#"{"size": {"shortest_edge": 224}, "resample": 2, "image_mean": [0,0,0], "image_std": [1,1,1]}"#,
        r#"{"size": {"height": 0, "width": 2}, "resample": 2, "image_mean": [0,0,0], "image_std": [1,1,1]}"#,
        "not json",
    ] {
        assert!(Preprocessor::from_json(bad).is_err(), "{bad}");
    }
}

#[test]
fn pixels_are_channel_first_with_numpys_arithmetic() {
    let preprocessor = Preprocessor::from_json(GEMMA_LIKE).unwrap();
    let pixels = preprocessor
        .pixels(&rgb(3, 4, [0, 51, 255].repeat(12)))
        .unwrap();
    assert_eq!((pixels.height, pixels.width, pixels.data.len()), (4, 3, 36));
    // float64 rescale rounded to float32, then float32 (x - mean) / std.
    let expected = |byte: u8| ((f64::from(byte) * (1.0 / 255.0)) as f32 - 0.5f32) / 0.5f32;
    for (channel, byte) in [0u8, 51, 255].into_iter().enumerate() {
        let plane = &pixels.data[channel * 12..(channel + 1) * 12];
        assert!(plane
            .iter()
            .all(|&v| v.to_bits() == expected(byte).to_bits()));
    }
    assert_eq!(pixels.data[0], -1.0);
    assert_eq!(pixels.data[24], 1.0);
}

#[test]
fn steps_can_be_switched_off() {
    let json = r#"{"size": {"height": 1, "width": 1}, "resample": 2, "do_resize": false,
        "do_rescale": false, "do_normalize": false, "image_mean": [0,0,0], "image_std": [1,1,1]}"#;
    let preprocessor = Preprocessor::from_json(json).unwrap();
    let pixels = preprocessor
        .pixels(&rgb(2, 1, vec![1, 2, 3, 4, 5, 6]))
        .unwrap();
    assert_eq!((pixels.height, pixels.width), (1, 2));
    assert_eq!(pixels.data, [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
}

const QWEN_LIKE: &str = r#"{
    "min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2,
    "merge_size": 2, "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Qwen2VLImageProcessor"
}"#;

#[test]
fn a_pixel_budget_reads_from_either_naming() {
    let budget = PixelBudget {
        factor: 28,
        min_pixels: 3136,
        max_pixels: 12845056,
    };
    let preprocessor = Preprocessor::from_json(QWEN_LIKE).unwrap();
    assert_eq!(preprocessor.resize, Resize::Budget(budget));
    assert_eq!(preprocessor.resample, Filter::Bicubic);
    let newer = r#"{"size": {"shortest_edge": 3136, "longest_edge": 12845056},
        "patch_size": 14, "merge_size": 2, "image_mean": [0,0,0], "image_std": [1,1,1]}"#;
    assert_eq!(
        Preprocessor::from_json(newer).unwrap().resize,
        Resize::Budget(budget)
    );
}

#[test]
fn a_pixel_budget_sizes_as_smart_resize() {
    let budget = |min, max| PixelBudget {
        factor: 28,
        min_pixels: min,
        max_pixels: max,
    };
    let size = |b: PixelBudget, w, h| {
        let s = b.size_of(w, h).unwrap();
        (s.width, s.height)
    };
    let wide = budget(3136, 12845056);
    // Each side to the nearest multiple of 28, ties to even (42 / 28 = 1.5 → 2, 70 → 2.5 → 2).
    assert_eq!(size(wide, 400, 300), (392, 308));
    assert_eq!(size(wide, 42, 70), (56, 56));
    // Too few pixels: scaled up, sides rounded up.
    assert_eq!(size(wide, 30, 20), (84, 56));
    // Too many: scaled down, sides rounded down (1000 x 1000 at most 200,000 pixels: 447.2 → 420).
    assert_eq!(size(budget(3136, 200_000), 1000, 1000), (420, 420));
    // A side under half a factor rounds to none, and the minimum scales the picture up.
    assert_eq!(size(wide, 1000, 13), (504, 28));
    // A sliver is refused, not resized.
    assert!(wide.size_of(4000, 19).is_err());
    assert!(wide.size_of(4000, 20).is_ok());
}

#[test]
fn digest_is_sha256() {
    let hex: String = digest(b"abc").iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        hex,
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
}
