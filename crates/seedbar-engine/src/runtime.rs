//! Facts about the MLX runtime this process runs on (device, platform shims).

use mlx_rs::{Device, DeviceType};

/// Settle MLX's environment before its first use; call at the start of `main`, while the
/// process has one thread.
///
/// - MLX's CUDA caches (graphs, cuDNN attention plans) count misses over the process's
///   lifetime and throw once the count passes twice their capacity, which a long-running
///   server with ever-new step shapes reaches: that check is turned off (unless set), so a
///   full cache evicts instead.
/// - MLX's CUDA backend records a step's kernels into CUDA graphs, whose independent nodes
///   run at once: a step's matmul groups are such branches, and with graphs on, a row's
///   numbers differed from its numbers alone in 7 of 48 mixes on an 8B 4-bit checkpoint
///   (an H100; always in a step of two or more groups, in some layer's MLP), against none
///   with them off. Graphs are off (unless set), so a step's kernels run in stream order
///   (docs/batch-layout.md).
/// - On Linux, an OpenBLAS older than the CPU runs its generic kernels (see
///   [`openblas_core`]); the process then runs itself again with the right ones.
/// - On macOS, MLX is pointed at the app bundle's `mlx.metallib` (see [`bundled_metallib`]).
pub fn prepare() {
    for (name, value) in [(THRASHING_CHECK, "0"), (CUDA_GRAPHS, "0")] {
        if std::env::var_os(name).is_none() {
            std::env::set_var(name, value);
        }
    }
    #[cfg(target_os = "linux")]
    openblas_core::reexec_with_native_kernels();
    #[cfg(target_os = "macos")]
    use_bundled_metallib();
}

/// Give the memory of dropped arrays back to the system (after a model is unloaded): MLX's
/// buffer cache is emptied, and on Linux glibc returns the free pages of its heaps
/// (`malloc_trim`): a model's tensors are freed into them, and glibc keeps freed memory for
/// later allocations, so without it an unloaded model's memory stays with the process.
pub fn release_memory() {
    if let Err(e) = mlx_rs::memory::clear_cache() {
        tracing::warn!("cannot empty MLX's cache: {e}");
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap pages to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Ends the process with `code` once the caller's work is done and its values dropped.
///
/// On CUDA, MLX's static CUDA objects (its device's streams) are destroyed by C++ exit
/// handlers that can run after the CUDA runtime's own: the destroy then fails with "driver
/// shutting down" and MLX's check aborts the process after its output was written
/// (measured on an H100: 9 of 10 `bench determinism` runs in a row exited on SIGABRT).
/// So there, with stdout and stderr flushed, the process leaves without the C++ exit
/// handlers; elsewhere it exits as usual.
pub fn exit(code: u8) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // CUDA runs on Linux alone.
    #[cfg(target_os = "linux")]
    if Backend::current() == Backend::Cuda {
        // SAFETY: `_exit` ends the process at once; nothing of this process runs after it.
        unsafe { libc::_exit(i32::from(code)) }
    }
    std::process::exit(i32::from(code))
}

/// The Metal kernels of an app bundle, for a binary at `exe`: `Seedbar.app/Contents/MacOS/
/// seedbar-app` finds them at `Contents/Resources/mlx.metallib`, where `make bundle` puts
/// them (tauri.conf.json's `bundle.macOS.files`). `None` when that file is not there (a dev
/// build in `target/`, the CLI).
///
/// MLX 0.32.2 itself looks (metal/device.cpp, `load_default_library`) next to the binary
/// (`Contents/MacOS/mlx.metallib`), then in `Contents/MacOS/Resources/`, then at the path
/// compiled in as `METAL_PATH` (the builder's `target/mlx-metal/`): no place of a signed
/// bundle's resources, and no environment variable. Its `metal::set_metallib_path` (MLX
/// PR 3597; mlx-c `mlx_metal_set_metallib_path`, mlx-rs `metal::set_metallib_path`), called
/// before the Metal device exists, is tried first and falls back to that search when the
/// file does not load.
pub fn bundled_metallib(exe: &std::path::Path) -> Option<std::path::PathBuf> {
    let macos_dir = exe.parent()?;
    if macos_dir.file_name()? != "MacOS" {
        return None;
    }
    let metallib = macos_dir.parent()?.join("Resources").join("mlx.metallib");
    metallib.is_file().then_some(metallib)
}

/// Point MLX at the bundle's metallib before anything creates the Metal device (the first
/// GPU op does): without it, a bundle on any Mac but the builder's fails with "Failed to
/// load the default metallib".
#[cfg(target_os = "macos")]
fn use_bundled_metallib() {
    let Some(metallib) = std::env::current_exe()
        .ok()
        .and_then(|exe| bundled_metallib(&exe))
    else {
        return;
    };
    let path = metallib.to_string_lossy();
    if let Err(error) = mlx_rs::metal::set_metallib_path(&path) {
        eprintln!("could not point MLX at {path}: {error}");
    }
}

/// The MLX backends, whose kernels choose differently by shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Cpu,
    Cuda,
    Metal,
}

