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

use super::quants::{type_name, Decoded, GgmlType};
use crate::error::{EngineError, Result};

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions.
const MAX_DIMS: u32 = 4;

/// A metadata value: integers of every width as [`Value::Integer`] (a `u64` past
/// `i64::MAX` saturates), both float widths as [`Value::Float`].
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Integer(i64),
    Float(f64),
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
        let (mut reader, tensor_count, kv_count) = Reader::open(path)?;
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
            Some(Value::Integer(a)) if *a >= 1 => *a as u64,
            Some(_) => return Err(reader.bad("`general.alignment` is not a positive integer")),
        };
        Ok(GgufFile {
            path: path.to_path_buf(),
            metadata,
            tensors,
            data_start: reader.at.div_ceil(alignment) * alignment,
            len: reader.len,
        })
    }

    /// The text value of metadata `key`, read no further into the file than it lies (a
    /// model listing asks for `general.architecture`, which writers put first).
    pub fn text_value(path: &Path, key: &str) -> Result<Option<String>> {
        let (mut reader, _, kv_count) = Reader::open(path)?;
        for _ in 0..kv_count {
            let found = reader.string()? == key;
            let kind = reader.u32()?;
            match reader.value(kind)? {
                Value::Text(text) if found => return Ok(Some(text)),
                _ if found => return Ok(None),
                _ => {}
            }
        }
        Ok(None)
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// Every metadata key and its value.
    pub fn metadata(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.metadata.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Each tensor's shape (row-major) and ggml type id, as the directory lists them.
    pub fn tensor_types(&self) -> impl Iterator<Item = (&[u64], u32)> {
        self.tensors.iter().map(|t| (t.shape.as_slice(), t.type_id))
    }

    /// Every tensor, named as in the file. A block-quantized tensor that MLX's affine
    /// quantization holds exactly becomes three arrays: `<stem>.weight` (packed `uint32`
    /// codes), `<stem>.scales` and `<stem>.biases` (groups of 32, in `dtype`), and so does
    /// Q6_K (groups of 16) when `small_groups`; other quantized tensors are dequantized to
    /// `dtype`; float tensors keep their own dtype.
    pub fn tensors(&self, dtype: Dtype, small_groups: bool) -> Result<HashMap<String, Array>> {
        let mut file = File::open(&self.path).map_err(|e| EngineError::io(&self.path, e))?;
        let mut arrays = HashMap::new();
        for info in &self.tensors {
            let kind = GgmlType::from_id(info.type_id).ok_or_else(|| {
                self.bad(format!(
                    "tensor `{}` has ggml type {}, which Seedbar does not read (it reads {})",
                    info.name,
                    type_name(info.type_id),
                    GgmlType::supported()
                ))
            })?;
            let bytes = self.tensor_bytes(&mut file, info, kind)?;
            let shape: Vec<i32> = info.shape.iter().map(|&d| d as i32).collect();
            let (stem, _) = info.name.rsplit_once('.').unwrap_or((&info.name, ""));
            match kind.decode(&bytes, small_groups) {
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
                    group,
                } => {
                    let cols = *shape.last().expect("at least one dimension");
                    let with_last = |last: i32| {
                        let mut s = shape.clone();
                        *s.last_mut().expect("at least one dimension") = last;
                        s
                    };
                    let packed = with_last(cols * bits as i32 / 32);
                    let groups = with_last(cols / group as i32);
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
        if info.shape.iter().any(|&d| d == 0 || d > i32::MAX as u64)
            || !cols.is_multiple_of(per_block as u64)
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

impl<'a> Reader<'a> {
    /// A reader past the header of the file at `path`, with its tensor and metadata counts.
    fn open(path: &'a Path) -> Result<(Self, usize, usize)> {
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
        Ok((reader, tensor_count, kv_count))
    }

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
        let integer = |n: i64| Ok(Value::Integer(n));
        match kind {
            0 => integer(i64::from(u8::from_le_bytes(self.array()?))),
            1 => integer(i64::from(i8::from_le_bytes(self.array()?))),
            2 => integer(i64::from(u16::from_le_bytes(self.array()?))),
            3 => integer(i64::from(i16::from_le_bytes(self.array()?))),
            4 => integer(i64::from(self.u32()?)),
            5 => integer(i64::from(i32::from_le_bytes(self.array()?))),
            6 => Ok(Value::Float(f64::from(f32::from_le_bytes(self.array()?)))),
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
            10 => integer(i64::try_from(self.u64()?).unwrap_or(i64::MAX)),
            11 => integer(i64::from_le_bytes(self.array()?)),
            12 => Ok(Value::Float(f64::from_le_bytes(self.array()?))),
            other => Err(self.bad(format!("unknown metadata value type {other}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use half::f16;
    use mlx_rs::{ops, Dtype};

    use super::{GgufFile, Value};

    fn string(bytes: &mut Vec<u8>, s: &str) {
        bytes.extend((s.len() as u64).to_le_bytes());
        bytes.extend(s.as_bytes());
    }

    /// A GGUF v3 file: the architecture and an array of strings, then one Q8_0 tensor of
    /// 2 x 32 values, row `r` holding `0.5 * (i - 16 + r)`.
    fn small_file() -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        string(&mut b, "general.architecture");
        b.extend(8u32.to_le_bytes());
        string(&mut b, "llama");
        string(&mut b, "tokenizer.ggml.tokens");
        b.extend(9u32.to_le_bytes());
        b.extend(8u32.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        string(&mut b, "a");
        string(&mut b, "b");
        string(&mut b, "w.weight");
        b.extend(2u32.to_le_bytes());
        for dim in [32u64, 2] {
            b.extend(dim.to_le_bytes());
        }
        b.extend(8u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.resize(b.len().div_ceil(32) * 32, 0);
        for row in 0..2i8 {
            b.extend(f16::from_f32(0.5).to_le_bytes());
            b.extend((0..32i8).map(|i| (i - 16 + row) as u8));
        }
        b
    }

    #[test]
    fn a_small_file_reads_and_every_truncation_of_it_is_an_error() {
        let path = std::env::temp_dir().join(format!("seedbar-gguf-{}.gguf", std::process::id()));
        let whole = small_file();
        std::fs::write(&path, &whole).unwrap();
        let file = GgufFile::open(&path).unwrap();
        assert_eq!(
            file.get("general.architecture"),
            Some(&Value::Text("llama".into()))
        );
        assert_eq!(
            GgufFile::text_value(&path, "general.architecture").unwrap(),
            Some("llama".into())
        );
        let tensors = file.tensors(Dtype::Float32, false).unwrap();
        let [w, scales, biases] =
            ["weight", "scales", "biases"].map(|p| &tensors[&format!("w.{p}")]);
        let values = ops::dequantize(w, scales, biases, 32, 8).unwrap();
        let expected: Vec<f32> = (0..2)
            .flat_map(|r| (0..32).map(move |i| 0.5 * (i - 16 + r) as f32))
            .collect();
        assert_eq!(values.as_slice::<f32>(), expected);

        for len in 0..whole.len() {
            std::fs::write(&path, &whole[..len]).unwrap();
            let read = GgufFile::open(&path).and_then(|f| f.tensors(Dtype::Float32, false));
            assert!(read.is_err(), "{len} bytes read as a whole file");
        }
        std::fs::remove_file(&path).unwrap();
    }
}
