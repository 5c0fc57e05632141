//! Decode-time eviction: the rules that keep the cache at a fixed size while decoding.

use burn::tensor::{Tensor, Transaction};
use kvslice_cache::{KvCache, KvStore, LayerKv};
use kvslice_policy::{Ladder, Temporal};

use super::attention;
use crate::error::{Result, RuntimeError};

/// How the cache behaves while decoding.
#[derive(Debug, Clone, PartialEq)]
pub enum DecodeRule {
    /// Evict once after the prefill; the cache then grows by one entry per generated token.
    Grow,
    /// Fixed size: the oldest entry after the `sinks` first positions goes (StreamingLLM).
    Recent { sinks: usize },
    /// Fixed size: the lowest accumulated attention goes, the `recent` newest positions kept
    /// (H2O).
    Accumulated { recent: usize },
    /// Fixed size: the lowest attention of the newest query, averaged over the layer's heads,
    /// goes (TOVA).
    LastQuery,
    /// Fixed size: when full, the ladder compacts each layer again (LaCache's iterative
    /// compaction), freeing `1/8` of the slots.
    Ladder(Ladder),
    /// Fixed size at each layer's own budget (CAKE's decoding phase): the entry with the lowest
    /// indicator `mean + γ·variance` of its attention over the last `window` decode queries
    /// goes; entries younger than `window` steps are kept. Until an entry has `window`
    /// observations its indicator is the prefill's.
    Indicator { window: usize, gamma: f32 },
    /// Fixed size: the entry with the lowest exponential moving average of its attention
    /// (averaged over the layer's heads, as TOVA's) goes (InertiaKV), the attention folded in
    /// at the refresh steps only (every step, every `r` steps, or never: score-free). Entries
    /// not scored yet stay.
    Inertia(Temporal),
}

/// Decode-time eviction state of a session whose cache stays at a fixed size.
#[derive(Debug)]
pub struct DecodeEviction {
    rule: DecodeRule,
    /// `[layer][kv_head][slot]` scores (accumulated or last attention).
    scores: Vec<Vec<Vec<f32>>>,
    /// Attention of the newest query per layer, `[kv_heads, capacity]`, not yet read back.
    pending: Vec<Option<Tensor<2>>>,
    /// LaCache's ladder cursor per layer, in slot order.
    cursors: Vec<usize>,
    /// CAKE: per `[layer][kv_head]`, the last `window` attention values of every slot
    /// (`slot * window + step % window`) and how many each slot has.
    history: Vec<Vec<(Vec<f32>, Vec<usize>)>>,
    steps: usize,
    /// Per layer, the used slots of each head when its pending attention was taken.
    lens: Vec<Vec<usize>>,
    /// Decode steps begun (counted at layer 0's query), for refresh schedules.
    ticks: usize,
    /// Entries evicted so far.
    pub evicted: usize,
}

impl DecodeEviction {
    pub(crate) fn new(rule: DecodeRule, cache: &KvCache, mut scores: Vec<Vec<Vec<f32>>>) -> Self {
        let g = cache.geometry();
        for (l, layer) in scores.iter_mut().enumerate() {
            if let Ok(kv) = cache.layer(l) {
                for s in layer.iter_mut() {
                    s.resize(kv.capacity(), 0.0);
                }
            }
        }
        if scores.len() != g.layers {
            scores = (0..g.layers)
                .map(|l| vec![vec![0.0; cache.layer(l).map(LayerKv::capacity).unwrap_or(0)]; g.kv_heads])
                .collect();
        }
        let sinks = match &rule {
            DecodeRule::Ladder(l) => l.sinks(),
            _ => 0,
        };
        let history = match &rule {
            DecodeRule::Indicator { window, .. } => (0..g.layers)
                .map(|l| {
                    let cap = cache.layer(l).map(LayerKv::capacity).unwrap_or(0);
                    vec![(vec![0.0; cap * window], vec![0; cap]); g.kv_heads]
                })
                .collect(),
            _ => Vec::new(),
        };
        DecodeEviction {
            rule,
            scores,
            pending: vec![None; g.layers],
            cursors: vec![sinks; g.layers],
            history,
            steps: 0,
            lens: vec![Vec::new(); g.layers],
            ticks: 0,
            evicted: 0,
        }
    }

