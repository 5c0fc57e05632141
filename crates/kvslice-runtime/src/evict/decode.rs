//! Decode-time eviction: the rules that keep the cache at a fixed size while decoding.
//!
//! A policy declares its rule ([`DecodeRule`]); the runtime builds the rule's own state (one
//! small type per rule, behind [`RuleState`]) and puts it in front of the cache
//! ([`EvictingStore`]). Each decode step a full head writes the new token over the slot its
//! rule gives up; rules that rank by attention read the newest query's attention
//! ([`super::attention`]) and fold it in once per step ([`DecodeEviction::absorb`]).
//!
//! State changes only after the write they follow succeeded: a failed write leaves the scores,
//! cursors and counters as they were.

use burn::tensor::{Tensor, Transaction};
use kvslice_cache::{KvCache, KvStore, LayerKv};
use kvslice_policy::{DecodeRule, Ladder, Temporal};

use super::attention;
use super::recompress::Recompressor;
use crate::error::{Result, RuntimeError};

/// Whether `rule` ranks entries by scores that start from the prefill's (the rules whose state
/// is built from the policy's prompt scores).
pub(crate) fn starts_from_scores(rule: &DecodeRule) -> bool {
    matches!(
        rule,
        DecodeRule::Accumulated { .. } | DecodeRule::LastQuery | DecodeRule::Indicator { .. } | DecodeRule::Inertia(_)
    )
}

/// The state of `rule` over `cache`, its scores starting from `scores`
/// (`[layer][kv_head][slot]`; empty: zeros). `None` for the rules that keep no per-step state
/// here: [`DecodeRule::Grow`], and [`DecodeRule::Recompress`], whose cache grows between two
/// compressions ([`super::recompress`]).
pub(crate) fn rule_state(rule: &DecodeRule, cache: &KvCache, scores: Vec<Vec<Vec<f32>>>) -> Option<Box<dyn RuleState>> {
    let scores = || SlotScores::new(cache, scores.clone());
    Some(match *rule {
        DecodeRule::Grow | DecodeRule::Recompress { .. } => return None,
        DecodeRule::Recent { sinks } => Box::new(Recent { sinks }),
        DecodeRule::Accumulated { recent } => Box::new(Accumulated { recent, scores: scores() }),
        DecodeRule::LastQuery => Box::new(LastQuery { scores: scores() }),
        DecodeRule::Ladder(ladder) => {
            Box::new(LadderState { ladder, cursors: vec![ladder.sinks(); cache.geometry().layers] })
        }
        DecodeRule::Indicator { window, gamma } => {
            let window = window.max(2);
            let history = cache
                .layers()
                .iter()
                .map(|l| vec![Ring::new(l.capacity(), window); cache.geometry().kv_heads])
                .collect();
            Box::new(Indicator { window, gamma, scores: scores(), history })
        }
        DecodeRule::Inertia(temporal) => Box::new(Inertia { temporal, scores: scores() }),
    })
}

/// Which attention of the newest query a rule reads at a decode step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reads {
    Nothing,
    /// Averaged over each KV head's group of query heads.
    GroupMean,
    /// Averaged over every head of the layer (TOVA's score).
    LayerMean,
}

/// What a rule gives up when the token at `position` arrives at a full head.
pub(crate) trait RuleState: std::fmt::Debug + Send {
    /// The attention the rule reads at decode tick `tick` (1-based).
    fn reads(&self, tick: usize) -> Reads {
        let _ = tick;
        Reads::Nothing
    }

    /// Folds one head's attention row (one value per slot; slots `used..` are free) in, at the
    /// rule's `step`-th absorbed step (0-based).
    fn absorb(&mut self, layer: usize, head: usize, row: &[f32], used: usize, step: usize) {
        let _ = (layer, head, row, used, step);
    }

    /// The slot of a full head (slots hold source `positions`) that the token at `position`
    /// takes.
    fn victim(&self, layer: usize, head: usize, positions: &[u32], position: u32) -> usize;

    /// A new entry now lives in `slot`.
    fn took(&mut self, layer: usize, head: usize, slot: usize) {
        let _ = (layer, head, slot);
    }