impl Backend {
    /// This process's: a GPU is Metal on macOS and CUDA elsewhere.
    pub fn current() -> Backend {
        if !default_device_is_gpu() {
            Backend::Cpu
        } else if cfg!(target_os = "macos") {
            Backend::Metal
        } else {
            Backend::Cuda
        }
    }

    /// `cpu`, `cuda` or `metal`, as receipts and the app name the class.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Cuda => "cuda",
            Backend::Metal => "metal",
        }
    }
}

/// MLX's switch for its CUDA caches' miss count check (see [`prepare`]).
const THRASHING_CHECK: &str = "MLX_ENABLE_CACHE_THRASHING_CHECK";
/// MLX's switch for recording CUDA kernels into graphs (see [`prepare`]).
const CUDA_GRAPHS: &str = "MLX_USE_CUDA_GRAPHS";

/// The CPU BLAS kernel set in use, where the BLAS can say (OpenBLAS's core name).
pub fn blas_kernels() -> Option<String> {
    #[cfg(target_os = "linux")]
    return openblas_core::current();
    #[cfg(not(target_os = "linux"))]
    None
}

/// The processors this process may run on (cgroup quotas included), read once: on Linux
/// the answer comes from cgroup files, and the engine asks every step.
pub fn cpu_cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Let the CPU backend's BLAS (OpenBLAS on Linux) use `threads` threads for the calls that
/// follow; a no-op without OpenBLAS in the process or when the count is already set. The
/// packed CPU path asks for one: its matmuls run on the kernels' own threads, OpenBLAS only
/// gets attention's small products, and its idle threads spin (`sched_yield`) against the
/// kernels' (measured 0.84x the wall time of a 512-token prefill and 32-token decode with
/// one). Dense CPU models, whose every matmul is OpenBLAS's, ask for every core.
pub fn set_blas_threads(threads: usize) {
    #[cfg(target_os = "linux")]
    openblas_core::set_threads(threads);
    #[cfg(not(target_os = "linux"))]
    let _ = threads;
}

/// OpenBLAS (the CPU backend's BLAS on Linux) picks its kernels once, as it loads, from the
/// CPU's model number. A build older than the CPU (Debian 12's 0.3.21 on Sapphire Rapids)
/// does not know the model and falls back to its SSE3 `Prescott` kernels: half the prefill
/// speed of its AVX-512 ones, and slower decode. Only `OPENBLAS_CORETYPE`, read at load
/// time, overrides the choice, so the process replaces itself, once, with the same
/// arguments and that variable set from the CPU's features. A caller's own
/// `OPENBLAS_CORETYPE` is left alone.
#[cfg(target_os = "linux")]
pub mod openblas_core {
    use std::ffi::CStr;

    const CORETYPE: &str = "OPENBLAS_CORETYPE";

    /// The kernel set OpenBLAS runs, or `None` without OpenBLAS in the process.
    pub fn current() -> Option<String> {
        // SAFETY: dlsym with a NUL-terminated name; the symbol, where present, is
        // OpenBLAS's `char *openblas_get_corename(void)`, returning a static string.
        unsafe {
            let symbol = libc::dlsym(libc::RTLD_DEFAULT, c"openblas_get_corename".as_ptr());
            if symbol.is_null() {
                return None;
            }
            let corename: extern "C" fn() -> *const libc::c_char = std::mem::transmute(symbol);
            let name = corename();
            (!name.is_null()).then(|| CStr::from_ptr(name).to_string_lossy().into_owned())
        }
    }

