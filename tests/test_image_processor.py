"""`seedbar-images` against Hugging Face's image processors: for images Pillow writes (PNG,
JPEG, WebP, GIF; RGB, RGBA, grayscale, palette; EXIF-rotated; up- and downscaled) and processor
configs like Gemma 3's (bilinear), CLIP's (bicubic) and Qwen2-VL's (each picture at its own size
within a pixel budget), the pixel tensor of the crate's `preprocess` example is bit-identical to
the PIL backend's `pixel_values[0]` (for Qwen2-VL, its flattened patches laid back out). JPEGs are the
exception the decoders make: the `image` crate's JPEG decoder and libjpeg-turbo (Pillow's)
round their IDCT and chroma upsampling differently, so a JPEG's pixels agree within a few
8-bit levels (the resize, rescale and normalization are still Pillow's and numpy's, which the
lossless formats show bit for bit)."""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps
from transformers.image_utils import load_image
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from conftest import ROOT

CRATE = ROOT / "crates" / "seedbar-images"
EXAMPLE = ROOT / "target" / "debug" / "examples" / "preprocess"

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

PROCESSORS = {
    "gemma3-224": lambda: Gemma3ImageProcessorPil(),
    "gemma3-896": lambda: Gemma3ImageProcessorPil(size={"height": 896, "width": 896}),
    "clip-bicubic": lambda: Gemma3ImageProcessorPil(
        size={"height": 336, "width": 336}, resample=3, image_mean=CLIP_MEAN, image_std=CLIP_STD
    ),
    # At most 256 tokens (200,704 pixels): the 640x480 photo is scaled down, the 7x5 one up.
    "qwen2-vl": lambda: Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=28 * 28 * 256),
}


@pytest.fixture(scope="session")
def preprocess() -> Path:
    """The example binary, built when missing or older than the crate's sources."""
    sources = [CRATE / "Cargo.toml", *CRATE.rglob("*.rs")]
    newest = max(path.stat().st_mtime for path in sources)
    if not EXAMPLE.exists() or EXAMPLE.stat().st_mtime < newest:
        subprocess.run(
            ["cargo", "build", "-p", "seedbar-images", "--example", "preprocess"],
            cwd=ROOT,
            check=True,
        )
    return EXAMPLE


