//! The GGUF container, read by Seedbar itself (versions 2 and 3, little-endian): the header,
//! the metadata key/value pairs, the tensor directory, and each tensor's bytes decoded
//! (see [`super::quants`]) into MLX arrays. Every length and offset is checked against the
//! file's size before anything is allocated or read, so a truncated or hostile file gives
//! an error naming what is wrong, never a panic or a huge allocation.

use std::{
    collections::HashMap,
    fs::File,
    io::{BufReader, Read, Seek, SeekFrom},
    path::{Path, PathBuf},
};

use mlx_rs::{Array, Dtype};

use super::quants::{Decoded, GgmlType, GROUP};
use crate::error::{EngineError, Result};

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions.
const MAX_DIMS: u32 = 4;

/// A metadata value. Integers and floats of every width read as [`Value::Number`].
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Number(f64),
    Bool(bool),
    Text(String),
    Array(Vec<Value>),
}

/// One entry of the tensor directory.
struct TensorInfo {
    name: String,
    /// Row-major (outermost first; GGUF lists them innermost first).
    shape: Vec<u64>,
    /// The ggml type id.
    type_id: u32,
    /// From the start of the data section.
    offset: u64,
}

/// An opened GGUF file: its metadata, and its tensors read on demand.
pub struct GgufFile {
    path: PathBuf,
    metadata: HashMap<String, Value>,
    tensors: Vec<TensorInfo>,
    data_start: u64,
    len: u64,
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| EngineError::io(path, e))?;
        let len = file.metadata().map_err(|e| EngineError::io(path, e))?.len();
        let mut reader = Reader {
            inner: BufReader::new(file),
            at: 0,
            len,
            path,
        };
        let mut magic = [0u8; 4];
        reader.bytes_into(&mut magic)?;
        if &magic != MAGIC {
            return Err(reader.bad("it does not start with `GGUF`"));
        }
        let version = reader.u32()?;
        if !(2..=3).contains(&version) {
            return Err(reader.bad(format!("GGUF version {version} (Seedbar reads 2 and 3)")));
        }
        let tensor_count = reader.count(8)?;
        let kv_count = reader.count(8)?;
        let mut metadata = HashMap::new();
        for _ in 0..kv_count {
            let key = reader.string()?;
            let kind = reader.u32()?;
            let value = reader.value(kind)?;
            metadata.insert(key, value);
        }
        let mut tensors = Vec::with_capacity(tensor_count);
        for _ in 0..tensor_count {
            let name = reader.string()?;
            let dims = reader.u32()?;
            if dims == 0 || dims > MAX_DIMS {
                return Err(reader.bad(format!("tensor `{name}` has {dims} dimensions")));
            }
            let mut shape = (0..dims)
                .map(|_| reader.u64())
                .collect::<Result<Vec<_>>>()?;
            shape.reverse();
            let type_id = reader.u32()?;
            let offset = reader.u64()?;
            tensors.push(TensorInfo {
                name,
                shape,
                type_id,
                offset,
            });
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(Value::Number(a)) if *a >= 1.0 && a.fract() == 0.0 => *a as u64,
            Some(_) => return Err(reader.bad("`general.alignment` is not a positive integer")),
        };
        Ok(GgufFile {
            path: path.to_path_buf(),
            metadata,
            tensors,
            data_start: reader.at.div_ceil(alignment) * alignment,
            len,
        })
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// Every tensor, named as in the file. A block-quantized tensor that MLX's affine
    /// quantization holds exactly becomes three arrays: `<stem>.weight` (packed `uint32`
    /// codes), `<stem>.scales` and `<stem>.biases` (groups of 32, in `dtype`); other
    /// quantized tensors are dequantized to `dtype`; float tensors keep their own dtype.
    pub fn tensors(&self, dtype: Dtype) -> Result<HashMap<String, Array>> {
        let mut file = File::open(&self.path).map_err(|e| EngineError::io(&self.path, e))?;
        let mut arrays = HashMap::new();
        for info in &self.tensors {
            let kind = GgmlType::from_id(info.type_id).ok_or_else(|| {
                self.bad(format!(
                    "tensor `{}` has ggml type {}, which Seedbar does not read (it reads {})",
                    info.name,
                    info.type_id,
                    GgmlType::supported()
                ))
            })?;
            let bytes = self.tensor_bytes(&mut file, info, kind)?;
            let shape: Vec<i32> = info.shape.iter().map(|&d| d as i32).collect();
            let (stem, _) = info.name.rsplit_once('.').unwrap_or((&info.name, ""));
            match kind.decode(&bytes) {
                Decoded::F32(values) => {
                    let array = Array::from_slice(&values, &shape);
                    let array = if kind == GgmlType::F32 {
                        array
                    } else {
                        evaluated(array.as_dtype(dtype)?)?
                    };
                    arrays.insert(info.name.clone(), array);
                }
                Decoded::F16(values) => {
                    arrays.insert(info.name.clone(), Array::from_slice(&values, &shape));
                }
                Decoded::Bf16(values) => {
                    arrays.insert(info.name.clone(), Array::from_slice(&values, &shape));
                }
                Decoded::Affine {
                    words,
                    scales,
                    biases,
                    bits,
                } => {
                    let cols = *shape.last().expect("at least one dimension");
                    let with_last = |last: i32| {
                        let mut s = shape.clone();
                        *s.last_mut().expect("at least one dimension") = last;
                        s
                    };
                    let packed = with_last(cols * bits as i32 / 32);
                    let groups = with_last(cols / GROUP as i32);
                    arrays.insert(format!("{stem}.weight"), Array::from_slice(&words, &packed));
                    for (part, values) in [("scales", scales), ("biases", biases)] {
                        let array =
                            evaluated(Array::from_slice(&values, &groups).as_dtype(dtype)?)?;
                        arrays.insert(format!("{stem}.{part}"), array);
                    }
                }
            }
        }
        Ok(arrays)
    }

    /// The bytes of `info`'s tensor, after checking that its rows are whole blocks and that
    /// it lies inside the file.
    fn tensor_bytes(&self, file: &mut File, info: &TensorInfo, kind: GgmlType) -> Result<Vec<u8>> {
        let (per_block, block_bytes) = kind.block();
        let cols = *info.shape.last().expect("at least one dimension");
        if info.shape.iter().any(|&d| d == 0 || d > i32::MAX as u64) || cols % per_block as u64 != 0
        {
            return Err(self.bad(format!(
                "tensor `{}` of type {} has shape {:?} (rows must be whole blocks of {per_block})",
                info.name,
                kind.name(),
                info.shape
            )));
        }
        let size = info
            .shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .and_then(|values| (values / per_block as u64).checked_mul(block_bytes as u64));
        let start = self.data_start.checked_add(info.offset);
        let (Some(size), Some(start)) = (size, start) else {
            return Err(self.bad(format!("tensor `{}` is too large", info.name)));
        };
        if start.checked_add(size).is_none_or(|end| end > self.len) {
            return Err(self.bad(format!(
                "tensor `{}` ({size} bytes at {start}) runs past the end of the file ({} bytes)",
                info.name, self.len
            )));
        }
        let mut bytes = vec![0u8; size as usize];
        file.seek(SeekFrom::Start(start))
            .and_then(|_| file.read_exact(&mut bytes))
            .map_err(|e| EngineError::io(&self.path, e))?;
        Ok(bytes)
    }

    fn bad(&self, message: impl Into<String>) -> EngineError {
        EngineError::bad_file(&self.path, message)
    }
}

