//! A step's rows in and out of its matmul groups: the tokens each group embeds (known on the
//! host, or drawn by the previous step and still on the device), rows picked out of
//! stacked arrays, and the rows' positions gathered into the output head's groups.

use mlx_rs::{ops, ops::indexing::IndexOp, Array};

use super::{
    plan::{Products, StepPlan, Uploads},
    row_products,
};
use crate::error::Result;

/// Which positions the output head runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits<'a> {
    /// Only each row's last position (generation).
    Last,
    /// Every position (evaluation).
    All,
    /// Row `i`'s last `n[i]` positions, rows in order (a row verifying drafted tokens needs
    /// the logits after each of them; a row of 1 is `Last`'s). Head calls over all of them
    /// (of at most `MAX_ROWS` rows where products run row-wise): row-invariant where the
    /// head's product is at any row count (the CPU's packed kernels, CUDA's row kernels),
    /// which is where the scheduler verifies drafts.
    Tails(&'a [i32]),
}

impl Logits<'_> {
    /// The first position of the `row`-th row (of `len` this step) the head runs on.
    pub fn first(self, row: usize, len: i32) -> i32 {
        match self {
            Logits::Last => len - 1,
            Logits::All => 0,
            Logits::Tails(n) => len - n[row],
        }
    }
}

/// A step's input tokens, in the plan's row order: known on the host, or drawn by the
/// previous step and still on the device (the scheduler feeds a drawn token back before
/// reading it, so building a step does not wait for the one before).
#[derive(Debug, Clone, Copy)]
pub struct StepTokens<'a> {
    /// Every input token; a placeholder where `drawn` supplies it.
    pub host: &'a [u32],
    /// Tokens drawn on the device (`[n]` uint32, lazy) and, per input token, its index
    /// there when it is one of them.
    pub drawn: Option<(&'a Array, &'a [Option<i32>])>,
    /// Input positions that embed as given features instead of their tokens' embeddings.
    pub embedded: &'a [Embedded<'a>],
}

/// Features a step embeds in place of token embeddings (an image's soft tokens, or the part
/// of them in this step): `features`' rows (`[k, D]`, before the embedding scale) at input
/// positions `at..at + k`, all of one row's.
#[derive(Debug, Clone, Copy)]
pub struct Embedded<'a> {
    pub at: usize,
    pub features: &'a Array,
}

/// The rows of `features` (an image's, for sequence positions `at..at + rows`) that fall in
/// positions `start..end`, with the first's offset from `start`: what a chunk over those
/// positions embeds.
pub fn rows_in(at: usize, features: &Array, start: usize, end: usize) -> Option<(usize, Array)> {
    let rows = features.shape()[0] as usize;
    let (lo, hi) = (at.max(start), (at + rows).min(end));
    (lo < hi).then(|| {
        let picked = (lo - at) as i32..(hi - at) as i32;
        (lo - start, features.index((picked, ..)))
    })
}

impl<'a> From<&'a [u32]> for StepTokens<'a> {
    fn from(host: &'a [u32]) -> Self {
        StepTokens {
            host,
            drawn: None,
            embedded: &[],
        }
    }
}

/// Each group's embeddings `h` (`[1, W, D]`) with the features of `embedded` in place of the
/// positions they cover: copies, so a position gets the features' bits whatever the group.
pub fn splice_embedded(
    h: Vec<Array>,
    embedded: &[Embedded],
    plan: &StepPlan,
) -> Result<Vec<Array>> {
    if embedded.is_empty() {
        return Ok(h);
    }
    // Where each embedded block lands: (group, offset in the group, features).
    let mut placed: Vec<(usize, i32, &Array)> = Vec::new();
    let mut start = 0usize;
    for slot in &plan.slots {
        let end = start + slot.len as usize;
        for e in embedded.iter().filter(|e| (start..end).contains(&e.at)) {
            placed.push((slot.group, slot.offset + (e.at - start) as i32, e.features));
        }
        start = end;
    }
    placed.sort_by_key(|&(g, at, _)| (g, at));
    h.into_iter()
        .enumerate()
        .map(|(g, x)| {
            let width = x.shape()[1];
            let mut pieces = Vec::new();
            let mut next = 0;
            for &(_, at, features) in placed.iter().filter(|p| p.0 == g) {
                let rows = features.shape()[0];
                if at > next {
                    pieces.push(x.index((.., next..at, ..)));
                }
                pieces.push(features.as_dtype(x.dtype())?.expand_dims(0)?);
                next = at + rows;
            }
            if pieces.is_empty() {
                return Ok(x);
            }
            if next < width {
                pieces.push(x.index((.., next..width, ..)));
            }
            Ok(ops::concatenate(&pieces, 1)?)
        })
        .collect()
}

