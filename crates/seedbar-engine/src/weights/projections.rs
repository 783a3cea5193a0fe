//! Projections of one input computed together (q, k and v; gate and up): apart, or one
//! product over their rows stacked.

use std::sync::Arc;

use mlx_rs::{ops, Array};
use seedbar_kernels::QuantizedMatrix;

use super::{materialize, Linear, Matrix};
use crate::{
    error::{EngineError, Result},
    runtime::Backend,
    step::plan::Products,
};

/// Projections of one input computed together (q, k and v; gate and up): `N` matmuls of
/// their own, or one product over their rows stacked (one pass over the input and one
/// dispatch where there were `N`): when every part is packed alike, one CPU kernel call
/// (each output keeps the bits of its own product, `QuantizedMatrix::stack_rows`), and,
/// where asked ([`Projections::joined_on_cuda`]), CUDA's row kernels over one matrix.
#[derive(Debug, Clone)]
pub enum Projections<const N: usize> {
    Each([Linear; N]),
    Stacked {
        whole: Linear,
        /// Output features of each part, in order.
        widths: [i32; N],
    },
}

impl<const N: usize> Projections<N> {
    /// `parts` stacked where the CPU kernels hold them all alike, else kept apart.
    pub fn new(parts: [Linear; N]) -> Result<Self> {
        let packed: Option<Vec<&QuantizedMatrix>> = parts
            .iter()
            .map(|l| match &l.weight {
                Matrix::Packed(p) => Some(&**p),
                _ => None,
            })
            .collect();
        let Some(stacked) = packed.as_deref().and_then(QuantizedMatrix::stack_rows) else {
            return Ok(Projections::Each(parts));
        };
        let widths = parts.each_ref().map(|l| match &l.weight {
            Matrix::Packed(p) => p.rows() as i32,
            _ => unreachable!("every part is packed"),
        });
        // A part without a bias adds zeros, so the stack has one bias or none.
        let bias = if parts.iter().any(|l| l.bias.is_some()) {
            let pieces = parts
                .iter()
                .zip(widths)
                .map(|(l, w)| match &l.bias {
                    Some(b) => Ok(b.clone()),
                    None => Ok(ops::zeros::<f32>(&[w])?),
                })
                .collect::<Result<Vec<_>>>()?;
            Some(materialize(ops::concatenate(&pieces, 0)?)?)
        } else {
            None
        };
        Ok(Projections::Stacked {
            whole: Linear {
                weight: Matrix::Packed(Arc::new(stacked)),
                bias,
            },
            widths,
        })
    }

    /// As [`Projections::new`], and on CUDA, parts without biases that are all dense or all
    /// quantized alike joined into one matrix: a decode step's product is one row-kernel
    /// launch (each output's sum runs over its own weight row alone, so it keeps its bits),
    /// a prefill chunk's one library call. The outputs of [`forward`](Self::forward) are
    /// strided views of the joined product (gate and up, read as such by the activation);
    /// [`forward_contiguous`](Self::forward_contiguous) copies them out (q, k and v).
    pub fn joined_on_cuda(parts: [Linear; N]) -> Result<Self> {
        let joinable = Backend::current() == Backend::Cuda
            && parts.iter().all(|l| l.bias.is_none())
            && !parts.iter().any(|l| matches!(l.weight, Matrix::Packed(_)));
        if !joinable {
            return Projections::new(parts);
        }
        let weights: Vec<&Matrix> = parts.iter().map(|l| &l.weight).collect();
        let rows = |parts: Vec<&Array>| materialize(ops::concatenate(&parts, 0)?);
        let Some(whole) = Matrix::joined(&weights, rows)? else {
            return Ok(Projections::Each(parts));
        };
        let widths = parts.each_ref().map(|l| match &l.weight {
            Matrix::Dense(w) => w.shape()[0],
            Matrix::Quantized(q) => q.weight.shape()[0],
            Matrix::Packed(p) => p.rows() as i32,
        });
        Ok(Projections::Stacked {
            whole: Linear {
                weight: whole,
                bias: None,
            },
            widths,
        })
    }

    /// Each projection of `x` (`[..., cols]`).
    pub fn forward(&self, x: &Array, products: Products) -> Result<[Array; N]> {
        let outputs = match self {
            Projections::Each(parts) => parts
                .iter()
                .map(|l| l.forward(x, products))
                .collect::<Result<Vec<_>>>()?,
            Projections::Stacked { whole, widths } => {
                let ends: Vec<i32> = widths[..N - 1]
                    .iter()
                    .scan(0, |end, w| {
                        *end += w;
                        Some(*end)
                    })
                    .collect();
                whole.forward(x, products)?.split_at_indices(&ends, -1)?
            }
        };
        Ok(outputs.try_into().expect("one output per projection"))
    }

    /// The stacked product of `x` (`[..., Σ widths]`, each row's outputs end to end), where
    /// the parts are stacked; `None` where they run apart.
    pub fn forward_stacked(&self, x: &Array, products: Products) -> Result<Option<Array>> {
        match self {
            Projections::Stacked { whole, .. } => Ok(Some(whole.forward(x, products)?)),
            Projections::Each(_) => Ok(None),
        }
    }

    /// As [`forward`](Self::forward), each output row-major in its own buffer: a stacked
    /// product's parts are copied out (for consumers that need them whole: RoPE), except
    /// where there is one row, whose parts are each whole already.
    pub fn forward_contiguous(&self, x: &Array, products: Products) -> Result<[Array; N]> {
        let outputs = self.forward(x, products)?;
        let cols = *x.shape().last().expect("a matrix input");
        if matches!(self, Projections::Each(_)) || x.size() as i32 == cols {
            return Ok(outputs);
        }
        let whole = outputs
            .iter()
            .map(|o| o.contiguous())
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(whole.try_into().expect("one output per projection"))
    }

    /// All projections of `m` rows of host floats, end to end in each output row
    /// (`[m, Σ widths]`); only a stack of packed parts runs here.
    pub fn forward_host(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        match self {
            Projections::Stacked { whole, .. } => whole.forward_host(x, m),
            Projections::Each(_) => Err(EngineError::Mlx(
                "a host product needs packed weights".to_string(),
            )),
        }
    }

    /// Whether every part runs on the CPU kernels.
    pub fn is_packed(&self) -> bool {
        matches!(self, Projections::Stacked { whole, .. } if matches!(whole.weight, Matrix::Packed(_)))
    }
}
