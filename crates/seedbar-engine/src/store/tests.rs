//! The store's tests: listing, imports, pulls from a stand-in hub.

use std::{
    collections::HashMap,
    io::{BufRead, BufReader, Write},
    net::TcpListener,
    sync::{atomic::Ordering, Arc},
    time::{Duration, Instant},
};

use super::*;

/// A store in a fresh temporary folder, removed on drop.
struct TempStore(ModelStore);

impl TempStore {
    fn new(tag: &str) -> Self {
        let root =
            std::env::temp_dir().join(format!("seedbar-store-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        TempStore(ModelStore::at(root))
    }
}

impl Drop for TempStore {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.0.root());
    }
}

/// A stand-in hub on a loopback port: `GET path` answers `routes[path]` (404 if none).
fn fake_hub(routes: HashMap<String, Vec<u8>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let routes = Arc::new(routes);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let routes = routes.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut request = String::new();
                reader.read_line(&mut request).unwrap();
                let mut header = String::new();
                while reader.read_line(&mut header).is_ok_and(|n| n > 2) {
                    header.clear();
                }
                let path = request.split(' ').nth(1).unwrap_or("");
                let (status, body) = match routes.get(path) {
                    Some(body) => ("200 OK", body.as_slice()),
                    None => ("404 Not Found", &b"{}"[..]),
                };
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes());
                for chunk in body.chunks(64 * 1024) {
                    if stream.write_all(chunk).is_err() {
                        return;
                    }
                    let _ = stream.flush();
                }
            });
        }
    });
    endpoint
}

const CONFIG: &[u8] = br#"{"model_type": "llama", "torch_dtype": "bfloat16"}"#;