    /// See [`set_blas_threads`](super::set_blas_threads).
    pub fn set_threads(threads: usize) {
        use std::sync::{atomic::AtomicUsize, atomic::Ordering, OnceLock};
        type SetThreads = extern "C" fn(libc::c_int);
        static SYMBOL: OnceLock<Option<SetThreads>> = OnceLock::new();
        static CURRENT: AtomicUsize = AtomicUsize::new(0);
        // SAFETY: dlsym with a NUL-terminated name; the symbol, where present, is
        // OpenBLAS's `void openblas_set_num_threads(int)`.
        let set = SYMBOL.get_or_init(|| unsafe {
            let symbol = libc::dlsym(libc::RTLD_DEFAULT, c"openblas_set_num_threads".as_ptr());
            (!symbol.is_null())
                .then(|| std::mem::transmute::<*mut libc::c_void, SetThreads>(symbol))
        });
        if let Some(set) = set {
            if CURRENT.swap(threads, Ordering::Relaxed) != threads {
                set(threads as libc::c_int);
            }
        }
    }

    /// The kernels this CPU should run when OpenBLAS fell back to generic ones.
    pub fn native_for_fallback(current: &str) -> Option<&'static str> {
        const GENERIC: [&str; 4] = ["Prescott", "Core2", "Penryn", "Nehalem"];
        if !GENERIC.iter().any(|g| g.eq_ignore_ascii_case(current)) {
            return None;
        }
        native()
    }

    #[cfg(target_arch = "x86_64")]
    fn native() -> Option<&'static str> {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512dq") {
            Some("SkylakeX")
        } else if has!("avx2") && has!("fma") {
            Some("Haswell")
        } else {
            None
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn native() -> Option<&'static str> {
        None
    }

    /// Run this program again with native kernels when OpenBLAS fell back (returns only
    /// when nothing needs changing or the exec failed).
    pub fn reexec_with_native_kernels() {
        if std::env::var_os(CORETYPE).is_some() {
            return;
        }
        let Some(core) = current().as_deref().and_then(native_for_fallback) else {
            return;
        };
        let Ok(exe) = std::env::current_exe() else {
            return;
        };
        use std::os::unix::process::CommandExt;
        let mut args = std::env::args_os();
        let mut command = std::process::Command::new(exe);
        if let Some(arg0) = args.next() {
            command.arg0(arg0);
        }
        let error = command.args(args).env(CORETYPE, core).exec();
        eprintln!("could not restart with OpenBLAS's {core} kernels: {error}");
    }
}

/// True when MLX's default device is a GPU (Metal on macOS, CUDA with the CUDA libmlx).
/// The libmlx the process loaded decides it, so it is asked once (steps ask it per layer).
pub fn default_device_is_gpu() -> bool {
    static ON_GPU: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON_GPU.get_or_init(|| {
        Device::try_default()
            .and_then(|d| d.get_type())
            .map(|t| matches!(t, DeviceType::Gpu))
            .unwrap_or(false)
    })
}

#[cfg(test)]
mod bundle_tests {
    use super::bundled_metallib;

    #[test]
    fn the_metallib_of_an_app_bundle_is_found_beside_the_binary_folder() {
        let dir = std::env::temp_dir().join(format!("seedbar-metallib-{}", std::process::id()));
        let contents = dir.join("Seedbar.app/Contents");
        std::fs::create_dir_all(contents.join("MacOS")).unwrap();
        std::fs::create_dir_all(contents.join("Resources")).unwrap();
        let exe = contents.join("MacOS/seedbar-app");
        assert_eq!(bundled_metallib(&exe), None, "no metallib yet");
        std::fs::write(contents.join("Resources/mlx.metallib"), b"kernels").unwrap();
        assert_eq!(
            bundled_metallib(&exe),
            Some(contents.join("Resources/mlx.metallib"))
        );
        // A binary outside a bundle's MacOS folder (target/debug) keeps MLX's own search.
        assert_eq!(
            bundled_metallib(&contents.join("Resources/seedbar-app")),
            None
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::openblas_core::{current, native_for_fallback};

    #[test]
    fn only_generic_kernels_are_replaced() {
        assert!(current().is_some(), "OpenBLAS is in the process");
        for known in ["SkylakeX", "Haswell", "Zen", "Cooperlake"] {
            assert_eq!(native_for_fallback(known), None);
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            assert!(native_for_fallback("Prescott").is_some());
        }
    }
}
