//! Facts about the MLX runtime this process runs on (device, platform shims).

use mlx_rs::{Device, DeviceType};

/// True when MLX's default device is a GPU (Metal on macOS, CUDA with the CUDA libmlx).
pub fn default_device_is_gpu() -> bool {
    Device::try_default()
        .and_then(|d| d.get_type())
        .map(|t| matches!(t, DeviceType::Gpu))
        .unwrap_or(false)
}