/// A hub holding repository `repo` (`org/name`) with `files`.
fn fake_repo(repo: &str, files: &[(&str, &[u8])]) -> String {
    let siblings: Vec<String> = files
        .iter()
        .map(|(name, body)| format!(r#"{{"rfilename": "{name}", "size": {}}}"#, body.len()))
        .collect();
    let info = format!(
        r#"{{"sha": "abc123", "siblings": [{}]}}"#,
        siblings.join(",")
    );
    let mut routes = HashMap::new();
    routes.insert(
        format!("/api/models/{repo}/revision/main?blobs=true"),
        info.into_bytes(),
    );
    for (name, body) in files {
        routes.insert(format!("/{repo}/resolve/abc123/{name}"), body.to_vec());
    }
    fake_hub(routes)
}

/// A hub holding `org/tiny`: a config, 1 MB of weights, a tokenizer and a README.
fn tiny_repo() -> (String, u64) {
    let weights = vec![7u8; 1 << 20];
    let files: [(&str, &[u8]); 4] = [
        ("config.json", CONFIG),
        ("model.safetensors", &weights),
        ("tokenizer.json", b"{}"),
        ("README.md", b"# tiny"),
    ];
    let wanted = (CONFIG.len() + weights.len() + 2) as u64;
    (fake_repo("org/tiny", &files), wanted)
}

#[test]
fn a_gguf_pull_takes_the_repositorys_image_projector_along() {
    let endpoint = fake_repo(
        "org/vis",
        &[
            ("vis-Q4_0.gguf", b"GGUF model"),
            ("mmproj-vis-Q8_0.gguf", b"GGUF q8 projector"),
            ("mmproj-vis-F16.gguf", b"GGUF f16 projector"),
            ("other-Q8_0.gguf", b"GGUF another model"),
        ],
    );
    let store = TempStore::new("pull-projector");
    let no = AtomicBool::new(false);
    let dir = store
        .0
        .pull_from(&endpoint, "org/vis:vis-Q4_0.gguf", &mut (), &no)
        .unwrap();
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert_eq!(files, ["mmproj-vis-F16.gguf", "vis-Q4_0.gguf"]);
    // Listed once, as the model file (not the projector beside it).
    let models = store.0.list().unwrap();
    assert_eq!(models.len(), 1);
    assert_eq!(models[0].path, dir.join("vis-Q4_0.gguf"));
    // A file the repository lacks is still an error, projector or not.
    assert!(store
        .0
        .pull_from(&endpoint, "org/vis:missing.gguf", &mut (), &no)
        .is_err());
}

/// Records progress; sets `cancel` at the first bytes when asked to.
#[derive(Default)]
struct Recorder {
    total: u64,
    done: u64,
    cancel_at_first: Option<Arc<AtomicBool>>,
}

impl Progress for Recorder {
    fn total(&mut self, bytes: u64) {
        self.total = bytes;
    }

    fn advance(&mut self, bytes: u64) {
        self.done += bytes;
        if let Some(cancel) = &self.cancel_at_first {
            cancel.store(true, Ordering::SeqCst);
        }
    }
}

#[test]
fn pull_downloads_the_files_a_model_needs_with_progress() {
    let (endpoint, bytes) = tiny_repo();
    let store = TempStore::new("pull");
    let mut progress = Recorder::default();
    let dir = store
        .0
        .pull_from(
            &endpoint,
            "org/tiny",
            &mut progress,
            &AtomicBool::new(false),
        )
        .unwrap();
    assert_eq!((progress.total, progress.done), (bytes, bytes));
    assert_eq!(std::fs::read(dir.join("config.json")).unwrap(), CONFIG);
    assert_eq!(
        dir.join("model.safetensors").metadata().unwrap().len(),
        1 << 20
    );
    assert!(!dir.join("README.md").exists());
    assert!(!store.0.root().join("downloads/org--tiny").exists());
    let models = store.0.list().unwrap();
    assert_eq!(models.len(), 1);
    assert_eq!(
        (models[0].name.as_str(), models[0].format, models[0].bytes),
        ("org--tiny", "safetensors", bytes)
    );

    // Pulling again finds everything in place.
    let mut again = Recorder::default();
    store
        .0
        .pull_from(&endpoint, "org/tiny", &mut again, &AtomicBool::new(false))
        .unwrap();
    assert_eq!((again.total, again.done), (bytes, bytes));

    store.0.remove("org--tiny").unwrap();
    assert!(store.0.list().unwrap().is_empty());
    assert!(matches!(
        store.0.remove("org--tiny"),
        Err(EngineError::UnknownModel(_))
    ));
}

#[test]
fn a_model_directory_is_imported_with_its_sentence_transformers_files() {
    let store = TempStore::new("import-dir");
    let source = store.0.root().join("source");
    std::fs::create_dir_all(source.join("1_Pooling")).unwrap();
    for (file, body) in [
        ("config.json", &br#"{"model_type": "bert"}"#[..]),
        ("model.safetensors", b"weights"),
        ("tokenizer.json", b"{}"),
        ("modules.json", b"[]"),
        ("1_Pooling/config.json", b"{}"),
        ("README.md", b"# not needed"),
    ] {
        std::fs::write(source.join(file), body).unwrap();
    }
    let imported = store.0.import(&source, Some("encoder")).unwrap();
    let dir = imported.path.clone();
    assert!(dir.join("1_Pooling/config.json").is_file());
    assert!(dir.join("model.safetensors").is_file());
    assert!(!dir.join("README.md").exists());
    let listed: Vec<_> = store.0.list().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].name.as_str(), listed[0].kind),
        ("encoder", ModelKind::Embedding)
    );
    // Again: everything is in place already.
    assert_eq!(store.0.import(&source, Some("encoder")).unwrap().path, dir);
    // Another model under a taken name is refused.
    let other = store.0.root().join("other");
    std::fs::create_dir_all(&other).unwrap();
    for (file, body) in [
        ("config.json", &br#"{"model_type": "llama"}"#[..]),
        ("model.safetensors", b"other weights"),
        ("tokenizer.json", b"{}"),
    ] {
        std::fs::write(other.join(file), body).unwrap();
    }
    assert!(matches!(
        store.0.import(&other, Some("encoder")),
        Err(EngineError::NameTaken(_))
    ));
    // The folder's name by default.
    assert_eq!(store.0.import(&source, None).unwrap().name, "source");
}

#[test]
fn imports_are_checked_first() {
    let store = TempStore::new("import-checks");
    let root = store.0.root().to_path_buf();
    std::fs::create_dir_all(root.join("half")).unwrap();
    std::fs::write(root.join("half/config.json"), b"{}").unwrap();
    std::fs::write(root.join("notes.txt"), b"hello").unwrap();
    std::fs::write(root.join("fake.gguf"), b"not a gguf").unwrap();
    std::fs::write(root.join("model.Q4_0.gguf"), b"GGUF\x03\0\0\0").unwrap();
    let error = |path: &str| {
        store
            .0
            .import(&root.join(path), None)
            .unwrap_err()
            .to_string()
    };
    assert!(error("missing.gguf").ends_with("missing.gguf does not exist"));
    assert!(error("notes.txt").contains("is not a GGUF model file"));
    assert!(error("fake.gguf").contains("is not a GGUF model file"));
    let half = error("half");
    assert!(
        half.contains("no .safetensors weights, no tokenizer.json"),
        "{half}"
    );
    assert!(
        store.0.list().unwrap().is_empty(),
        "nothing refused was added"
    );
    let gguf = store.0.import(&root.join("model.Q4_0.gguf"), None).unwrap();
    assert_eq!((gguf.name.as_str(), gguf.format), ("model.Q4_0", "gguf"));
    assert!(store
        .0
        .import(&root.join("model.Q4_0.gguf"), Some("a/b"))
        .is_err());
}

#[test]
fn a_cancelled_pull_leaves_nothing_behind() {
    let (endpoint, _) = tiny_repo();
    let store = TempStore::new("cancel");
    let cancel = Arc::new(AtomicBool::new(false));
    let mut progress = Recorder {
        cancel_at_first: Some(cancel.clone()),
        ..Recorder::default()
    };
    let result = store
        .0
        .pull_from(&endpoint, "org/tiny", &mut progress, &cancel);
    assert!(matches!(result, Err(EngineError::Cancelled)), "{result:?}");
    assert!(progress.done < progress.total);
    assert!(!store.0.root().join("models/org--tiny").exists());
    assert!(!store.0.root().join("downloads/org--tiny").exists());
    assert!(store.0.list().unwrap().is_empty());
}

#[test]
fn an_unreachable_hub_fails_fast_and_clearly() {
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let store = TempStore::new("offline");
    let started = Instant::now();
    let error = store
        .0
        .pull_from(&endpoint, "org/tiny", &mut (), &AtomicBool::new(false))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("cannot reach the Hugging Face hub"),
        "{error}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn unknown_repositories_and_bad_ids_are_explained() {
    let (endpoint, _) = tiny_repo();
    let store = TempStore::new("unknown");
    let no = AtomicBool::new(false);
    let error = store
        .0
        .pull_from(&endpoint, "org/missing", &mut (), &no)
        .unwrap_err()
        .to_string();
    assert!(error.contains("org/missing was not found"), "{error}");
    for bad in ["tiny", "org/", "a/b/c", "../x"] {
        assert!(matches!(
            store.0.pull_from(&endpoint, bad, &mut (), &no),
            Err(EngineError::InvalidRequest(_))
        ));
    }
}

#[test]
fn file_names_must_stay_inside_the_repository() {
    let info = r#"{"sha": "s", "siblings": [{"rfilename": "../../evil.safetensors"},
                                        {"rfilename": "config.json"}]}"#;
    let endpoint = fake_hub(HashMap::from([(
        "/api/models/org/evil/revision/main?blobs=true".to_string(),
        info.as_bytes().to_vec(),
    )]));
    let store = TempStore::new("evil");
    let error = store
        .0
        .pull_from(&endpoint, "org/evil", &mut (), &AtomicBool::new(false))
        .unwrap_err()
        .to_string();
    assert!(error.contains("outside the repository"), "{error}");
}
