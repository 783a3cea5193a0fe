//! The prefix cache's disk tier: finished sequences' KV kept as files in a directory, found
//! again after a restart and after the RAM tier let them go, within a byte budget (the
//! least recently used files go first). Every model's scheduler shares one [`DiskCache`].
//!
//! A file is one sequence: a header (its key, its tokens, the shortest length it can be
//! cut back to), each layer's [`KvSnapshot`], then a CRC-32 of everything before it. The
//! key names the model's files, the backend, the layout and the engine build that wrote
//! it, so a file from another model, layout or build is never used; a torn file (its size
//! is not what its header says) is dropped when the directory is read, an altered one
//! (its checksum differs) when it is loaded, and either is counted in
//! [`DiskCacheStats::rejected`]. Files are written off the engine thread, to a temporary
//! name renamed into place once whole.

use std::{
    fmt, fs,
    io::{self, BufReader, BufWriter, Read, Write},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        mpsc, Arc, Mutex, MutexGuard,
    },
    thread,
    time::{SystemTime, UNIX_EPOCH},
};

use mlx_rs::Dtype;
use seedbar_engine::{
    runtime::Backend,
    step::{
        kv_cache::{self, buffer_bytes, HostKv, KvCache, KvSnapshot, StoredKv},
        plan::Layout,
    },
};

use crate::prefix_cache::usable_prefix;

const MAGIC: &[u8; 4] = b"SBKV";
const VERSION: u32 = 1;
const EXTENSION: &str = "kv";
/// Tokens a file must hold beyond what the RAM tier has for it to be read: fewer cost about
/// as much to prefill. Shorter sequences are not written.
const MIN_REUSE: usize = 64;
/// Sequences waiting to be written; a sequence finishing while this many wait is not kept.
const WRITE_QUEUE: usize = 4;

/// What the tier has done since it was opened.
#[derive(Debug, Default)]
pub struct DiskCacheStats {
    /// Requests whose prefix came from a file.
    pub hits: AtomicU64,
    /// Files written.
    pub writes: AtomicU64,
    /// Files found torn or altered, and removed.
    pub rejected: AtomicU64,
    /// Bytes of the files kept now.
    pub bytes: AtomicU64,
}

/// The disk tier a scheduler keeps sequences in, and its model's identity there (what
/// changes when its files change: their paths, sizes and times).
#[derive(Clone)]
pub struct DiskTier {
    pub cache: Arc<DiskCache>,
    pub model: String,
}

impl fmt::Debug for DiskTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DiskTier")
            .field("dir", &self.cache.shared.dir)
            .field("model", &self.model)
            .finish()
    }
}

/// The key of a model's sequences under a layout: the model, the backend, the layout and
/// the engine build (this executable's version, size and time).
pub(crate) fn key(model: &str, layout: &Layout) -> String {
    let executable = std::env::current_exe()
        .and_then(fs::metadata)
        .map(|m| (m.len(), m.modified().map(modified_nanos).unwrap_or(0)))
        .unwrap_or_default();
    format!(
        "{model}; {:?}; {layout:?}; seedbar {} {executable:?}",
        Backend::current(),
        env!("CARGO_PKG_VERSION")
    )
}

/// The disk tier of a data directory (see the module doc).
pub struct DiskCache {
    shared: Arc<Shared>,
    writes: mpsc::SyncSender<Work>,
}

/// What the writing thread does next.
enum Work {
    Write(Job),
    /// Say when everything sent before is written.
    Flush(mpsc::Sender<()>),
}

struct Shared {
    dir: PathBuf,
    budget: AtomicU64,
    files: Mutex<Vec<File>>,
    stats: DiskCacheStats,
}

/// One file, as the index knows it.
struct File {
    name: String,
    key: String,
    tokens: Vec<u32>,
    reusable_from: i32,
    bytes: u64,
    /// Nanoseconds since the epoch of its last write or hit (its modification time).
    last_used: u128,
}

/// A sequence to write.
struct Job {
    key: String,
    tokens: Vec<u32>,
    reusable_from: i32,
    layers: Vec<KvSnapshot>,
}

