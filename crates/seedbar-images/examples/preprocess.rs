//! `preprocess <image file> <preprocessor_config.json> <out.f32>`: decodes an image, makes
//! the model's pixel tensor of it and writes that as little-endian float32 (`[3, height,
//! width]`), printing `height width`. Errors print a readable message and exit with 2.

use std::path::Path;
use std::process::ExitCode;

use seedbar_images::{decode, Limits, Preprocessor};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [image, config, out] = args.as_slice() else {
        eprintln!("usage: preprocess <image file> <preprocessor_config.json> <out.f32>");
        return ExitCode::from(2);
    };
    match preprocess(Path::new(image), Path::new(config), Path::new(out)) {
        Ok((height, width)) => {
            println!("{height} {width}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

fn preprocess(image: &Path, config: &Path, out: &Path) -> Result<(usize, usize), String> {
    let preprocessor = Preprocessor::read(config).map_err(|e| e.to_string())?;
    let bytes =
        std::fs::read(image).map_err(|e| format!("cannot read {}: {e}", image.display()))?;
    let image = decode(&bytes, &Limits::default()).map_err(|e| e.to_string())?;
    let pixels = preprocessor.pixels(&image).map_err(|e| e.to_string())?;
    let encoded: Vec<u8> = pixels.data.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(out, encoded).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    Ok((pixels.height, pixels.width))
}