    /// Rules that compact a full layer rather than overwrite one slot (LaCache): the kept
    /// slots of every head (ascending) and the next state, or `None` when nothing is to be
    /// compacted. Pure: [`RuleState::compacted`] commits.
    fn compaction(&self, layer: usize, layers: usize, kv: &LayerKv) -> Option<(Vec<Vec<u32>>, usize)> {
        let _ = (layer, layers, kv);
        None
    }

    /// The compaction of `layer` succeeded; `cursor` is the state it was planned with.
    fn compacted(&mut self, layer: usize, cursor: usize) {
        let _ = (layer, cursor);
    }

    /// Per-slot scores of one head (for reports and tests); empty for position rules.
    fn scores(&self, layer: usize, head: usize) -> &[f32] {
        let _ = (layer, head);
        &[]
    }
}

/// `[layer][kv_head][slot]` scores, sized to each layer's capacity.
#[derive(Debug, Clone)]
struct SlotScores(Vec<Vec<Vec<f32>>>);

impl SlotScores {
    fn new(cache: &KvCache, mut scores: Vec<Vec<Vec<f32>>>) -> Self {
        let g = cache.geometry();
        if scores.len() != g.layers {
            scores = vec![vec![Vec::new(); g.kv_heads]; g.layers];
        }
        for (layer, kv) in scores.iter_mut().zip(cache.layers()) {
            layer.resize(g.kv_heads, Vec::new());
            for s in layer.iter_mut() {
                s.resize(kv.capacity(), 0.0);
            }
        }
        SlotScores(scores)
    }

    fn head(&self, layer: usize, head: usize) -> &[f32] {
        self.0.get(layer).and_then(|l| l.get(head)).map_or(&[], Vec::as_slice)
    }

    fn head_mut(&mut self, layer: usize, head: usize) -> Option<&mut Vec<f32>> {
        self.0.get_mut(layer).and_then(|l| l.get_mut(head))
    }

    fn set(&mut self, layer: usize, head: usize, slot: usize, value: f32) {
        if let Some(x) = self.head_mut(layer, head).and_then(|s| s.get_mut(slot)) {
            *x = value;
        }
    }
}

/// The oldest slot (smallest source position); 0 for an empty head.
fn oldest(positions: &[u32]) -> usize {
    (0..positions.len()).min_by_key(|&s| positions[s]).unwrap_or(0)
}

/// The lowest-scoring slot among `candidates`, ties to the older position.
fn lowest(scores: &[f32], positions: &[u32], candidates: impl Iterator<Item = usize>) -> Option<usize> {
    candidates
        .filter(|&s| s < scores.len())
        .min_by(|&a, &b| scores[a].total_cmp(&scores[b]).then(positions[a].cmp(&positions[b])))
}

/// StreamingLLM: the oldest entry after the sinks goes.
#[derive(Debug)]
struct Recent {
    sinks: usize,
}

impl RuleState for Recent {
    fn victim(&self, _: usize, _: usize, positions: &[u32], _: u32) -> usize {
        (0..positions.len())
            .filter(|&s| positions[s] as usize >= self.sinks)
            .min_by_key(|&s| positions[s])
            .unwrap_or(positions.len().saturating_sub(1))
    }
}

/// The lowest score among the entries older than the `recent` newest positions, else the
/// oldest entry.
fn lowest_outside_recent(scores: &[f32], positions: &[u32], position: u32, recent: usize) -> usize {
    let newest = position.saturating_sub(recent as u32);
    lowest(scores, positions, (0..positions.len()).filter(|&s| positions[s] < newest))
        .unwrap_or_else(|| oldest(positions))
}

/// H2O: accumulated attention; the `recent` newest positions stay.
#[derive(Debug)]
struct Accumulated {
    recent: usize,
    scores: SlotScores,
}

impl RuleState for Accumulated {
    fn reads(&self, _: usize) -> Reads {
        Reads::GroupMean
    }

    fn absorb(&mut self, layer: usize, head: usize, row: &[f32], _: usize, _: usize) {
        if let Some(s) = self.scores.head_mut(layer, head) {
            s.iter_mut().zip(row).for_each(|(x, &y)| *x += y);
        }
    }

