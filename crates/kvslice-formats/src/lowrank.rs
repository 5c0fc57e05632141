//! Low-rank keys as a file: per layer, groups of KV heads with the basis of their keys'
//! subspace (`kvslice calibrate` writes it, `--low-rank-keys` reads it; the calibration itself
//! is `kvslice_model::lowrank`). No GPU: the file is checked here, before a model sees it.

use crate::error::{FormatError, Result};

/// The `format` metadata of a low-rank keys file.
pub const FORMAT: &str = "kvslice-lowrank";
/// The `version` metadata of a low-rank keys file.
pub const VERSION: &str = "1";
/// Files larger than this are refused before they are parsed.
pub const MAX_FILE_BYTES: usize = 256 << 20;

fn bad(reason: impl Into<String>) -> FormatError {
    FormatError::LowRank(reason.into())
}

/// One group of a layer: its KV heads and the orthonormal basis of its keys' subspace.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyGroup {
    /// Ascending KV head indices.
    pub heads: Vec<usize>,
    pub rank: usize,
    /// `[heads.len() · head_dim, rank]` row-major, orthonormal columns (in the scaled space).
    pub basis: Vec<f32>,
    /// `[heads.len() · head_dim]`, positive: the latent is `(k ∘ scale) U` and the
    /// reconstruction `(c Uᵀ) ∘ scale⁻¹` (all ones for the keys' own error).
    pub scale: Vec<f32>,
}

/// Low-rank keys for a whole model.
#[derive(Clone, Debug, PartialEq)]
pub struct LowRankKeys {
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Per layer, groups that partition its KV heads.
    pub layers: Vec<Vec<KeyGroup>>,
}

impl LowRankKeys {
    /// Latent dimensions of `layer` (what a token's keys take there, against
    /// `kv_heads · head_dim` uncompressed).
    pub fn latent_width(&self, layer: usize) -> usize {
        self.layers.get(layer).map_or(0, |g| g.iter().map(|g| g.rank).sum())
    }

    /// The projection onto `layer`'s key subspaces, `[w, w]` row-major with
    /// `w = kv_heads · head_dim`: block `S U_g U_gᵀ S⁻¹` on each group's columns (`S` its
    /// scales), zero elsewhere. The keys `K P` are every group's reconstruction from its latent.
    pub fn projector(&self, layer: usize) -> Result<Vec<f32>> {
        let groups = self.layers.get(layer).ok_or_else(|| bad(format!("no layer {layer}")))?;
        let (d, w) = (self.head_dim, self.kv_heads * self.head_dim);
        let mut p = vec![0.0f32; w * w];
        for g in groups {
            let cols: Vec<usize> = g.heads.iter().flat_map(|&h| h * d..(h + 1) * d).collect();
            for (a, &ca) in cols.iter().enumerate() {
                for (b, &cb) in cols.iter().enumerate() {
                    let row_a = &g.basis[a * g.rank..(a + 1) * g.rank];
                    let row_b = &g.basis[b * g.rank..(b + 1) * g.rank];
                    let uu: f32 = row_a.iter().zip(row_b).map(|(x, y)| x * y).sum();
                    p[ca * w + cb] = g.scale[a] * uu / g.scale[b];
                }
            }
        }
        Ok(p)
    }

    /// Every group partitions its layer's heads, every basis has its shape, finite values and
    /// orthonormal columns (to 1e-3).
    pub fn validate(&self) -> Result<()> {
        let (h, d) = (self.kv_heads, self.head_dim);
        if h == 0 || d == 0 || h > 4096 || d > 4096 {
            return Err(bad(format!("{h} KV heads of {d} dimensions")));
        }
        for (l, groups) in self.layers.iter().enumerate() {
            let mut seen = vec![false; h];
            for g in groups {
                if g.heads.is_empty() || g.heads.windows(2).any(|w| w[0] >= w[1]) {
                    return Err(bad(format!("layer {l}: a group's heads must be ascending and distinct")));
                }
                for &head in &g.heads {
                    if head >= h || std::mem::replace(&mut seen[head], true) {
                        return Err(bad(format!("layer {l}: head {head} is out of range or in two groups")));
                    }
                }
                let n = g.heads.len() * d;
                if g.rank == 0 || g.rank > n || g.basis.len() != n * g.rank {
                    return Err(bad(format!("layer {l}: a basis of rank {} for {n} key columns", g.rank)));
                }
                if g.basis.iter().any(|x| !x.is_finite()) {
                    return Err(bad(format!("layer {l}: a basis value is not finite")));
                }
                if g.scale.len() != n || g.scale.iter().any(|&x| !(x.is_finite() && x > 0.0 && x.recip().is_finite())) {
                    return Err(bad(format!("layer {l}: the scales must be {n} positive finite numbers")));
                }
                for a in 0..g.rank {
                    for b in a..g.rank {
                        let dot: f64 =
                            (0..n).map(|i| g.basis[i * g.rank + a] as f64 * g.basis[i * g.rank + b] as f64).sum();
                        let want = if a == b { 1.0 } else { 0.0 };
                        if (dot - want).abs() > 1e-3 {
                            return Err(bad(format!("layer {l}: the basis columns are not orthonormal")));
                        }
                    }
                }
            }
            if seen.iter().any(|s| !s) {
                return Err(bad(format!("layer {l}: the groups leave a head out")));
            }
        }
        Ok(())
    }

