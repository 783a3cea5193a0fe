//! The machine's memory as model loading sees it: the budget loaded models share, what is
//! free now, and how much a model needs before it is loaded, so that one that cannot fit is
//! refused with both sizes instead of taking the machine into swap.

#[cfg(target_os = "linux")]
use std::path::Path;

/// Model bytes kept in memory: 60% of the machine's memory (8 GiB where it cannot be read).
pub fn default_budget() -> u64 {
    total().map_or(8 << 30, |total| total / 10 * 6)
}

/// The machine's physical memory.
pub fn total() -> Option<u64> {
    // SAFETY: sysconf only reads system configuration values.
    let (pages, page_size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (pages > 0 && page_size > 0).then(|| pages as u64 * page_size as u64)
}

/// Memory a new model can take now without pushing others out: Linux's `MemAvailable`; on
/// macOS the free, inactive and purgeable pages. `None` where it cannot be read.
pub fn available() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        meminfo_available(&std::fs::read_to_string(Path::new("/proc/meminfo")).ok()?)
    }
    #[cfg(target_os = "macos")]
    {
        macos_available()
    }
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    {
        None
    }
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn meminfo_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(target_os = "macos")]
#[allow(deprecated)] // libc's mach bindings point to the mach2 crate; these calls are stable.
fn macos_available() -> Option<u64> {
    let mut stats: libc::vm_statistics64 = unsafe { std::mem::zeroed() };
    let mut count = libc::HOST_VM_INFO64_COUNT;
    // SAFETY: host_statistics64 fills `stats` (of `count` integers) for this host.
    let status = unsafe {
        libc::host_statistics64(
            libc::mach_host_self(),
            libc::HOST_VM_INFO64,
            &mut stats as *mut libc::vm_statistics64 as libc::host_info64_t,
            &mut count,
        )
    };
    if status != libc::KERN_SUCCESS {
        return None;
    }
    // SAFETY: sysconf only reads system configuration values.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let pages =
        stats.free_count as u64 + stats.inactive_count as u64 + stats.purgeable_count as u64;
    Some(pages * page.max(0) as u64)
}

/// What loading a model of `bytes` of files takes: its weights, and a fifth more for the KV
/// cache, the activations and the runtime's buffers.
pub fn needed(bytes: u64) -> u64 {
    bytes + bytes / 5
}

/// A size for people: "1.4 GB", "380 MB".
pub fn human(bytes: u64) -> String {
    const GB: f64 = 1e9;
    let b = bytes as f64;
    if b >= GB {
        format!("{:.1} GB", b / GB)
    } else {
        format!("{:.0} MB", b / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn available_memory_is_read_from_meminfo() {
        let meminfo =
            "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   12000000 kB\n";
        assert_eq!(meminfo_available(meminfo), Some(12_000_000 * 1024));
        assert_eq!(meminfo_available("MemTotal: 5 kB\n"), None);
        assert!(available().is_some(), "this machine's memory can be read");
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human(1_400_000_000), "1.4 GB");
        assert_eq!(human(380_000_000), "380 MB");
    }
}