    fn victim(&self, layer: usize, head: usize, positions: &[u32], position: u32) -> usize {
        lowest_outside_recent(self.scores.head(layer, head), positions, position, self.recent)
    }

    fn took(&mut self, layer: usize, head: usize, slot: usize) {
        self.scores.set(layer, head, slot, 0.0);
    }

    fn scores(&self, layer: usize, head: usize) -> &[f32] {
        self.scores.head(layer, head)
    }
}

/// TOVA: the newest query's attention, averaged over the layer's heads.
#[derive(Debug)]
struct LastQuery {
    scores: SlotScores,
}

impl RuleState for LastQuery {
    fn reads(&self, _: usize) -> Reads {
        Reads::LayerMean
    }

    fn absorb(&mut self, layer: usize, head: usize, row: &[f32], _: usize, _: usize) {
        if let Some(s) = self.scores.head_mut(layer, head) {
            let n = s.len().min(row.len());
            s[..n].copy_from_slice(&row[..n]);
        }
    }

    fn victim(&self, layer: usize, head: usize, positions: &[u32], _: u32) -> usize {
        lowest(self.scores.head(layer, head), positions, 0..positions.len()).unwrap_or(0)
    }

    fn took(&mut self, layer: usize, head: usize, slot: usize) {
        self.scores.set(layer, head, slot, 0.0);
    }

    fn scores(&self, layer: usize, head: usize) -> &[f32] {
        self.scores.head(layer, head)
    }
}

/// The last `window` attention values of every slot of one head.
#[derive(Debug, Clone)]
struct Ring {
    /// `slot * window + step % window`.
    values: Vec<f32>,
    /// Observations per slot since its entry arrived.
    counts: Vec<usize>,
}

impl Ring {
    fn new(capacity: usize, window: usize) -> Self {
        Ring { values: vec![0.0; capacity * window], counts: vec![0; capacity] }
    }
}

/// CAKE's decoding phase: `mean + γ·variance` over the last `window` decode queries.
#[derive(Debug)]
struct Indicator {
    window: usize,
    gamma: f32,
    scores: SlotScores,
    history: Vec<Vec<Ring>>,
}

impl RuleState for Indicator {
    fn reads(&self, _: usize) -> Reads {
        Reads::GroupMean
    }

    fn absorb(&mut self, layer: usize, head: usize, row: &[f32], _: usize, step: usize) {
        let w = self.window;
        let (Some(ring), Some(s)) = (
            self.history.get_mut(layer).and_then(|l| l.get_mut(head)),
            self.scores.0.get_mut(layer).and_then(|l| l.get_mut(head)),
        ) else {
            return;
        };
        for (slot, &a) in row.iter().enumerate().take(ring.counts.len()) {
            ring.values[slot * w + step % w] = a;
            ring.counts[slot] += 1;
            if ring.counts[slot] >= w {
                let vals = &ring.values[slot * w..(slot + 1) * w];
                let mean = vals.iter().map(|&x| f64::from(x)).sum::<f64>() / w as f64;
                let var = vals.iter().map(|&x| (f64::from(x) - mean).powi(2)).sum::<f64>() / (w - 1) as f64;
                if let Some(x) = s.get_mut(slot) {
                    *x = (mean + f64::from(self.gamma) * var) as f32;
                }
            }
        }
    }

    fn victim(&self, layer: usize, head: usize, positions: &[u32], position: u32) -> usize {
        lowest_outside_recent(self.scores.head(layer, head), positions, position, self.window)
    }

    fn took(&mut self, layer: usize, head: usize, slot: usize) {
        self.scores.set(layer, head, slot, 0.0);
        if let Some(c) = self.history.get_mut(layer).and_then(|l| l.get_mut(head)).and_then(|r| r.counts.get_mut(slot))
        {
            *c = 0;
        }
    }

    fn scores(&self, layer: usize, head: usize) -> &[f32] {
        self.scores.head(layer, head)
    }
}