def photo(width: int, height: int, seed: int = 0) -> np.ndarray:
    """Photo-like RGB: smooth gradients with noise on top."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 128 / (width + height)], -1)
    return np.clip(base + rng.normal(0, 25, (height, width, 3)), 0, 255).astype(np.uint8)


def with_transparency(rgb: np.ndarray) -> Image.Image:
    height, width = rgb.shape[:2]
    alpha = np.tile(np.linspace(0, 255, width).astype(np.uint8), (height, 1))
    alpha[: height // 4] = 0
    alpha[-height // 4 :] = 255
    return Image.fromarray(np.dstack([rgb, alpha]), "RGBA")


def transparent_gif(path: Path) -> None:
    """A 64-colour palette image whose colour 0, used by a block of pixels, is transparent."""
    palette_image = Image.fromarray(photo(160, 120, seed=4)).quantize(colors=64)
    indices = np.array(palette_image)
    indices[10:50, 20:90] = 0
    gif = Image.fromarray(indices, "P")
    gif.putpalette(palette_image.getpalette())
    gif.save(path, transparency=0)


def oriented(path: Path, orientation: int, metadata: str = "exif") -> None:
    """A 64×48 image whose EXIF (or XMP) says to show it turned by `orientation`."""
    image = Image.fromarray(photo(64, 48, seed=orientation))
    options = {".jpg": {"quality": 90}, ".webp": {"lossless": True}}.get(path.suffix, {})
    if metadata == "exif":
        exif = Image.Exif()
        exif[0x0112] = orientation
        options["exif"] = exif
    else:
        options["xmp"] = (
            '<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF><rdf:Description '
            f'tiff:Orientation="{orientation}"/></rdf:RDF></x:xmpmeta>'
        ).encode()
    image.save(path, **options)


def write_images(folder: Path) -> dict[str, Path]:
    image = Image.fromarray(photo(640, 480))
    writers = {
        "photo.png": lambda path: image.save(path),
        "photo.jpg": lambda path: image.save(path, quality=90),
        "progressive.jpg": lambda path: image.save(path, quality=85, progressive=True),
        "rotated.jpg": lambda path: oriented(path, 6),
        "alpha.png": lambda path: with_transparency(photo(320, 240, seed=1)).save(path),
        "gray.png": lambda path: image.convert("L").save(path),
        "tiny.png": lambda path: Image.fromarray(photo(7, 5, seed=2)).save(path),
        "wide.webp": lambda path: Image.fromarray(photo(1000, 300, seed=3)).save(path),
        # Widened and shortened at once to 896x896 (and shortened most to 336 and 224): Pillow
        # 13 runs such a resize's vertical pass first.
        "tall.png": lambda path: Image.fromarray(photo(300, 1200, seed=5)).save(path),
        "palette.gif": transparent_gif,
    }
    paths = {}
    for name, write in writers.items():
        paths[name] = folder / name
        write(paths[name])
    return paths


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, Path]:
    return write_images(tmp_path_factory.mktemp("images"))


def processor_input(path: Path) -> Image.Image:
    """The image as transformers' `load_image` hands it to a processor. `load_image` ends
    with `.convert("RGB")`, which drops an alpha channel without compositing (a transparent
    palette colour survives it as `info["transparency"]`, which the processor composites).
    Seedbar composites alpha over white as the processor's own `convert_to_rgb` does for a
    PIL image, so an image with an alpha channel is handed over before that conversion, with
    its EXIF orientation applied as `load_image` would."""
    with Image.open(path) as opened:
        has_alpha_channel = "A" in opened.getbands()
    if not has_alpha_channel:
        return load_image(str(path))
    return ImageOps.exif_transpose(Image.open(path))


def hf_pixels(processor, path: Path) -> np.ndarray:
    out = processor(images=processor_input(path), return_tensors="np")
    pixels = out["pixel_values"]
    if "image_grid_thw" in out:
        # Qwen2-VL's rows: 2x2 blocks of 14x14 patches, each (channel, time, row, column).
        _, gh, gw = out["image_grid_thw"][0]
        m, p = processor.merge_size, processor.patch_size
        patches = pixels.reshape(gh // m, gw // m, m, m, 3, processor.temporal_patch_size, p, p)[:, :, :, :, :, 0]
        pixels = patches.transpose(4, 0, 2, 5, 1, 3, 6).reshape(3, gh * p, gw * p)
    else:
        pixels = pixels[0]
    assert pixels.dtype == np.float32
    return pixels


# How far two JPEG decoders' samples may part, in 8-bit levels: at most, and on average.
JPEG_LEVELS = (6, 0.75)


def assert_same_pixels(got: np.ndarray, expected: np.ndarray, processor, image: Path) -> None:
    """Bit-identical, or for a JPEG within JPEG_LEVELS of the decoded samples."""
    assert got.shape == expected.shape
    if image.suffix != ".jpg":
        mismatched = np.count_nonzero(got != expected)
        assert np.array_equal(got, expected), (
            f"{mismatched} of {got.size} values differ, "
            f"largest difference {np.abs(got - expected).max()}"
        )
        return
    std = np.array(processor.image_std if processor.do_normalize else [1.0] * 3).reshape(3, 1, 1)
    levels = np.abs(got - expected) * std / processor.rescale_factor
    most, mean = JPEG_LEVELS
    assert levels.max() <= most and levels.mean() <= mean, (
        f"JPEG samples part by up to {levels.max():.2f} levels (mean {levels.mean():.3f})"
    )


def seedbar_pixels(preprocess: Path, image: Path, processor, folder: Path) -> np.ndarray:
    config = folder / "preprocessor_config.json"
    config.write_text(json.dumps(processor.to_dict()))
    out = folder / "pixels.f32"
    proc = subprocess.run(
        [str(preprocess), str(image), str(config), str(out)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    height, width = map(int, proc.stdout.split())
    return np.fromfile(out, dtype="<f4").reshape(3, height, width)


IMAGES = [
    "photo.png",
    "photo.jpg",
    "progressive.jpg",
    "rotated.jpg",
    "alpha.png",
    "gray.png",
    "tiny.png",
    "wide.webp",
    "tall.png",
    "palette.gif",
]


@pytest.mark.parametrize("processor_name", PROCESSORS)
@pytest.mark.parametrize("image_name", IMAGES)
def test_pixels_are_bit_identical(preprocess, images, processor_name, image_name, tmp_path):
    processor = PROCESSORS[processor_name]()
    expected = hf_pixels(processor, images[image_name])
    got = seedbar_pixels(preprocess, images[image_name], processor, tmp_path)
    assert_same_pixels(got, expected, processor, images[image_name])


def pass_orders_that_matter(count: int, seed: int = 7):
    """`count` random resizes (input size, output size, filter) whose bytes depend on which pass
    runs first, half of them where Pillow 13 runs the vertical pass first, plus the edge of its
    rule (the height shrinking by exactly twice as many pixels as the width)."""
    rng = np.random.default_rng(seed)
    found = {True: [], False: []}
    while min(map(len, found.values())) < count // 2:
        iw, ih, ow, oh = (int(v) for v in rng.integers(8, 240, 4))
        filter_ = [Image.BILINEAR, Image.BICUBIC][int(rng.integers(2))]
        if iw == ow or ih == oh:
            continue
        picture = Image.fromarray(photo(iw, ih, seed=iw * ih))
        horizontal = picture.resize((ow, ih), filter_).resize((ow, oh), filter_)
        vertical = picture.resize((iw, oh), filter_).resize((ow, oh), filter_)
        if horizontal.tobytes() != vertical.tobytes():
            ran = picture.resize((ow, oh), filter_).tobytes()
            found[ran == vertical.tobytes()].append(((iw, ih), (ow, oh), filter_))
    edge = [((100, 100), (80, 60), Image.BICUBIC), ((100, 100), (80, 59), Image.BICUBIC)]
    return found[True][: count // 2] + found[False][: count // 2] + edge


@pytest.mark.parametrize("size, out, filter_", pass_orders_that_matter(16))
def test_the_pass_order_is_pillows(preprocess, size, out, filter_, tmp_path):
    """Pillow 13 resizes vertically first where the height shrinks by more than twice as many
    pixels as the width; the 8-bit rounding between the passes makes the order show in the
    bytes. Each case here is one where it does, on a noisy picture."""
    path = tmp_path / "picture.png"
    Image.fromarray(photo(*size, seed=size[0] * size[1])).save(path)
    processor = Gemma3ImageProcessorPil(size={"width": out[0], "height": out[1]}, resample=filter_)
    assert_same_pixels(seedbar_pixels(preprocess, path, processor, tmp_path), hf_pixels(processor, path), processor, path)


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize(
    "suffix, metadata", [(".jpg", "exif"), (".png", "exif"), (".webp", "exif"), (".jpg", "xmp")]
)
def test_every_orientation_matches(preprocess, suffix, metadata, orientation, tmp_path):
    path = tmp_path / f"orientation-{orientation}{suffix}"
    oriented(path, orientation, metadata)
    # No resize, so the pixels show the orientation itself.
    processor = Gemma3ImageProcessorPil(do_resize=False)
    expected = hf_pixels(processor, path)
    got = seedbar_pixels(preprocess, path, processor, tmp_path)
    assert_same_pixels(got, expected, processor, path)


def test_a_bad_image_exits_2_with_a_message(preprocess, images, tmp_path):
    config = tmp_path / "preprocessor_config.json"
    config.write_text(json.dumps(Gemma3ImageProcessorPil().to_dict()))
    truncated = tmp_path / "truncated.jpg"
    truncated.write_bytes(images["photo.jpg"].read_bytes()[:5000])
    bmp = tmp_path / "image.bmp"
    Image.new("RGB", (4, 4)).save(bmp)
    cases = {
        truncated: "could not be decoded",
        bmp: "PNG, JPEG, WebP or GIF",
        tmp_path / "missing.png": "cannot read",
    }
    for image, message in cases.items():
        proc = subprocess.run(
            [str(preprocess), str(image), str(config), str(tmp_path / "out.f32")],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 2, proc
        assert message in proc.stderr, proc.stderr
        assert proc.stdout == ""