/// Converted now, so the decoded f32 values are freed before the next tensor is read.
fn evaluated(array: Array) -> Result<Array> {
    array.eval()?;
    Ok(array)
}

/// A reader over the header that knows how many bytes remain.
struct Reader<'a> {
    inner: BufReader<File>,
    at: u64,
    len: u64,
    path: &'a Path,
}

impl Reader<'_> {
    fn bad(&self, message: impl std::fmt::Display) -> EngineError {
        EngineError::bad_file(self.path, format!("not a readable GGUF file: {message}"))
    }

    fn bytes_into(&mut self, out: &mut [u8]) -> Result<()> {
        if self.len - self.at < out.len() as u64 {
            return Err(self.bad(format!("it ends early, at byte {}", self.len)));
        }
        self.inner
            .read_exact(out)
            .map_err(|e| EngineError::io(self.path, e))?;
        self.at += out.len() as u64;
        Ok(())
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        self.bytes_into(&mut out)?;
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A count of items at least `min_bytes` long each, which must fit in what is left.
    fn count(&mut self, min_bytes: u64) -> Result<usize> {
        let count = self.u64()?;
        if count > (self.len - self.at) / min_bytes.max(1) {
            return Err(self.bad(format!(
                "a count of {count} at byte {} exceeds the file",
                self.at
            )));
        }
        Ok(count as usize)
    }

    fn string(&mut self) -> Result<String> {
        let len = self.count(1)?;
        let mut bytes = vec![0u8; len];
        self.bytes_into(&mut bytes)?;
        String::from_utf8(bytes).map_err(|_| self.bad("a string is not UTF-8"))
    }

    /// A value of GGUF value type `kind`.
    fn value(&mut self, kind: u32) -> Result<Value> {
        let number = |n: f64| Ok(Value::Number(n));
        match kind {
            0 => number(f64::from(u8::from_le_bytes(self.array()?))),
            1 => number(f64::from(i8::from_le_bytes(self.array()?))),
            2 => number(f64::from(u16::from_le_bytes(self.array()?))),
            3 => number(f64::from(i16::from_le_bytes(self.array()?))),
            4 => number(f64::from(self.u32()?)),
            5 => number(f64::from(i32::from_le_bytes(self.array()?))),
            6 => number(f64::from(f32::from_le_bytes(self.array()?))),
            7 => Ok(Value::Bool(self.array::<1>()?[0] != 0)),
            8 => Ok(Value::Text(self.string()?)),
            9 => {
                let item_kind = self.u32()?;
                if item_kind == 9 {
                    return Err(self.bad("a metadata array holds arrays"));
                }
                let count = self.count(1)?;
                let items = (0..count)
                    .map(|_| self.value(item_kind))
                    .collect::<Result<_>>()?;
                Ok(Value::Array(items))
            }
            10 => number(self.u64()? as f64),
            11 => number(i64::from_le_bytes(self.array()?) as f64),
            12 => number(f64::from_le_bytes(self.array()?)),
            other => Err(self.bad(format!("unknown metadata value type {other}"))),
        }
    }
}
