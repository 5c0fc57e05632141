//! Eviction over latent keys: the heads of a latent group share their slots (one latent row
//! serves them all), so what a policy keeps or evicts per head becomes one choice per group.
//!
//! The plans pool each group's scores before selecting ([`kvslice_policy::Policy::plan_grouped`]),
//! so a policy whose heads keep the same number of entries gives one set per group already.
//! Where the heads' choices still differ (budgets per head, repairs per head, rules without
//! scores), a group keeps as many entries as its heads kept on average. The entries come first by how
//! many of the group's heads kept them, then by the heads' scores summed, then the newest:
//! what every head kept (the sinks, the window) stays, and an entry one head wanted strongly
//! beats one several heads only tolerated at equal votes. A decode step writes, in every head
//! of a group, the slot the group's heads score lowest together among their own victims.

use std::collections::HashMap;

use kvslice_cache::LatentLayout;

/// Makes every latent group's heads keep one set: `kept[h]` (ascending, positions or slots)
/// for each head of one layer, rewritten in place; `score(h, x)` the head's score of entry
/// `x` (0 where none is known).
pub(crate) fn align_kept(kept: &mut [Vec<u32>], layout: &LatentLayout, score: impl Fn(usize, u32) -> f32) {
    for g in layout.groups() {
        let heads = g.heads();
        if heads.iter().all(|&h| kept[h] == kept[heads[0]]) {
            continue;
        }
        let total: usize = heads.iter().map(|&h| kept[h].len()).sum();
        let m = (total as f64 / heads.len() as f64).round() as usize;
        let mut votes: HashMap<u32, (usize, f32)> = HashMap::new();
        for &h in heads {
            for &x in &kept[h] {
                let e = votes.entry(x).or_insert((0, 0.0));
                e.0 += 1;
            }
        }
        for (x, e) in votes.iter_mut() {
            e.1 = heads.iter().map(|&h| score(h, *x)).filter(|s| s.is_finite()).sum();
        }
        let mut ranked: Vec<(u32, usize, f32)> = votes.into_iter().map(|(x, (v, s))| (x, v, s)).collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then(b.2.total_cmp(&a.2)).then(b.0.cmp(&a.0)));
        let mut chosen: Vec<u32> = ranked.into_iter().take(m).map(|(x, _, _)| x).collect();
        chosen.sort_unstable();
        for &h in heads {
            kept[h] = chosen.clone();
        }
    }
}

/// Makes every latent group's heads write one slot: `slots[h]` each head's own choice,
/// rewritten in place to the candidate whose scores summed over the group's heads are lowest
/// (`score(h, slot)`; the first head's candidate where no head has scores).
pub(crate) fn align_victims(slots: &mut [usize], layout: &LatentLayout, score: impl Fn(usize, usize) -> Option<f32>) {
    for g in layout.groups() {
        let heads = g.heads();
        if heads.iter().all(|&h| slots[h] == slots[heads[0]]) {
            continue;
        }
        let pooled = |s: usize| -> Option<f32> {
            let each: Vec<f32> = heads.iter().filter_map(|&h| score(h, s)).collect();
            (!each.is_empty()).then(|| each.iter().sum())
        };
        let mut best = slots[heads[0]];
        let mut best_score = pooled(best);
        for &h in &heads[1..] {
            let s = slots[h];
            if let (Some(now), Some(b)) = (pooled(s), best_score)
                && now < b
            {
                best = s;
                best_score = Some(now);
            }
        }
        for &h in heads {
            slots[h] = best;
        }
    }
}

#[cfg(test)]
mod tests {
    //! Hand-worked choices on a layer of three KV heads, two of them in one group.
    use std::sync::Arc;

    use burn::tensor::Device;
    use kvslice_cache::{GroupBasis, LatentLayout, RopeTable};

    use super::*;

    /// Heads {0, 2} share a basis of rank 2; head 1 is alone (d = 2).
    fn layout() -> LatentLayout {
        let device = Device::flex();
        let table = Arc::new(RopeTable::new(vec![1.0; 8], vec![0.0; 8], 1, &device).unwrap());
        let pair = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0];
        let one = [1.0, 0.0, 0.0, 1.0];
        let groups = [
            GroupBasis { heads: &[0, 2], rank: 2, basis: &pair, scale: &[1.0; 4] },
            GroupBasis { heads: &[1], rank: 2, basis: &one, scale: &[1.0; 2] },
        ];
        LatentLayout::new(3, 2, &groups, table, &device).unwrap()
    }

    #[test]
    fn a_group_keeps_the_most_voted_then_the_best_scored() {
        // head 0 keeps {0, 1, 5}, head 2 keeps {0, 3, 4, 6, 7} (8 in all: 4 each); head 1 alone.
        let mut kept = vec![vec![0, 1, 5], vec![2, 9], vec![0, 3, 4, 6, 7]];
        // scores: position x scores x in head 0 and 10 − x in head 2, but 4 scores 100 in head 2
        let score = |h: usize, x: u32| match (h, x) {
            (2, 4) => 100.0,
            (0, x) => x as f32,
            (2, x) => 10.0 - x as f32,
            _ => 0.0,
        };
        align_kept(&mut kept, &layout(), score);
        // 0 has two votes; then by summed score: 4 → 104, 1 → 10, 3 → 10, 5 → 10, 6 → 10, 7 → 10:
        // 4, then the newest two of the tied, 7 and 6
        assert_eq!(kept[0], vec![0, 4, 6, 7]);
        assert_eq!(kept[2], kept[0]);
        assert_eq!(kept[1], vec![2, 9]);
    }

    #[test]
    fn a_group_writes_the_victim_its_heads_score_lowest() {
        let mut slots = vec![3, 5, 1];
        // summed over heads 0 and 2: slot 3 → 2 + 4 = 6, slot 1 → 7 + 0.5 = 7.5
        let score = |h: usize, s: usize| Some([[9.0, 7.0, 0.0, 2.0], [0.0; 4], [0.0, 0.5, 0.0, 4.0]][h][s]);
        align_victims(&mut slots, &layout(), score);
        assert_eq!(slots, vec![3, 5, 3]);
        let mut slots = vec![2, 5, 1];
        align_victims(&mut slots, &layout(), |_, _| None);
        assert_eq!(slots, vec![2, 5, 2]);
    }
}