/// InertiaKV: an exponential moving average of the layer-mean attention, folded in at the
/// refresh steps; entries not scored yet (`NaN`) stay.
#[derive(Debug)]
struct Inertia {
    temporal: Temporal,
    scores: SlotScores,
}

impl RuleState for Inertia {
    fn reads(&self, tick: usize) -> Reads {
        if self.temporal.refresh.at(tick) { Reads::LayerMean } else { Reads::Nothing }
    }

    fn absorb(&mut self, layer: usize, head: usize, row: &[f32], used: usize, _: usize) {
        let Some(s) = self.scores.head_mut(layer, head) else { return };
        let len = s.len().min(row.len());
        // free slots carry no score
        let mut step = row[..len].to_vec();
        step.iter_mut().skip(used).for_each(|x| *x = f32::NAN);
        self.temporal.fold(&mut s[..len], &step);
    }

    fn victim(&self, layer: usize, head: usize, positions: &[u32], _: u32) -> usize {
        let s = self.scores.head(layer, head);
        let len = positions.len().min(s.len());
        Temporal::victim(&s[..len], &positions[..len]).unwrap_or_else(|| oldest(positions))
    }

    fn took(&mut self, layer: usize, head: usize, slot: usize) {
        self.scores.set(layer, head, slot, f32::NAN);
    }

    fn scores(&self, layer: usize, head: usize) -> &[f32] {
        self.scores.head(layer, head)
    }
}

/// LaCache: a full layer is compacted along the ladder (an eighth of its slots freed), then the
/// token appended.
#[derive(Debug)]
struct LadderState {
    ladder: Ladder,
    /// The ladder's cursor per layer, in slot order.
    cursors: Vec<usize>,
}

impl RuleState for LadderState {
    fn victim(&self, _: usize, _: usize, positions: &[u32], _: u32) -> usize {
        // not reached: the layer is compacted before a head is full
        oldest(positions)
    }

    fn compaction(&self, layer: usize, layers: usize, kv: &LayerKv) -> Option<(Vec<Vec<u32>>, usize)> {
        let cap = kv.capacity();
        if kv.lens().iter().all(|&l| l < cap) {
            return None;
        }
        let free = (cap / 8).max(1);
        let cursor = self.cursors.get(layer).copied().unwrap_or(0);
        let mut next = cursor;
        let mut slots = Vec::with_capacity(kv.lens().len());
        for h in 0..kv.lens().len() {
            // slots in source order: the ladder works on the sequence as cached
            let pos = kv.head_positions(h);
            let mut order: Vec<u32> = (0..pos.len() as u32).collect();
            order.sort_by_key(|&s| pos[s as usize]);
            let plan = self.ladder.compact(layers, order.len(), order.len().saturating_sub(free), cursor);
            let mut keep: Vec<u32> =
                plan.kept.get(layer).map(|k| k.iter().map(|&i| order[i as usize]).collect()).unwrap_or_default();
            if h == 0 {
                next = plan.cursor.min(cap.saturating_sub(free + 1));
            }
            // ascending, for the in-place compaction kernel
            keep.sort_unstable();
            slots.push(keep);
        }
        Some((slots, next))
    }

    fn compacted(&mut self, layer: usize, cursor: usize) {
        if let Some(c) = self.cursors.get_mut(layer) {
            *c = cursor;
        }
    }
}

/// Decode-time eviction state of a session whose cache stays at a fixed size: the rule's own
/// state and the attention it has yet to fold in.
#[derive(Debug)]
pub struct DecodeEviction {
    rule: DecodeRule,
    state: Box<dyn RuleState>,
    /// Attention of the newest query per layer, `[kv_heads, capacity]`, not yet read back,
    /// with the used slots of each head when it was taken.
    pending: Vec<Option<(Tensor<2>, Vec<usize>)>>,
    /// Decode steps whose attention was folded in.
    steps: usize,
    /// Decode steps begun (counted at layer 0's query), for refresh schedules.
    ticks: usize,
    /// Entries evicted so far.
    pub evicted: usize,
    /// Decode-time recompression ([`DecodeRule::Recompress`]); the rule state is then only the
    /// fallback for a full head (oldest entry after the sinks), which a session that steps
    /// through [`crate::Session::step`] never reaches.
    recompress: Option<Recompressor>,
}