impl StepTokens<'_> {
    /// Every token on the host (reading the drawn ones: this waits for them).
    pub(crate) fn to_host(self) -> Result<Vec<u32>> {
        let Some((drawn, from)) = self.drawn else {
            return Ok(self.host.to_vec());
        };
        drawn.eval()?;
        let drawn = drawn.as_slice::<u32>();
        Ok(self
            .host
            .iter()
            .zip(from)
            .map(|(&t, from)| from.map_or(t, |j| drawn[j as usize]))
            .collect())
    }
}

/// Where one position of a matmul group takes its token id from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IdSource {
    /// No row's (any id serves).
    Padding,
    Host,
    /// The drawn tokens' entry.
    Drawn(i32),
}

/// One group's token ids (`[W]` uint32) where some are drawn on the device: `ids[k]` from
/// the host or `drawn[j]`, as `from[k]` says. Padding takes whatever keeps the picks
/// consecutive, so a group of drawn tokens alone is a slice of them.
fn group_ids(drawn: &Array, ids: &[u32], from: &[IdSource]) -> Result<Array> {
    let n = drawn.shape()[0];
    if !from.contains(&IdSource::Host) {
        let start = from
            .iter()
            .enumerate()
            .find_map(|(k, f)| match f {
                IdSource::Drawn(j) => Some(j - k as i32),
                _ => None,
            })
            .unwrap_or(0);
        let picks: Vec<i32> = from
            .iter()
            .enumerate()
            .map(|(k, f)| match f {
                IdSource::Drawn(j) => *j,
                _ => (start + k as i32).clamp(0, n - 1),
            })
            .collect();
        return pick_rows(drawn, &picks, &mut Uploads::default());
    }
    // The host's ids after the drawn ones, each position picking its own.
    let picks: Vec<i32> = from
        .iter()
        .enumerate()
        .map(|(k, f)| match f {
            IdSource::Drawn(j) => *j,
            _ => n + k as i32,
        })
        .collect();
    let all = ops::concatenate(&[drawn, &Array::from_slice(ids, &[ids.len() as i32])], 0)?;
    pick_rows(&all, &picks, &mut Uploads::default())
}

/// Each matmul group's token ids (`[1, W]`), in the plan's layout; padding positions take
/// any id (their outputs are unused). A group's ids are uploaded from the host, or picked
/// from the drawn tokens on the device where it holds some.
pub fn group_token_ids(tokens: StepTokens, plan: &StepPlan) -> Result<Vec<Array>> {
    let mut ids: Vec<Vec<u32>> = plan.widths.iter().map(|&w| vec![0; w as usize]).collect();
    let mut from: Vec<Vec<IdSource>> = plan
        .widths
        .iter()
        .map(|&w| vec![IdSource::Padding; w as usize])
        .collect();
    let mut start = 0;
    for slot in &plan.slots {
        let at = slot.offset as usize;
        for k in 0..slot.len as usize {
            let t = start + k;
            ids[slot.group][at + k] = tokens.host[t];
            from[slot.group][at + k] = match tokens.drawn {
                Some((_, drawn_from)) => drawn_from[t].map_or(IdSource::Host, IdSource::Drawn),
                None => IdSource::Host,
            };
        }
        start += slot.len as usize;
    }
    ids.iter()
        .zip(&from)
        .map(|(ids, from)| {
            let width = ids.len() as i32;
            let input = match tokens.drawn {
                Some((drawn, _)) if from.iter().any(|f| matches!(f, IdSource::Drawn(_))) => {
                    group_ids(drawn, ids, from)?
                }
                _ => Array::from_slice(ids, &[width]),
            };
            Ok(input.reshape(&[1, width])?)
        })
        .collect()
}