/// A file [`DiskCache::find`] chose: it holds the first `usable` tokens of the prompt.
pub(crate) struct Found {
    pub(crate) usable: usize,
    name: String,
    key: String,
    tokens: Vec<u32>,
}

/// What a file's header says.
struct Header {
    key: String,
    tokens: Vec<u32>,
    reusable_from: i32,
    layers: u32,
    payload: u64,
    /// Bytes of the header itself.
    length: u64,
}

impl DiskCache {
    /// The tier kept in `dir` (created if missing) within `budget_bytes`; files over the
    /// budget, torn files and unfinished writes are removed.
    pub fn open(dir: &Path, budget_bytes: u64) -> io::Result<DiskCache> {
        fs::create_dir_all(dir)?;
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            budget: AtomicU64::new(budget_bytes),
            files: Mutex::new(Vec::new()),
            stats: DiskCacheStats::default(),
        });
        let mut files = Vec::new();
        for item in fs::read_dir(dir)? {
            let path = item?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.ends_with(".tmp") {
                let _ = fs::remove_file(&path);
            }
            if path.extension().and_then(|e| e.to_str()) != Some(EXTENSION) {
                continue;
            }
            match read_entry(&path) {
                Ok(file) => files.push(file),
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %e, "KV cache file removed");
                    shared.stats.rejected.fetch_add(1, Ordering::Relaxed);
                    let _ = fs::remove_file(&path);
                }
            }
        }
        *shared.lock() = files;
        shared.evict();
        let (writes, jobs) = mpsc::sync_channel(WRITE_QUEUE);
        let writer = shared.clone();
        thread::Builder::new()
            .name("seedbar-kv-disk".into())
            .spawn(move || {
                for work in jobs {
                    match work {
                        Work::Write(job) => {
                            if let Err(e) = writer.write(job) {
                                tracing::warn!(error = %e, "KV cache file not written");
                            }
                        }
                        Work::Flush(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            })?;
        Ok(DiskCache { shared, writes })
    }

    pub fn stats(&self) -> &DiskCacheStats {
        &self.shared.stats
    }

    pub fn budget_bytes(&self) -> u64 {
        self.shared.budget.load(Ordering::Relaxed)
    }

    /// Wait until the sequences saved so far are written (a server shutting down).
    pub fn flush(&self) {
        let (done, written) = mpsc::channel();
        if self.writes.send(Work::Flush(done)).is_ok() {
            let _ = written.recv();
        }
    }

    /// Keep at most `bytes` from now on (the least recently used files go at once).
    pub fn set_budget(&self, bytes: u64) {
        self.shared.budget.store(bytes, Ordering::Relaxed);
        self.shared.evict();
    }

    /// The file of `key` holding the longest reusable prefix of `prompt`, if [`MIN_REUSE`]
    /// tokens longer than `at_least` (what the RAM tier has).
    pub(crate) fn find(
        &self,
        key: &str,
        prompt: &[u32],
        granularity: usize,
        at_least: usize,
    ) -> Option<Found> {
        let files = self.shared.lock();
        let (file, usable) = files
            .iter()
            .filter(|f| f.key == key)
            .filter_map(|f| {
                let usable = usable_prefix(&f.tokens, prompt, granularity, f.reusable_from)?;
                Some((f, usable))
            })
            .max_by_key(|(_, usable)| *usable)?;
        (usable >= at_least + MIN_REUSE).then(|| Found {
            usable,
            name: file.name.clone(),
            key: file.key.clone(),
            tokens: file.tokens.clone(),
        })
    }

    /// Read a file [`find`](Self::find) chose (on any thread): its layers, or why it cannot
    /// be used. A torn or altered file is removed; one gone meanwhile (another process
    /// sharing the folder evicted it) is forgotten.
    pub(crate) fn load(&self, found: &Found) -> Result<Vec<KvSnapshot>, String> {
        let path = self.shared.dir.join(&found.name);
        let bytes = fs::read(&path);
        let mut files = self.shared.lock();
        if let Err(e) = &bytes {
            if e.kind() == io::ErrorKind::NotFound {
                files.retain(|f| f.name != found.name);
                self.shared.count_bytes(&files);
                return Err(format!("{}: {e}", path.display()));
            }
        }
        let read = bytes
            .map_err(|e| e.to_string())
            .and_then(|bytes| parse(&bytes, found));
        match read {
            Ok(layers) => {
                self.shared.stats.hits.fetch_add(1, Ordering::Relaxed);
                if let Some(file) = files.iter_mut().find(|f| f.name == found.name) {
                    file.last_used = now();
                    let touched = fs::File::options()
                        .write(true)
                        .open(&path)
                        .and_then(|f| f.set_modified(SystemTime::now()));
                    if let Err(e) = touched {
                        tracing::debug!(error = %e, "KV cache file's time not updated");
                    }
                }
                Ok(layers)
            }
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "KV cache file removed");
                self.shared.stats.rejected.fetch_add(1, Ordering::Relaxed);
                files.retain(|f| f.name != found.name);
                let _ = fs::remove_file(&path);
                self.shared.count_bytes(&files);
                Err(e)
            }
        }
    }

    /// Keep `caches` (holding `tokens`) under `key`, unless a file already holds them or
    /// they do not fit the budget: snapshotted here, written on the tier's own thread.
    pub(crate) fn save(&self, key: &str, tokens: &[u32], caches: &[KvCache]) {
        let bytes: usize = caches.iter().map(KvCache::bytes).sum();
        let reusable_from = kv_cache::reusable_from(caches);
        let kept = self.shared.lock().iter().any(|f| {
            f.key == key && f.tokens.starts_with(tokens) && f.reusable_from <= reusable_from
        });
        if kept || tokens.len() < MIN_REUSE || bytes as u64 > self.budget_bytes() {
            return;
        }
        let layers = match caches.iter().map(KvCache::snapshot).collect() {
            Ok(layers) => layers,
            Err(e) => {
                tracing::warn!(error = %e, "KV not kept on disk");
                return;
            }
        };
        let job = Job {
            key: key.to_string(),
            tokens: tokens.to_vec(),
            reusable_from,
            layers,
        };
        if self.writes.try_send(Work::Write(job)).is_err() {
            tracing::debug!("KV cache writes are behind: a sequence is not kept on disk");
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Vec<File>> {
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count_bytes(&self, files: &[File]) {
        let total = files.iter().map(|f| f.bytes).sum();
        self.stats.bytes.store(total, Ordering::Relaxed);
    }

    /// Remove the least recently used files until the rest fit the budget.
    fn evict(&self) {
        let budget = self.budget.load(Ordering::Relaxed);
        let mut files = self.lock();
        while files.iter().map(|f| f.bytes).sum::<u64>() > budget {
            let oldest = (0..files.len())
                .min_by_key(|&i| files[i].last_used)
                .expect("non-empty while over budget");
            let _ = fs::remove_file(self.dir.join(&files[oldest].name));
            files.remove(oldest);
        }
        self.count_bytes(&files);
    }

    /// Write a sequence's file, then drop the files it makes useless (same key, a prefix of
    /// its tokens, cut back no less far) and what no longer fits.
    fn write(&self, job: Job) -> io::Result<()> {
        let name = format!("{:016x}.{EXTENSION}", name_hash(&job.key, &job.tokens));
        let path = self.dir.join(&name);
        let temporary = path.with_extension("tmp");
        let written = write_file(&temporary, &job).and_then(|bytes| {
            fs::rename(&temporary, &path)?;
            Ok(bytes)
        });
        let bytes = match written {
            Ok(bytes) => bytes,
            Err(e) => {
                let _ = fs::remove_file(&temporary);
                return Err(e);
            }
        };
        self.stats.writes.fetch_add(1, Ordering::Relaxed);
        {
            let mut files = self.lock();
            files.retain(|f| {
                let useless = f.name == name
                    || (f.key == job.key
                        && job.tokens.starts_with(&f.tokens)
                        && job.reusable_from <= f.reusable_from);
                if useless && f.name != name {
                    let _ = fs::remove_file(self.dir.join(&f.name));
                }
                !useless
            });
            files.push(File {
                name,
                key: job.key,
                tokens: job.tokens,
                reusable_from: job.reusable_from,
                bytes,
                last_used: now(),
            });
        }
        self.evict();
        Ok(())
    }
}

/// Nanoseconds since the epoch.
fn now() -> u128 {
    modified_nanos(SystemTime::now())
}

fn modified_nanos(time: SystemTime) -> u128 {
    time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

/// FNV-1a of the key and the tokens: a file's name.
fn name_hash(key: &str, tokens: &[u32]) -> u64 {
    let bytes = key
        .bytes()
        .chain(tokens.iter().flat_map(|t| t.to_le_bytes()));
    bytes.fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A writer that keeps the CRC-32 of what passes through it.
struct Checksummed<W> {
    inner: W,
    crc: crc32fast::Hasher,
    written: u64,
}

impl<W: Write> Write for Checksummed<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A layer's stored form: its kind's byte, and its data after the shape fields.
fn dtype_code(dtype: Dtype) -> io::Result<u8> {
    match dtype {
        Dtype::Float32 => Ok(0),
        Dtype::Float16 => Ok(1),
        Dtype::Bfloat16 => Ok(2),
        other => Err(invalid(format!("KV of dtype {other:?}"))),
    }
}

fn dtype_of(code: u8) -> io::Result<Dtype> {
    match code {
        0 => Ok(Dtype::Float32),
        1 => Ok(Dtype::Float16),
        2 => Ok(Dtype::Bfloat16),
        other => Err(invalid(format!("unknown dtype code {other}"))),
    }
}

fn invalid(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.into())
}

/// Write a sequence's file; its size in bytes.
fn write_file(path: &Path, job: &Job) -> io::Result<u64> {
    let mut payload = 0u64;
    for layer in &job.layers {
        payload += 13
            + match &layer.stored {
                StoredKv::Empty => 0,
                StoredKv::Host(host) => 8 + 8 * host.keys.len() as u64,
                StoredKv::Device { keys, values, .. } => 17 + (keys.len() + values.len()) as u64,
            };
    }
    let mut out = Checksummed {
        inner: BufWriter::with_capacity(1 << 20, fs::File::create(path)?),
        crc: crc32fast::Hasher::new(),
        written: 0,
    };
    out.write_all(MAGIC)?;
    out.write_all(&VERSION.to_le_bytes())?;
    out.write_all(&(job.key.len() as u32).to_le_bytes())?;
    out.write_all(job.key.as_bytes())?;
    out.write_all(&(job.tokens.len() as u32).to_le_bytes())?;
    out.write_all(bytemuck::cast_slice(&job.tokens))?;
    out.write_all(&job.reusable_from.to_le_bytes())?;
    out.write_all(&(job.layers.len() as u32).to_le_bytes())?;
    out.write_all(&payload.to_le_bytes())?;
    for layer in &job.layers {
        out.write_all(&layer.window.unwrap_or(-1).to_le_bytes())?;
        out.write_all(&layer.first.to_le_bytes())?;
        out.write_all(&layer.len.to_le_bytes())?;
        match &layer.stored {
            StoredKv::Empty => out.write_all(&[0])?,
            StoredKv::Host(host) => {
                out.write_all(&[1])?;
                out.write_all(&(host.kv_heads as u32).to_le_bytes())?;
                out.write_all(&(host.head_dim as u32).to_le_bytes())?;
                out.write_all(bytemuck::cast_slice(&host.keys))?;
                out.write_all(bytemuck::cast_slice(&host.values))?;
            }
            StoredKv::Device {
                dtype,
                shape,
                keys,
                values,
            } => {
                out.write_all(&[2, dtype_code(*dtype)?])?;
                out.write_all(bytemuck::cast_slice(shape))?;
                out.write_all(keys)?;
                out.write_all(values)?;
            }
        }
    }
    let crc = out.crc.clone().finalize();
    out.write_all(&crc.to_le_bytes())?;
    out.flush()?;
    Ok(out.written)
}

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_i32(r: &mut impl Read) -> io::Result<i32> {
    Ok(read_u32(r)? as i32)
}

fn read_bytes(r: &mut impl Read, n: u64) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    r.by_ref().take(n).read_to_end(&mut bytes)?;
    if bytes.len() as u64 != n {
        return Err(invalid("the file ends early"));
    }
    Ok(bytes)
}

fn read_header(r: &mut impl Read) -> io::Result<Header> {
    if read_bytes(r, 4)? != MAGIC || read_u32(r)? != VERSION {
        return Err(invalid("not a KV cache file of this version"));
    }
    let key_length = read_u32(r)?;
    if key_length > 1 << 16 {
        return Err(invalid("a key too long"));
    }
    let key = String::from_utf8(read_bytes(r, key_length.into())?)
        .map_err(|_| invalid("a key that is not UTF-8"))?;
    let count = read_u32(r)?;
    if count > 1 << 24 {
        return Err(invalid("too many tokens"));
    }
    let tokens = bytemuck::pod_collect_to_vec(&read_bytes(r, 4 * u64::from(count))?);
    let reusable_from = read_i32(r)?;
    let layers = read_u32(r)?;
    let mut payload = [0; 8];
    r.read_exact(&mut payload)?;
    Ok(Header {
        length: 32 + u64::from(key_length) + 4 * u64::from(count),
        key,
        tokens,
        reusable_from,
        layers,
        payload: u64::from_le_bytes(payload),
    })
}

/// The index's record of a file, from its header and size.
fn read_entry(path: &Path) -> io::Result<File> {
    let file = fs::File::open(path)?;
    let metadata = file.metadata()?;
    let header = read_header(&mut BufReader::new(file))?;
    if metadata.len() != header.length + header.payload + 4 {
        return Err(invalid(format!(
            "{} bytes where the header says {}",
            metadata.len(),
            header.length + header.payload + 4
        )));
    }
    Ok(File {
        name: path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into(),
        key: header.key,
        tokens: header.tokens,
        reusable_from: header.reusable_from,
        bytes: metadata.len(),
        last_used: modified_nanos(metadata.modified()?),
    })
}

/// A whole file's layers, checked against its checksum and against what the index said.
fn parse(bytes: &[u8], found: &Found) -> Result<Vec<KvSnapshot>, String> {
    let Some((body, crc)) = bytes.split_last_chunk::<4>() else {
        return Err("the file is empty".into());
    };
    if crc32fast::hash(body) != u32::from_le_bytes(*crc) {
        return Err("the checksum does not match".into());
    }
    let mut r = body;
    let header = read_header(&mut r).map_err(|e| e.to_string())?;
    if header.key != found.key || header.tokens != found.tokens {
        return Err("another sequence took its name".into());
    }
    (0..header.layers)
        .map(|_| read_layer(&mut r).map_err(|e| e.to_string()))
        .collect()
}

fn read_layer(r: &mut &[u8]) -> io::Result<KvSnapshot> {
    let window = Some(read_i32(r)?).filter(|&w| w >= 0);
    let (first, len) = (read_i32(r)?, read_i32(r)?);
    let held = (i64::from(len) - i64::from(first)).max(0) as u64;
    let too_large = || invalid("a layer larger than any file");
    let kind = read_bytes(r, 1)?[0];
    let stored = match kind {
        0 => StoredKv::Empty,
        1 => {
            let (kv_heads, head_dim) = (read_u32(r)? as usize, read_u32(r)? as usize);
            let bytes = [held, kv_heads as u64, head_dim as u64]
                .into_iter()
                .try_fold(4u64, u64::checked_mul)
                .ok_or_else(too_large)?;
            let keys = bytemuck::pod_collect_to_vec(&read_bytes(r, bytes)?);
            let values = bytemuck::pod_collect_to_vec(&read_bytes(r, bytes)?);
            StoredKv::Host(Arc::new(HostKv {
                keys,
                values,
                kv_heads,
                head_dim,
            }))
        }
        2 => {
            let dtype = dtype_of(read_bytes(r, 1)?[0])?;
            let mut shape = [0i32; 4];
            for d in &mut shape {
                *d = read_i32(r)?;
            }
            let size = buffer_bytes(&shape, dtype).ok_or_else(too_large)? as u64;
            StoredKv::Device {
                dtype,
                shape,
                keys: read_bytes(r, size)?,
                values: read_bytes(r, size)?,
            }
        }
        other => return Err(invalid(format!("unknown layer kind {other}"))),
    };
    Ok(KvSnapshot {
        window,
        first,
        len,
        stored,
    })
}

#[cfg(test)]
mod tests;