impl DecodeEviction {
    /// The eviction of `rule` over `cache`; `None` for a growing cache. Rules that rank by
    /// scores start from `scores` (`[layer][kv_head][slot]`).
    pub(crate) fn new(rule: DecodeRule, cache: &KvCache, scores: Vec<Vec<Vec<f32>>>) -> Option<Self> {
        let state = rule_state(&rule, cache, scores)?;
        Some(DecodeEviction {
            rule,
            state,
            pending: vec![None; cache.geometry().layers],
            steps: 0,
            ticks: 0,
            evicted: 0,
            recompress: None,
        })
    }

    /// Decode-time recompression by `recompressor` over `cache` (rule `rule`); `sinks`: the
    /// policy's protected first positions, kept by the fallback rule.
    pub(crate) fn recompressing(rule: DecodeRule, recompressor: Recompressor, cache: &KvCache, sinks: usize) -> Self {
        DecodeEviction {
            rule,
            state: Box::new(Recent { sinks }),
            pending: vec![None; cache.geometry().layers],
            steps: 0,
            ticks: 0,
            evicted: 0,
            recompress: Some(recompressor),
        }
    }

    /// Compressions of the whole cache run while decoding ([`DecodeRule::Recompress`]).
    pub fn recompressions(&self) -> usize {
        self.recompress.as_ref().map_or(0, |r| r.compressions)
    }

    /// Before a decode step: compresses the cache back to the budget when the recompression
    /// interval has passed.
    pub(crate) async fn before_step(&mut self, model: &kvslice_model::Llama, cache: &mut KvCache) -> Result<()> {
        if let Some(r) = self.recompress.as_mut().filter(|r| r.due()) {
            self.evicted += r.compress(model, cache).await?;
        }
        Ok(())
    }

    /// A decode step went through every layer.
    pub(crate) fn after_step(&mut self) {
        if let Some(r) = &mut self.recompress {
            r.stepped();
        }
    }

    pub fn rule(&self) -> &DecodeRule {
        &self.rule
    }

    /// Decode steps whose attention was folded into the scores.
    pub fn refreshes(&self) -> usize {
        self.steps
    }

    /// Per-slot scores of one head (empty for position rules).
    pub fn scores(&self, layer: usize, head: usize) -> &[f32] {
        self.state.scores(layer, head)
    }

    /// Forgets the attention of a step that did not complete.
    pub(crate) fn discard_pending(&mut self) {
        self.pending.iter_mut().for_each(|p| *p = None);
    }

    /// Reads the pending attention back (every layer in one read-back: one device sync per
    /// decode step) and folds it into the scores.
    pub(crate) async fn absorb(&mut self) -> Result<()> {
        let mut layers = Vec::new();
        let mut tx = Transaction::default();
        for (l, p) in self.pending.iter_mut().enumerate() {
            if let Some((t, lens)) = p.take() {
                layers.push((l, t.dims(), lens));
                tx = tx.register(t);
            }
        }
        if layers.is_empty() {
            return Ok(());
        }
        let data = tx.execute_async().await.map_err(|e| RuntimeError::Readback(format!("{e:?}")))?;
        let mut rows = Vec::with_capacity(layers.len());
        for ((l, [kv_heads, cap], lens), d) in layers.into_iter().zip(data) {
            let a = d.try_to_vec::<f32>().map_err(|e| RuntimeError::Readback(format!("{e:?}")))?;
            if a.len() != kv_heads * cap {
                return Err(RuntimeError::Readback(format!("attention of layer {l}: {} values", a.len())));
            }
            rows.push((l, kv_heads, cap, lens, a));
        }
        for (l, kv_heads, cap, lens, a) in rows {
            for h in 0..kv_heads {
                let used = lens.get(h).copied().unwrap_or(cap);
                self.state.absorb(l, h, &a[h * cap..(h + 1) * cap], used, self.steps);
            }
        }
        self.steps += 1;
        Ok(())
    }
}

