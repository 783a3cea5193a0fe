//! The MLP gate's activation and `activation(gate) * up`, which the dense MLP and the
//! experts share: elementwise, so a row's numbers stay its own.

use std::{cell::RefCell, collections::HashMap, result::Result as StdResult};

use mlx_rs::{error::Exception, ops, transforms::compile::compile, Array};

use crate::{error::Result, runtime};

/// The MLP gate's activation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Activation {
    /// `x * sigmoid(x)` (SwiGLU).
    #[default]
    Silu,
    /// GELU with the tanh approximation (GeGLU, Gemma).
    GeluTanh,
}

/// `activation(gate) * up`: on a GPU one fused kernel (MLX's `compile`, shapeless, as
/// mlx-lm's `swiglu`), where each op is otherwise a kernel launch of its own; elementwise
/// either way, so a row's numbers stay its own. The CPU runs the ops (MLX would compile C++
/// at run time there).
pub(super) fn gated(activation: Activation, gate: &Array, up: &Array) -> Result<Array> {
    let ops = match activation {
        Activation::Silu => silu_gated,
        Activation::GeluTanh => gelu_gated,
    };
    if !runtime::default_device_is_gpu() {
        return Ok(ops((gate, up))?);
    }
    FUSED.with_borrow_mut(|fused| {
        let f = fused
            .entry(activation)
            .or_insert_with(|| Box::new(compile(ops, Some(true))));
        Ok(f((gate, up))?)
    })
}

/// A compiled `gate, up -> activation(gate) * up`.
type FusedGate = Box<dyn for<'a> FnMut((&'a Array, &'a Array)) -> StdResult<Array, Exception>>;

thread_local! {
    /// Each activation's fused kernel, compiled once per thread that runs models (MLX keeps
    /// a compiled function only while its handle lives).
    static FUSED: RefCell<HashMap<Activation, FusedGate>> = RefCell::new(HashMap::new());
}

fn silu_gated((gate, up): (&Array, &Array)) -> StdResult<Array, Exception> {
    gate.multiply(ops::sigmoid(gate)?)?.multiply(up)
}

fn gelu_gated((gate, up): (&Array, &Array)) -> StdResult<Array, Exception> {
    mlx_rs::nn::gelu_approximate(gate)?.multiply(up)
}
