//! Facts about the MLX runtime this process runs on (device, platform shims).

use mlx_rs::{Device, DeviceType};

/// Settle MLX's environment before its first use; call at the start of `main`, while the
/// process has one thread. MLX's CUDA caches (graphs, cuDNN attention plans) count misses
/// over the process's lifetime and throw once the count passes twice their capacity, which
/// a long-running server with ever-new step shapes reaches: that check is turned off
/// (unless set), so a full cache evicts instead.
pub fn prepare() {
    const THRASHING_CHECK: &str = "MLX_ENABLE_CACHE_THRASHING_CHECK";
    if std::env::var_os(THRASHING_CHECK).is_none() {
        std::env::set_var(THRASHING_CHECK, "0");
    }
}

/// True when MLX's default device is a GPU (Metal on macOS, CUDA with the CUDA libmlx).
pub fn default_device_is_gpu() -> bool {
    Device::try_default()
        .and_then(|d| d.get_type())
        .map(|t| matches!(t, DeviceType::Gpu))
        .unwrap_or(false)
}