    /// The safetensors bytes: per layer and group `layer.{l}.group.{g}.basis` (f32
    /// `[|g|·d, rank]`), `.scale` (f32 `[|g|·d]`) and `.heads` (i32), the metadata `format`,
    /// `version`, `layers`, `kv_heads`, `head_dim`.
    pub fn to_safetensors(&self) -> Result<Vec<u8>> {
        self.validate()?;
        let mut owned: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
        for (l, groups) in self.layers.iter().enumerate() {
            for (i, g) in groups.iter().enumerate() {
                let basis = g.basis.iter().flat_map(|x| x.to_le_bytes()).collect();
                owned.push((
                    format!("layer.{l}.group.{i}.basis"),
                    safetensors::Dtype::F32,
                    vec![g.heads.len() * self.head_dim, g.rank],
                    basis,
                ));
                let scale = g.scale.iter().flat_map(|x| x.to_le_bytes()).collect();
                owned.push((format!("layer.{l}.group.{i}.scale"), safetensors::Dtype::F32, vec![g.scale.len()], scale));
                let heads = g.heads.iter().flat_map(|&h| (h as i32).to_le_bytes()).collect();
                owned.push((format!("layer.{l}.group.{i}.heads"), safetensors::Dtype::I32, vec![g.heads.len()], heads));
            }
        }
        let views = owned
            .iter()
            .map(|(name, dtype, shape, data)| {
                safetensors::tensor::TensorView::new(*dtype, shape.clone(), data)
                    .map(|v| (name.clone(), v))
                    .map_err(|e| bad(e.to_string()))
            })
            .collect::<Result<Vec<_>>>()?;
        let meta = [
            ("format", FORMAT.to_string()),
            ("version", VERSION.to_string()),
            ("layers", self.layers.len().to_string()),
            ("kv_heads", self.kv_heads.to_string()),
            ("head_dim", self.head_dim.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        safetensors::serialize(views, Some(meta)).map_err(|e| bad(e.to_string()))
    }

    /// Reads a file written by [`LowRankKeys::to_safetensors`]; anything else is an error.
    pub fn from_safetensors(bytes: &[u8]) -> Result<Self> {
        if bytes.len() > MAX_FILE_BYTES {
            return Err(bad(format!("{} bytes: larger than any low-rank keys file ({MAX_FILE_BYTES})", bytes.len())));
        }
        let (_, header) =
            safetensors::SafeTensors::read_metadata(bytes).map_err(|e| bad(format!("not safetensors: {e}")))?;
        let meta = header.metadata().clone().unwrap_or_default();
        if meta.get("format").map(String::as_str) != Some(FORMAT)
            || meta.get("version").map(String::as_str) != Some(VERSION)
        {
            return Err(bad(format!("not low-rank keys (format {FORMAT} version {VERSION} expected)")));
        }
        let number = |key: &str, max: usize| -> Result<usize> {
            meta.get(key)
                .and_then(|v| v.parse().ok())
                .filter(|&v: &usize| v > 0 && v <= max)
                .ok_or_else(|| bad(format!("the metadata's {key} is missing or not a number in 1..={max}")))
        };
        let (layers, kv_heads, head_dim) =
            (number("layers", 4096)?, number("kv_heads", 4096)?, number("head_dim", 4096)?);
        let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| bad(format!("not safetensors: {e}")))?;
        let mut out = Vec::with_capacity(layers);
        for l in 0..layers {
            let mut groups = Vec::new();
            for i in 0..kv_heads {
                let Ok(heads) = st.tensor(&format!("layer.{l}.group.{i}.heads")) else { break };
                if heads.dtype() != safetensors::Dtype::I32 || heads.shape().len() != 1 {
                    return Err(bad(format!("layer {l} group {i}: the heads must be an i32 vector")));
                }
                let heads: Vec<usize> = heads
                    .data()
                    .chunks_exact(4)
                    .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .map(|h| usize::try_from(h).map_err(|_| bad(format!("layer {l} group {i}: head {h}"))))
                    .collect::<Result<_>>()?;
                let basis = st
                    .tensor(&format!("layer.{l}.group.{i}.basis"))
                    .map_err(|_| bad(format!("layer {l} group {i}: the basis is missing")))?;
                let shape = basis.shape();
                if basis.dtype() != safetensors::Dtype::F32 || shape.len() != 2 || shape[0] != heads.len() * head_dim {
                    return Err(bad(format!(
                        "layer {l} group {i}: the basis must be f32 [{} · {head_dim}, rank], is {:?} {:?}",
                        heads.len(),
                        basis.dtype(),
                        shape
                    )));
                }
                let rank = shape[1];
                let floats = |t: &safetensors::tensor::TensorView<'_>| -> Vec<f32> {
                    t.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
                };
                let scale = st
                    .tensor(&format!("layer.{l}.group.{i}.scale"))
                    .map_err(|_| bad(format!("layer {l} group {i}: the scales are missing")))?;
                if scale.dtype() != safetensors::Dtype::F32 || scale.shape() != [heads.len() * head_dim] {
                    return Err(bad(format!(
                        "layer {l} group {i}: the scales must be f32 [{}]",
                        heads.len() * head_dim
                    )));
                }
                groups.push(KeyGroup { heads, rank, basis: floats(&basis), scale: floats(&scale) });
            }
            out.push(groups);
        }
        let keys = LowRankKeys { kv_heads, head_dim, layers: out };
        keys.validate()?;
        Ok(keys)
    }

    /// Reads a file (at most [`MAX_FILE_BYTES`]).
    pub fn read(path: &std::path::Path) -> Result<Self> {
        use std::io::Read;
        let file = std::fs::File::open(path).map_err(|e| bad(format!("{}: {e}", path.display())))?;
        let mut bytes = Vec::new();
        file.take(MAX_FILE_BYTES as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| bad(format!("{}: {e}", path.display())))?;
        Self::from_safetensors(&bytes).map_err(|e| match e {
            FormatError::LowRank(reason) => bad(format!("{}: {reason}", path.display())),
            other => other,
        })
    }
}