    pub fn rule(&self) -> &DecodeRule {
        &self.rule
    }

    fn tracks_attention(&self) -> bool {
        match self.rule {
            DecodeRule::Accumulated { .. } | DecodeRule::LastQuery | DecodeRule::Indicator { .. } => true,
            DecodeRule::Inertia(t) => t.refresh.at(self.ticks),
            _ => false,
        }
    }

    /// Decode steps whose attention was folded into the scores.
    pub fn refreshes(&self) -> usize {
        self.steps
    }

    /// Reads the pending attention back and folds it into the scores.
    pub(crate) async fn absorb(&mut self) -> Result<()> {
        // every layer's attention in one read-back (one device sync per decode step)
        let mut layers = Vec::new();
        let mut tx = Transaction::default();
        for l in 0..self.pending.len() {
            if let Some(t) = self.pending[l].take() {
                layers.push((l, t.dims()));
                tx = tx.register(t);
            }
        }
        if layers.is_empty() {
            return Ok(());
        }
        let data = tx.execute_async().await.map_err(|e| RuntimeError::Readback(format!("{e:?}")))?;
        for ((l, [kv_heads, cap]), d) in layers.into_iter().zip(data) {
            let a = d.try_to_vec::<f32>().map_err(|e| RuntimeError::Readback(format!("{e:?}")))?;
            for h in 0..kv_heads {
                let row = &a[h * cap..(h + 1) * cap];
                let s = &mut self.scores[l][h];
                match self.rule {
                    DecodeRule::Accumulated { .. } => s.iter_mut().zip(row).for_each(|(x, &y)| *x += y),
                    DecodeRule::Indicator { window, gamma } => {
                        let (ring, counts) = &mut self.history[l][h];
                        for (slot, &a) in row.iter().enumerate().take(counts.len()) {
                            ring[slot * window + self.steps % window] = a;
                            counts[slot] += 1;
                            if counts[slot] >= window {
                                let vals = &ring[slot * window..(slot + 1) * window];
                                let mean = vals.iter().map(|&x| f64::from(x)).sum::<f64>() / window as f64;
                                let var = vals.iter().map(|&x| (f64::from(x) - mean).powi(2)).sum::<f64>()
                                    / (window - 1) as f64;
                                s[slot] = (mean + f64::from(gamma) * var) as f32;
                            }
                        }
                    }
                    DecodeRule::Inertia(t) => {
                        // free slots carry no score
                        let len = s.len().min(row.len());
                        let mut step = row[..len].to_vec();
                        let used = self.lens.get(l).and_then(|x| x.get(h)).copied().unwrap_or(len);
                        step.iter_mut().skip(used).for_each(|x| *x = f32::NAN);
                        t.fold(&mut s[..len], &step);
                    }
                    _ => s.copy_from_slice(row),
                }
            }
        }
        self.steps += 1;
        Ok(())
    }

    /// The slot each head of `layer` writes the token at `position` into.
    fn choose_slots(&mut self, layer: usize, kv: &LayerKv, position: u32) -> Vec<usize> {
        let cap = kv.capacity();
        (0..kv.lens().len())
            .map(|h| {
                let len = kv.lens()[h];
                if len < cap {
                    return len;
                }
                let pos = kv.head_positions(h);
                let victim = match self.rule {
                    DecodeRule::Recent { sinks } => {
                        (0..len).filter(|&s| pos[s] as usize >= sinks).min_by_key(|&s| pos[s]).unwrap_or(len - 1)
                    }
                    DecodeRule::Accumulated { recent } | DecodeRule::Indicator { window: recent, .. } => {
                        let newest = position.saturating_sub(recent as u32);
                        let scores = &self.scores[layer][h];
                        (0..len)
                            .filter(|&s| pos[s] < newest)
                            .min_by(|&a, &b| scores[a].total_cmp(&scores[b]).then(pos[a].cmp(&pos[b])))
                            .unwrap_or_else(|| (0..len).min_by_key(|&s| pos[s]).unwrap_or(0))
                    }
                    DecodeRule::Inertia(_) => Temporal::victim(&self.scores[layer][h][..len], &pos[..len])
                        .unwrap_or_else(|| (0..len).min_by_key(|&s| pos[s]).unwrap_or(0)),
                    _ => {
                        let scores = &self.scores[layer][h];
                        (0..len).min_by(|&a, &b| scores[a].total_cmp(&scores[b]).then(pos[a].cmp(&pos[b]))).unwrap_or(0)
                    }
                };
                self.evicted += 1;
                victim
            })
            .collect()
    }
}

