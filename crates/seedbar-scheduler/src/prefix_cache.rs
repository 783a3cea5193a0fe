//! KV of recent sequences, reused when a new request starts with the same tokens (the next
//! turn of a conversation, the same prompt again). Reuse stops at a multiple of the
//! layout's granularity (`Layout::reuse_granularity`), so a hit equals a miss. An entry whose sliding-window layers let old positions go serves
//! only the lengths where that is exact (`kv_cache::reusable_from`). This is the RAM tier;
//! `disk_cache` keeps sequences' KV on disk under it.

use seedbar_engine::step::{
    kv_cache::{self, KvCache},
    plan::Layout,
};

struct Entry {
    tokens: Vec<u32>,
    caches: Vec<KvCache>,
    last_used: u64,
}

/// Bytes a sequence's caches hold, over all layers.
fn cost(caches: &[KvCache]) -> usize {
    caches.iter().map(KvCache::bytes).sum()
}

/// How much of `prompt` a sequence of `tokens` serves: their common prefix, leaving at least
/// one prompt token to prefill (its logits start the reply), cut to a multiple of
/// `granularity`; `None` where that is nothing, or shorter than the sequence's caches can
/// be cut back to (`kv_cache::reusable_from`).
pub(crate) fn usable_prefix(
    tokens: &[u32],
    prompt: &[u32],
    granularity: usize,
    reusable_from: i32,
) -> Option<usize> {
    let common = tokens
        .iter()
        .zip(prompt)
        .take_while(|(a, b)| a == b)
        .count();
    let usable = common.min(prompt.len().saturating_sub(1)) / granularity * granularity;
    (usable > 0 && usable as i32 >= reusable_from).then_some(usable)
}

pub struct PrefixCache {
    entries: Vec<Entry>,
    /// Bytes of KV the cache may hold, over all entries.
    budget_bytes: usize,
    /// Reuse ends at a multiple of this many tokens.
    granularity: usize,
    clock: u64,
}

impl PrefixCache {
    /// A cache of `budget_bytes` for a layout.
    pub fn new(budget_bytes: usize, layout: &Layout) -> Self {
        PrefixCache {
            entries: Vec::new(),
            budget_bytes,
            granularity: layout.reuse_granularity(),
            clock: 0,
        }
    }

    /// The longest reusable prefix of `prompt`: its length and caches holding exactly it.
    /// At least one prompt token is always left to prefill (its logits start the reply).
    pub fn lookup(&mut self, prompt: &[u32]) -> Option<(usize, Vec<KvCache>)> {
        self.clock += 1;
        let (index, usable) = self
            .entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                let reusable_from = kv_cache::reusable_from(&e.caches);
                Some((
                    i,
                    usable_prefix(&e.tokens, prompt, self.granularity, reusable_from)?,
                ))
            })
            .max_by_key(|(_, n)| *n)?;
        let entry = &mut self.entries[index];
        entry.last_used = self.clock;
        let mut caches = entry.caches.clone();
        for c in &mut caches {
            c.truncate(usable as i32).ok()?;
        }
        Some((usable, caches))
    }

    /// Keep `caches` (holding `tokens`) for later requests, evicting the least recently used.
    pub fn insert(&mut self, tokens: Vec<u32>, caches: Vec<KvCache>) {
        if tokens.len() < self.granularity || cost(&caches) > self.budget_bytes {
            return;
        }
        self.clock += 1;
        // An entry the new one extends is dropped, unless it serves shorter prefixes than
        // the new one can (the new one's windows let positions go that it still holds).
        let reusable_from = kv_cache::reusable_from(&caches);
        self.entries.retain(|e| {
            !(tokens.starts_with(&e.tokens) && reusable_from <= kv_cache::reusable_from(&e.caches))
        });
        self.entries.push(Entry {
            tokens,
            caches,
            last_used: self.clock,
        });
        while self.entries.iter().map(|e| cost(&e.caches)).sum::<usize>() > self.budget_bytes {
            let oldest = (0..self.entries.len())
                .min_by_key(|&i| self.entries[i].last_used)
                .expect("non-empty while over budget");
            self.entries.remove(oldest);
        }
    }
}
