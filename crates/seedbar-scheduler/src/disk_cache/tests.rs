use std::time::{Duration, Instant};

use mlx_rs::Array;

use super::*;

const KEY: &str = "model; Cpu; layout; seedbar";
const GRANULARITY: usize = 128;

/// An empty folder of its own for a test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("seedbar-disk-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    dir
}

/// A sequence's two layers, `len` positions each: one in the packed CPU path's host store,
/// one in bfloat16 MLX buffers (with a sliding window).
fn caches(len: usize, salt: f32) -> Vec<KvCache> {
    let (kv_heads, head_dim) = (2, 8);
    let keys: Vec<f32> = (0..len * kv_heads * head_dim)
        .map(|i| (i as f32 * 0.37 + salt).sin())
        .collect();
    let values: Vec<f32> = keys.iter().map(|k| k * -2.0).collect();
    let mut host = KvCache::new(None);
    host.append_host(&keys, &values, kv_heads, head_dim)
        .unwrap();
    let buffer = |x: &[f32]| {
        Array::from_slice(x, &[1, len as i32, kv_heads as i32, head_dim as i32])
            .transpose_axes(&[0, 2, 1, 3])
            .unwrap()
            .as_dtype(Dtype::Bfloat16)
            .unwrap()
    };
    let mut device = KvCache::new(Some(64));
    device.append(buffer(&keys), buffer(&values)).unwrap();
    vec![host, device]
}

fn tokens(len: usize, start: u32) -> Vec<u32> {
    (start..start + len as u32).collect()
}

fn snapshots(caches: &[KvCache]) -> Vec<KvSnapshot> {
    caches.iter().map(|c| c.snapshot().unwrap()).collect()
}

/// Wait until the tier has written `n` files since it opened.
fn wait_for_writes(cache: &DiskCache, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while cache.stats().writes.load(Ordering::Relaxed) < n {
        assert!(Instant::now() < deadline, "the file was not written");
        thread::sleep(Duration::from_millis(5));
    }
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect()
}