/// The session's cache with decode-time eviction in front of it.
pub(crate) struct EvictingStore<'c> {
    pub cache: &'c mut KvCache,
    pub eviction: &'c mut DecodeEviction,
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
        let layers = self.cache.geometry().layers;
        let kv = self.cache.layer(layer)?;
        if let Some((mut slots, cursor)) = self.eviction.state.compaction(layer, layers, kv) {
            if let Some(layout) = kv.latent_layout() {
                super::latent::align_kept(&mut slots, layout, |_, _| 0.0);
            }
            let evicted: usize = kv.lens().iter().zip(&slots).map(|(&n, k)| n - k.len().min(n)).sum();
            self.cache.layer_mut(layer)?.compact(&slots)?;
            self.eviction.state.compacted(layer, cursor);
            self.eviction.evicted += evicted;
            return self.cache.append(layer, keys, values, positions);
        }
        let cap = kv.capacity();
        let mut slots: Vec<usize> = (0..kv.lens().len())
            .map(|h| {
                let len = kv.lens()[h];
                if len < cap { len } else { self.eviction.state.victim(layer, h, kv.head_positions(h), positions[0]) }
            })
            .collect();
        if let Some(layout) = kv.latent_layout() {
            let state = &self.eviction.state;
            super::latent::align_victims(&mut slots, layout, |h, s| state.scores(layer, h).get(s).copied());
        }
        let full = kv.lens().iter().filter(|&&len| len >= cap).count();
        self.cache.layer_mut(layer)?.write_slots(&slots, keys, values, positions[0])?;
        for (h, &s) in slots.iter().enumerate() {
            self.eviction.state.took(layer, h, s);
        }
        self.eviction.evicted += full;
        Ok(())
    }

    fn layer(&self, layer: usize) -> kvslice_cache::Result<&LayerKv> {
        self.cache.layer(layer)
    }

    fn observe_queries(&mut self, layer: usize, rotated: &Tensor<3>, _raw: &Tensor<3>) -> kvslice_cache::Result<()> {
        if rotated.dims()[1] != 1 {
            return Ok(());
        }
        if let Some(r) = &mut self.eviction.recompress {
            r.record(layer, rotated);
        }
        if layer == 0 {
            self.eviction.ticks += 1;
        }
        let all_heads = match self.eviction.state.reads(self.eviction.ticks) {
            Reads::Nothing => return Ok(()),
            Reads::GroupMean => false,
            Reads::LayerMean => true,
        };
        let kv = self.cache.layer(layer)?;
        if let Some(p) = self.eviction.pending.get_mut(layer) {
            *p = Some((attention::slot_attention(rotated, kv, all_heads), kv.lens().to_vec()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! Each rule's choice on hand-made scores and positions, worked out by hand from the
    //! rule's definition; and the store's promise that a failed write changes no state.
    use burn::tensor::{Device, Tensor, TensorData};
    use kvslice_cache::{CacheGeometry, KvCache, KvStore};
    use kvslice_policy::{Ladder, Refresh, Temporal};

    use super::*;

    const HEAD_DIM: usize = 4;

    /// One layer, two KV heads, `capacity` slots, holding source positions `0..len`.
    fn cache(capacity: usize, len: usize) -> KvCache {
        let device = Device::flex();
        let g = CacheGeometry { layers: 1, kv_heads: 2, head_dim: HEAD_DIM, capacity };
        let mut cache = KvCache::new(g, &device).unwrap();
        if len > 0 {
            let kv = || {
                Tensor::<3>::from_data(TensorData::new(vec![0.5f32; 2 * len * HEAD_DIM], [2, len, HEAD_DIM]), &device)
            };
            let positions: Vec<u32> = (0..len as u32).collect();
            cache.append(0, kv(), kv(), &positions).unwrap();
        }
        cache
    }

    fn state(rule: DecodeRule, scores: &[[f32; 4]; 2]) -> Box<dyn RuleState> {
        let scores = vec![scores.iter().map(|h| h.to_vec()).collect()];
        rule_state(&rule, &cache(4, 4), scores).expect("a fixed-size rule")
    }

    #[test]
    fn grow_has_no_state() {
        assert!(rule_state(&DecodeRule::Grow, &cache(4, 4), Vec::new()).is_none());
    }

    #[test]
    fn recent_evicts_the_oldest_after_the_sinks() {
        let s = state(DecodeRule::Recent { sinks: 2 }, &[[0.0; 4]; 2]);
        // positions 0 and 1 are sinks: position 2 is the oldest evictable
        assert_eq!(s.victim(0, 0, &[0, 1, 2, 3], 4), 2);
        // slots out of source order (decode-time overwrites): position 5 at slot 0
        assert_eq!(s.victim(0, 1, &[5, 0, 9, 1, 7], 10), 0);
        assert_eq!(s.reads(1), Reads::Nothing);
    }

    #[test]
    fn accumulated_adds_attention_and_spares_the_recent() {
        let mut s = state(DecodeRule::Accumulated { recent: 2 }, &[[0.5, 0.1, 0.3, 0.2], [0.0; 4]]);
        assert_eq!(s.reads(7), Reads::GroupMean);
        s.absorb(0, 0, &[0.1, 0.3, 0.0, 0.05], 4, 0);
        // 0.6, 0.4, 0.3, 0.25: positions 2 and 3 are within 2 of the new position 4
        assert_eq!(s.scores(0, 0), &[0.6, 0.4, 0.3, 0.25]);
        assert_eq!(s.victim(0, 0, &[0, 1, 2, 3], 4), 1);
        // nothing older than the recent window: the oldest entry goes
        assert_eq!(s.victim(0, 0, &[0, 1, 2, 3], 1), 0);
        s.took(0, 0, 1);
        assert_eq!(s.scores(0, 0)[1], 0.0);
    }

    #[test]
    fn last_query_keeps_only_the_newest_attention() {
        let mut s = state(DecodeRule::LastQuery, &[[9.0; 4], [9.0; 4]]);
        assert_eq!(s.reads(3), Reads::LayerMean);
        s.absorb(0, 1, &[0.4, 0.1, 0.1, 0.4], 4, 0);
        assert_eq!(s.scores(0, 1), &[0.4, 0.1, 0.1, 0.4]);
        // a tie between slots 1 and 2 goes to the older position: slot 2 holds position 3
        assert_eq!(s.victim(0, 1, &[0, 8, 3, 5], 9), 2);
        // head 0 kept the prefill's scores
        assert_eq!(s.scores(0, 0), &[9.0; 4]);
    }

    #[test]
    fn indicator_is_mean_plus_gamma_variance_over_the_window() {
        let mut s = state(DecodeRule::Indicator { window: 2, gamma: 10.0 }, &[[1.0, 1.0, 1.0, 1.0], [0.0; 4]]);
        s.absorb(0, 0, &[0.2, 0.3, 0.1, 0.5], 4, 0);
        // one observation of two: still the prefill's indicator
        assert_eq!(s.scores(0, 0), &[1.0; 4]);
        s.absorb(0, 0, &[0.4, 0.3, 0.1, 0.1], 4, 1);
        // slot 0: mean 0.3, sample variance ((-0.1)² + 0.1²)/1 = 0.02 → 0.3 + 10·0.02 = 0.5
        // slot 1: 0.3 + 0; slot 2: 0.1 + 0; slot 3: mean 0.3, variance 0.08 → 1.1
        let want = [0.5, 0.3, 0.1, 1.1];
        for (got, want) in s.scores(0, 0).iter().zip(want) {
            assert!((got - want).abs() < 1e-6, "{:?}", s.scores(0, 0));
        }
        // the window (2) protects positions 8 and 9 when position 10 arrives
        assert_eq!(s.victim(0, 0, &[3, 4, 8, 9], 10), 1);
        // a third step overwrites the oldest observation: slot 0 now [0.6, 0.4]
        s.absorb(0, 0, &[0.6, 0.3, 0.1, 0.1], 4, 2);
        assert!((s.scores(0, 0)[0] - (0.5 + 10.0 * 0.02)).abs() < 1e-6);
        // a new entry starts its window over
        s.took(0, 0, 0);
        assert_eq!(s.scores(0, 0)[0], 0.0);
        s.absorb(0, 0, &[0.9, 0.3, 0.1, 0.1], 4, 3);
        assert_eq!(s.scores(0, 0)[0], 0.0, "one observation since the entry arrived");
    }

    #[test]
    fn inertia_folds_a_moving_average_at_refresh_steps() {
        let temporal = Temporal { alpha: 0.5, refresh: Refresh::Every(2) };
        let nan = f32::NAN;
        let mut s = state(DecodeRule::Inertia(temporal), &[[0.4, nan, 0.2, 0.6], [0.0; 4]]);
        assert_eq!(s.reads(1), Reads::LayerMean);
        assert_eq!(s.reads(2), Reads::Nothing);
        assert_eq!(s.reads(3), Reads::LayerMean);
        // three used slots: the fourth is free and keeps its score
        s.absorb(0, 0, &[0.2, 0.8, 0.4, 0.9], 3, 0);
        let got = s.scores(0, 0);
        assert_eq!(&got[..3], &[0.3, 0.8, 0.3]);
        assert_eq!(got[3], 0.6);
        // lowest m, ties to the older position: slots 0 and 2 tie at 0.3, slot 2 is older
        assert_eq!(s.victim(0, 0, &[7, 1, 4, 9], 10), 2);
        // a new entry is not scored yet and cannot be evicted
        s.took(0, 0, 2);
        assert!(s.scores(0, 0)[2].is_nan());
        assert_eq!(s.victim(0, 0, &[7, 1, 4, 9], 10), 0);
    }

    #[test]
    fn ladder_compacts_a_full_layer_only() {
        let ladder = Ladder::default();
        let s = rule_state(&DecodeRule::Ladder(ladder), &cache(16, 15), Vec::new()).unwrap();
        let kv = cache(16, 15);
        assert!(s.compaction(0, 1, kv.layer(0).unwrap()).is_none(), "a free slot left");
        let full = cache(16, 16);
        let (slots, _) = s.compaction(0, 1, full.layer(0).unwrap()).expect("full");
        // an eighth of 16 slots freed, the kept slots ascending, both heads alike
        let plan = ladder.compact(1, 16, 14, ladder.sinks());
        for head in &slots {
            assert_eq!(head, &plan.kept[0]);
            assert!(head.windows(2).all(|w| w[0] < w[1]));
        }
    }

    #[test]
    fn a_failed_write_changes_no_state() {
        let mut cache = cache(4, 4);
        let scores = vec![vec![vec![0.5, 0.1, 0.3, 0.2], vec![0.5, 0.1, 0.3, 0.2]]];
        let mut eviction = DecodeEviction::new(DecodeRule::Accumulated { recent: 1 }, &cache, scores).unwrap();
        let device = Device::flex();
        // keys of the wrong head dimension
        let bad = Tensor::<3>::from_data(TensorData::new(vec![0.0f32; 2 * 5], [2, 1, 5]), &device);
        let mut store = EvictingStore { cache: &mut cache, eviction: &mut eviction };
        assert!(store.append(0, bad.clone(), bad, &[4]).is_err());
        assert_eq!(eviction.evicted, 0);
        assert_eq!(eviction.scores(0, 0), &[0.5, 0.1, 0.3, 0.2]);
        assert_eq!(cache.layer(0).unwrap().head_positions(0), &[0, 1, 2, 3]);
        // a good write takes the lowest-scoring slot outside the recent window (slot 1)
        let good = Tensor::<3>::from_data(TensorData::new(vec![1.0f32; 2 * HEAD_DIM], [2, 1, HEAD_DIM]), &device);
        let mut store = EvictingStore { cache: &mut cache, eviction: &mut eviction };
        store.append(0, good.clone(), good, &[4]).unwrap();
        assert_eq!(eviction.evicted, 2);
        assert_eq!(eviction.scores(0, 0), &[0.5, 0.0, 0.3, 0.2]);
        assert_eq!(cache.layer(0).unwrap().head_positions(1), &[0, 4, 2, 3]);
    }
}
