//! Loading of the stored peer tensors and per-layer inputs computed from them by the crate's
//! f64 reference.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;

use kvslice_policy::reference::{self, Dims};
use kvslice_policy::{KvView, QueryMoments, Rope, WindowStats};

pub fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join("data")
}

/// IEEE half to single precision (exact).
fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, m) => {
            // subnormal: normalise
            let mut e: i32 = -14;
            let mut m = m;
            while m & 0x400 == 0 {
                m <<= 1;
                e -= 1;
            }
            sign | (((e + 127) as u32) << 23) | ((m & 0x3ff) << 13)
        }
        (31, 0) => sign | 0x7f80_0000,
        (31, m) => sign | 0x7fc0_0000 | (m << 13),
        (e, m) => sign | ((e + 112) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

pub struct Peers {
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub len: usize,
    pub head_dim: usize,
    pub hidden: usize,
    pub rope: Rope,
    pub q_pre: Vec<Vec<f32>>,
    pub q_rot: Vec<Vec<f32>>,
    pub keys: Vec<Vec<f32>>,
    pub values: Vec<Vec<f32>>,
    pub w_o: Vec<Vec<f32>>,
    /// Per layer, `[H_kv, d, 48]` standard normal draws (LeverageScorePress's sketch before its
    /// `1/√k` scaling).
    pub leverage_sketch: Vec<Vec<f32>>,
    pub cases: Vec<serde_json::Value>,
    stats: HashMap<(usize, usize), WindowStats>,
}

impl Peers {
    pub fn load() -> Peers {
        let dir = data_dir();
        let bytes = std::fs::read(dir.join("peers.safetensors")).expect("peers.safetensors");
        let st = safetensors::SafeTensors::deserialize(&bytes).expect("valid safetensors");
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("peers.json")).expect("peers.json")).expect("json");
        let meta = &json["meta"];
        let u = |k: &str| meta[k].as_u64().expect("meta field") as usize;
        let (layers, heads, kv_heads, len, head_dim, hidden) =
            (u("layers"), u("heads"), u("kv_heads"), u("len"), u("head_dim"), u("hidden"));
        let tensor = |name: &str, per_layer: usize| -> Vec<Vec<f32>> {
            let t = st.tensor(name).expect("tensor present");
            assert_eq!(t.dtype(), safetensors::Dtype::F16);
            let all: Vec<f32> =
                t.data().chunks_exact(2).map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]]))).collect();
            assert_eq!(all.len(), per_layer * layers, "{name} size");
            all.chunks(per_layer).map(<[f32]>::to_vec).collect()
        };
        let q_pre = tensor("q_pre", heads * len * head_dim);
        let keys = tensor("keys", kv_heads * len * head_dim);
        let values = tensor("values", kv_heads * len * head_dim);
        let w_o = tensor("w_o", hidden * heads * head_dim);
        // kvpress's LeverageScorePress sketches, N(0, 1) draws [L, H_kv, d, 48], stored as f32
        let t = st.tensor("leverage_sketch").expect("leverage_sketch present");
        assert_eq!(t.dtype(), safetensors::Dtype::F32);
        let all: Vec<f32> = t.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        let leverage_sketch = all.chunks(all.len() / layers).map(<[f32]>::to_vec).collect();
        let rope = Rope::llama(meta["rope_theta"].as_f64().unwrap(), head_dim).unwrap();
        let q_rot = q_pre.iter().map(|q| reference::apply_rope(q, heads, len, &rope)).collect();
        Peers {
            layers,
            heads,
            kv_heads,
            len,
            head_dim,
            hidden,
            rope,
            q_pre,
            q_rot,
            keys,
            values,
            w_o,
            leverage_sketch,
            cases: json["cases"].as_array().unwrap().clone(),
            stats: HashMap::new(),
        }
    }

    pub fn dims(&self) -> Dims {
        Dims { heads: self.heads, kv_heads: self.kv_heads, len: self.len, head_dim: self.head_dim }
    }

    /// Window statistics of `layer` over the last `window` queries (cached).
    pub fn stats(&mut self, layer: usize, window: usize) -> WindowStats {
        let dims = self.dims();
        let (q, k, v) = (&self.q_rot[layer], &self.keys[layer], &self.values[layer]);
        self.stats
            .entry((layer, window))
            .or_insert_with(|| reference::window_stats(dims, q, k, v, window).unwrap())
            .clone()
    }

    /// The cached keys and values of `layer`.
    pub fn kv(&self, layer: usize) -> KvView<'_> {
        KvView {
            kv_heads: self.kv_heads,
            len: self.len,
            head_dim: self.head_dim,
            keys: Some(&self.keys[layer]),
            values: Some(&self.values[layer]),
        }
    }

    pub fn moments(&self, layer: usize, skip: usize) -> QueryMoments {
        QueryMoments::from_queries(&self.q_pre[layer], self.heads, self.len, self.head_dim, skip).unwrap()
    }

    pub fn value_proj_l1(&self, layer: usize) -> Vec<f32> {
        reference::value_proj_l1(self.dims(), &self.values[layer], &self.w_o[layer], self.hidden).unwrap()
    }
}

/// `1 − |A∩B| / |A∪B|` of two sorted position lists.
pub fn jaccard_distance(a: &[u32], b: &[u32]) -> f64 {
    let sa: std::collections::BTreeSet<u32> = a.iter().copied().collect();
    let sb: std::collections::BTreeSet<u32> = b.iter().copied().collect();
    let inter = sa.intersection(&sb).count();
    let union = sa.union(&sb).count();
    if union == 0 { 0.0 } else { 1.0 - inter as f64 / union as f64 }
}