#[test]
fn a_file_brings_a_sequence_back_after_a_restart() {
    let dir = scratch("restart");
    let sequence = tokens(300, 1);
    let original = caches(300, 0.0);
    {
        let cache = DiskCache::open(&dir, 1 << 30).unwrap();
        cache.save(KEY, &sequence, &original);
        wait_for_writes(&cache, 1);
    }
    let cache = DiskCache::open(&dir, 1 << 30).unwrap();
    let mut prompt = sequence.clone();
    prompt.extend([7, 8, 9]);
    // Reuse ends at a multiple of the granularity, and only beyond what RAM has.
    let found = cache.find(KEY, &prompt, GRANULARITY, 0).unwrap();
    assert_eq!(found.usable, 256);
    assert!(cache.find(KEY, &prompt, GRANULARITY, 256).is_none());
    assert!(cache
        .find("another model", &prompt, GRANULARITY, 0)
        .is_none());
    assert!(cache.find(KEY, &tokens(300, 2), GRANULARITY, 0).is_none());
    let layers = cache.load(&found).unwrap();
    assert_eq!(layers, snapshots(&original));
    assert_eq!(cache.stats().hits.load(Ordering::Relaxed), 1);
    // And restored, they are the caches saved.
    let restored: Vec<KvCache> = layers
        .into_iter()
        .map(|l| KvCache::restore(l).unwrap())
        .collect();
    assert_eq!(snapshots(&restored), snapshots(&original));
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn torn_and_altered_files_are_found_out_and_removed() {
    let dir = scratch("corrupt");
    let sequence = tokens(300, 1);
    let save = || {
        let cache = DiskCache::open(&dir, 1 << 30).unwrap();
        cache.save(KEY, &sequence, &caches(300, 0.0));
        wait_for_writes(&cache, 1);
        files_in(&dir).pop().unwrap()
    };
    let prompt = tokens(400, 1);

    // One byte of the keys changed: the size is right, the checksum is not.
    let file = save();
    let mut bytes = fs::read(&file).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x10;
    fs::write(&file, bytes).unwrap();
    let cache = DiskCache::open(&dir, 1 << 30).unwrap();
    let found = cache.find(KEY, &prompt, GRANULARITY, 0).unwrap();
    assert!(cache.load(&found).unwrap_err().contains("checksum"));
    assert_eq!(cache.stats().rejected.load(Ordering::Relaxed), 1);
    assert!(cache.find(KEY, &prompt, GRANULARITY, 0).is_none());
    assert!(files_in(&dir).is_empty());
    drop(cache);

    // Cut short (a write the process did not finish): dropped when the folder is read.
    let file = save();
    let length = fs::metadata(&file).unwrap().len();
    fs::File::options()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(length - 100)
        .unwrap();
    let cache = DiskCache::open(&dir, 1 << 30).unwrap();
    assert_eq!(cache.stats().rejected.load(Ordering::Relaxed), 1);
    assert!(cache.find(KEY, &prompt, GRANULARITY, 0).is_none());
    assert!(files_in(&dir).is_empty());
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn the_least_recently_used_files_go_over_the_budget() {
    let dir = scratch("budget");
    let probe = DiskCache::open(&dir, 1 << 30).unwrap();
    probe.save(KEY, &tokens(300, 1), &caches(300, 0.0));
    wait_for_writes(&probe, 1);
    let one_file = probe.stats().bytes.load(Ordering::Relaxed);
    drop(probe);
    let _ = fs::remove_dir_all(&dir);

    let cache = DiskCache::open(&dir, 2 * one_file + one_file / 2).unwrap();
    let [a, b, c] = [1, 1000, 2000].map(|start| tokens(300, start));
    cache.save(KEY, &a, &caches(300, 1.0));
    wait_for_writes(&cache, 1);
    cache.save(KEY, &b, &caches(300, 2.0));
    wait_for_writes(&cache, 2);
    // A hit makes `a` the most recently used: `b` goes when `c` comes.
    let found = cache.find(KEY, &[a.clone(), vec![5]].concat(), GRANULARITY, 0);
    cache.load(&found.unwrap()).unwrap();
    cache.save(KEY, &c, &caches(300, 3.0));
    wait_for_writes(&cache, 3);
    let held = |t: &[u32]| {
        cache
            .find(KEY, &[t, &[5]].concat(), GRANULARITY, 0)
            .is_some()
    };
    assert_eq!((held(&a), held(&b), held(&c)), (true, false, true));
    assert_eq!(files_in(&dir).len(), 2);

    // A longer sequence of the same start replaces the file it extends.
    let mut longer = c.clone();
    longer.extend(tokens(100, 5000));
    cache.save(KEY, &longer, &caches(400, 3.0));
    wait_for_writes(&cache, 4);
    assert_eq!(files_in(&dir).len(), 2);
    let found = cache.find(KEY, &[longer, vec![5]].concat(), GRANULARITY, 0);
    assert_eq!(found.unwrap().usable, 384);
    // Saving what a file already holds writes nothing.
    cache.save(KEY, &c, &caches(300, 3.0));
    thread::sleep(Duration::from_millis(50));
    assert_eq!(cache.stats().writes.load(Ordering::Relaxed), 4);

    cache.set_budget(0);
    assert!(files_in(&dir).is_empty());
    assert_eq!(cache.stats().bytes.load(Ordering::Relaxed), 0);
    let _ = fs::remove_dir_all(&dir);
}

/// A file whose checksum is right but whose layer says nonsense (a buffer of negative
/// dimensions) is refused and removed, not a panic.
#[test]
fn a_well_formed_file_of_impossible_shapes_is_refused() {
    let dir = scratch("shapes");
    let cache = DiskCache::open(&dir, 1 << 30).unwrap();
    let sequence = tokens(200, 1);
    let layer = KvSnapshot {
        window: None,
        first: 0,
        len: 200,
        stored: StoredKv::Device {
            dtype: Dtype::Float32,
            shape: [1, -1, 1, -4],
            keys: Vec::new(),
            values: Vec::new(),
        },
    };
    let job = Job {
        key: KEY.into(),
        tokens: sequence.clone(),
        reusable_from: 0,
        layers: vec![layer],
    };
    cache.writes.send(Work::Write(job)).unwrap();
    wait_for_writes(&cache, 1);
    let found = cache.find(KEY, &tokens(300, 1), GRANULARITY, 0).unwrap();
    assert!(cache
        .load(&found)
        .unwrap_err()
        .contains("larger than any file"));
    assert_eq!(cache.stats().rejected.load(Ordering::Relaxed), 1);
    assert!(files_in(&dir).is_empty());
    // Restoring such a layer is refused too.
    let layer = KvSnapshot {
        window: None,
        first: 0,
        len: 2,
        stored: StoredKv::Host(Arc::new(HostKv {
            keys: vec![0.0; 3],
            values: vec![0.0; 3],
            kv_heads: usize::MAX,
            head_dim: 2,
        })),
    };
    assert!(KvCache::restore(layer).is_err());
    let _ = fs::remove_dir_all(&dir);
}
