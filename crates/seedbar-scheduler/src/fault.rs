//! Fault injection for the tests of engine supervision, compiled into debug builds only:
//! with `SEEDBAR_FAULT_INJECTION=1` in the environment, a step that runs a row whose prompt
//! contains `SEEDBAR-FAULT` panics on the engine thread, as a failing MLX call would.

use std::sync::OnceLock;

use seedbar_engine::Model;

/// The text that triggers the fault.
const MARKER: &str = "SEEDBAR-FAULT";

fn enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("SEEDBAR_FAULT_INJECTION").is_ok_and(|v| v == "1"))
}

/// Panic when fault injection is on and one of `prompts` asks for it.
pub fn inject<'a>(model: &Model, prompts: impl IntoIterator<Item = &'a Vec<u32>>) {
    if !enabled() {
        return;
    }
    for prompt in prompts {
        if model
            .tokenizer
            .decode(prompt)
            .is_ok_and(|text| text.contains(MARKER))
        {
            panic!("fault injected: a prompt contains {MARKER}");
        }
    }
}