/// The session's cache with decode-time eviction in front of it.
pub(crate) struct EvictingStore<'c> {
    pub cache: &'c mut KvCache,
    pub eviction: &'c mut DecodeEviction,
}

impl EvictingStore<'_> {
    /// LaCache: compacts a full layer along the ladder before the new token comes in.
    fn ladder_compact(&mut self, layer: usize, ladder: Ladder) -> kvslice_cache::Result<()> {
        let layers = self.cache.geometry().layers;
        let kv = self.cache.layer(layer)?;
        let cap = kv.capacity();
        if kv.lens().iter().all(|&l| l < cap) {
            return Ok(());
        }
        let free = (cap / 8).max(1);
        let mut slots = Vec::with_capacity(kv.lens().len());
        for h in 0..kv.lens().len() {
            // Slots in source order: the ladder works on the sequence as cached.
            let pos = kv.head_positions(h);
            let mut order: Vec<u32> = (0..pos.len() as u32).collect();
            order.sort_by_key(|&s| pos[s as usize]);
            let plan =
                ladder.compact(layers, order.len(), order.len().saturating_sub(free), self.eviction.cursors[layer]);
            let keep: Vec<u32> = plan.kept[layer].iter().map(|&i| order[i as usize]).collect();
            if h == 0 {
                self.eviction.cursors[layer] = plan.cursor.min(cap.saturating_sub(free + 1));
            }
            self.eviction.evicted += order.len() - keep.len();
            slots.push(keep);
        }
        // slots are in source order here (the ladder appends, never reuses slots), so the
        // kept lists are ascending: the in-place compaction kernel applies on wgpu
        for list in &mut slots {
            list.sort_unstable();
        }
        self.cache.layer_mut(layer)?.compact(&slots)
    }
}

impl KvStore for EvictingStore<'_> {
    fn append(
        &mut self,
        layer: usize,
        keys: Tensor<3>,
        values: Tensor<3>,
        positions: &[u32],
    ) -> kvslice_cache::Result<()> {
        if positions.len() != 1 {
            return self.cache.append(layer, keys, values, positions);
        }
        if let DecodeRule::Ladder(ladder) = self.eviction.rule {
            self.ladder_compact(layer, ladder)?;
            return self.cache.append(layer, keys, values, positions);
        }
        let kv = self.cache.layer(layer)?;
        let slots = self.eviction.choose_slots(layer, kv, positions[0]);
        let fresh = if matches!(self.eviction.rule, DecodeRule::Inertia(_)) { f32::NAN } else { 0.0 };
        for (h, &s) in slots.iter().enumerate() {
            if let Some(x) = self.eviction.scores.get_mut(layer).and_then(|l| l.get_mut(h)).and_then(|r| r.get_mut(s)) {
                *x = fresh;
            }
            if let Some((_, counts)) = self.eviction.history.get_mut(layer).and_then(|l| l.get_mut(h)) {
                counts[s] = 0;
            }
        }
        self.cache.layer_mut(layer)?.write_slots(&slots, keys, values, positions[0])
    }

    fn layer(&self, layer: usize) -> kvslice_cache::Result<&LayerKv> {
        self.cache.layer(layer)
    }

    fn observe_queries(&mut self, layer: usize, rotated: &Tensor<3>, _raw: &Tensor<3>) -> kvslice_cache::Result<()> {
        if rotated.dims()[1] != 1 {
            return Ok(());
        }
        if layer == 0 {
            self.eviction.ticks += 1;
        }
        if !self.eviction.tracks_attention() {
            return Ok(());
        }
        let kv = self.cache.layer(layer)?;
        if let Some(l) = self.eviction.lens.get_mut(layer) {
            *l = kv.lens().to_vec();
        }
        self.eviction.pending[layer] = Some(attention::slot_attention(
            rotated,
            kv,
            matches!(self.eviction.rule, DecodeRule::LastQuery | DecodeRule::Inertia(_)),
        ));
        Ok(())
    }
}