/// The output head over the positions `logits` asks for, from the groups' final hidden
/// states `h` (`h[g]`: `[1, W, D]`): `[1, rows, V]` for each row's last position, through
/// `head` in groups of the plan's head widths (zero rows pad the last where the plan says),
/// or `[1, N, V]` for every position (or every row's tail) in one call.
pub fn head_rows(
    h: &[Array],
    plan: &StepPlan,
    logits: Logits<'_>,
    head: impl Fn(&Array) -> Result<Array>,
) -> Result<Array> {
    let positions = |slot: &super::plan::Slot, from: i32| {
        h[slot.group].index((.., slot.offset + from..slot.offset + slot.len, ..))
    };
    if logits != Logits::Last {
        let all: Vec<Array> = (plan.slots.iter().enumerate())
            .map(|(i, s)| positions(s, logits.first(i, s.len)))
            .collect();
        let all = ops::concatenate(&all, 1)?;
        if plan.products != Products::RowWise {
            return head(&all);
        }
        // Row-wise products take at most MAX_ROWS rows a call: a position's logits are then
        // a decode step's.
        let count = all.shape()[1];
        let parts = (0..count)
            .step_by(row_products::MAX_ROWS as usize)
            .map(|from| {
                head(&all.index((.., from..(from + row_products::MAX_ROWS).min(count), ..)))
            })
            .collect::<Result<Vec<_>>>()?;
        return Ok(ops::concatenate(&parts, 1)?);
    }
    let mut last = plan.slots.iter().map(|s| positions(s, s.len - 1));
    let mut outs = Vec::with_capacity(plan.head_widths.len());
    let mut remaining = plan.slots.len() as i32;
    for &w in &plan.head_widths {
        let n = remaining.min(w);
        let mut parts: Vec<Array> = last.by_ref().take(n as usize).collect();
        if n < w {
            let d = parts[0].shape()[2];
            parts.push(ops::zeros_dtype(&[1, w - n, d], parts[0].dtype())?);
        }
        let group = head(&ops::concatenate(&parts, 1)?)?;
        outs.push(if n < w {
            group.index((.., ..n, ..))
        } else {
            group
        });
        remaining -= n;
    }
    Ok(if outs.len() == 1 {
        outs.pop().expect("one group")
    } else {
        ops::concatenate(&outs, 1)?
    })
}

/// Rows `rows` of `a` (on the first axis), in that order: a slice where they are
/// consecutive (no op, or a view), else a gather (its index from `uploads`).
pub(crate) fn pick_rows(a: &Array, rows: &[i32], uploads: &mut Uploads) -> Result<Array> {
    let first = rows[0];
    let consecutive = rows.iter().zip(first..).all(|(&r, want)| r == want);
    if !consecutive {
        return Ok(a.take_axis(uploads.get(rows), 0)?);
    }
    let end = first + rows.len() as i32;
    Ok(if first == 0 && end == a.shape()[0] {
        a.clone()
    } else {
        a.index(first..end)
    })
}

/// Arrays joined on the first axis (one is returned as it is).
pub(crate) fn join_rows(parts: &[&Array]) -> Result<Array> {
    Ok(match parts {
        [one] => (*one).clone(),
        _ => ops::concatenate(parts, 0)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_of_drawn_tokens_and_padding_is_a_slice_of_them() {
        let drawn = Array::from_slice(&[10u32, 11, 12], &[3]);
        let ids = |from: &[IdSource], host: &[u32]| {
            let ids = group_ids(&drawn, host, from).unwrap();
            ids.as_slice::<u32>().to_vec()
        };
        use IdSource::{Drawn, Host, Padding};
        assert_eq!(ids(&[Drawn(1), Drawn(2), Padding], &[0; 3]), [11, 12, 12]);
        assert_eq!(ids(&[Drawn(0), Host, Padding], &[0, 7, 0]), [10, 7, 0]);
    }
}
