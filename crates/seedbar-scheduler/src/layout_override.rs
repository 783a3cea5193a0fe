//! Another backend's layout for the tests of `seedbar serve`, compiled into debug builds
//! only: with `SEEDBAR_TEST_LAYOUT=cuda` (or `metal`) in the environment, a scheduler started
//! without a layout of its own lays its steps out as that backend's would, on this machine's
//! device: the GPU layouts' seed guarantee, checked end to end on the CPU.

use seedbar_engine::{runtime::Backend, step::plan::Layout, Model};

/// The layout `SEEDBAR_TEST_LAYOUT` names for `model`, if any.
pub fn from_env(model: &Model) -> Option<Layout> {
    let backend = match std::env::var("SEEDBAR_TEST_LAYOUT").ok()?.as_str() {
        "cuda" => Backend::Cuda,
        "metal" => Backend::Metal,
        "cpu" => Backend::Cpu,
        other => {
            tracing::warn!("SEEDBAR_TEST_LAYOUT={other} is not cuda, metal or cpu: ignored");
            return None;
        }
    };
    Some(Layout::for_backend(backend, model.weight_kind()))
}
