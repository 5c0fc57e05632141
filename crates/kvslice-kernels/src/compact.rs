//! Kernel 4: in-place compaction of a per-head KV cache (`shaders/compact.wgsl`), and the
//! ragged append that refills the freed slots (`shaders/append.wgsl`).
//!
//! # The move
//! For every KV head `h` with kept slots `kept[h, 0] < kept[h, 1] < … < kept[h, c_h − 1]`,
//! slot `t < c_h` receives the K row, V row and source position of slot `kept[h, t]`; slots
//! `c_h..` keep stale data and count as free (the new length is `c_h`). The tensors are the
//! same buffers before and after: nothing is allocated but a parameter block.
//!
//! # Why the in-place move is race-free
//! Heads touch disjoint rows, so only one head needs an argument; one workgroup moves it. Because
//! the kept slots are strictly ascending, `kept[t] ≥ t` for every `t`. The workgroup walks the
//! destinations in chunks `[t0, t0 + R)` in increasing order. In a chunk it first *reads* the
//! `R` source rows into registers (the bounded scratch: `R · head_dim` words of K and of V, at
//! most 4 words of each per invocation), then passes a storage barrier, then *writes* them.
//! - Within a chunk, a source may be one of the chunk's own destinations (for `kept = [1, 5]`,
//!   slot 1 is read for `t = 0` and written for `t = 1`); every read precedes the barrier and
//!   every write follows it, so no read sees a write of its own chunk.
//! - Across chunks, chunk `c` only writes slots `< t0 + R`, and every later chunk reads slots
//!   `kept[t] ≥ t ≥ t0 + R`: nothing a later chunk reads was overwritten. Earlier chunks have
//!   finished their reads before chunk `c` starts (barrier at the end of each chunk).
//!
//! Slots with `kept[t] = t` (the untouched prefix) are not rewritten.
//!
//! The kernel trusts the kept table it is given on the device; [`compact_in_place_host`]
//! validates the host lists before uploading them.

use burn::tensor::{Int, Tensor};

use crate::error::{KernelError, Result};
use crate::gpu::{self, Gpu, bind, div_ceil};
use crate::params::{AppendParams, CompactParams};
use crate::shader::{APPEND_WG, COMPACT_PER_THREAD, COMPACT_WG, Family};

/// The tensors of one layer's cache, updated in place.
///
/// # Shapes
/// - `keys`, `values`: `[kv_heads, capacity, head_dim]` f32, contiguous
/// - `positions`: `[kv_heads, capacity]` i32 or u32, contiguous (source position of each slot)
#[derive(Debug)]
pub struct CacheTensors<'a> {
    /// K rows (after RoPE).
    pub keys: &'a mut Tensor<3>,
    /// V rows.
    pub values: &'a mut Tensor<3>,
    /// Source positions.
    pub positions: &'a mut Tensor<2, Int>,
}

struct Checked {
    kv_heads: usize,
    cap: usize,
    d: usize,
    k: burn::backend::wgpu::CubeTensor,
    v: burn::backend::wgpu::CubeTensor,
    p: burn::backend::wgpu::CubeTensor,
}

fn check_cache(cache: &CacheTensors<'_>, lens: &[u32]) -> Result<Checked> {
    let [kv_heads, cap, d] = cache.keys.dims();
    gpu::expect_shape("values", &cache.values.dims(), &[kv_heads, cap, d])?;
    gpu::expect_shape("positions", &cache.positions.dims(), &[kv_heads, cap])?;
    if kv_heads == 0 {
        return Err(KernelError::Empty { what: "kv_heads" });
    }
    gpu::check_head_dim(d)?;
    gpu::check_elements("keys", &[kv_heads, cap, d])?;
    gpu::check_groups("kv_heads", kv_heads)?;
    if lens.len() != kv_heads {
        return Err(KernelError::PerHead { what: "lengths", expected: kv_heads, got: lens.len() });
    }
    for (h, &len) in lens.iter().enumerate() {
        if len as usize > cap {
            return Err(KernelError::LengthPastCapacity { head: h, len: len as usize, capacity: cap });
        }
    }
    let k = gpu::float_in_place("keys", cache.keys)?;
    let v = gpu::float_in_place("values", cache.values)?;
    let p = gpu::int_in_place("positions", cache.positions)?;
    gpu::same_device(("keys", &k), ("values", &v))?;
    gpu::same_device(("keys", &k), ("positions", &p))?;
    Ok(Checked { kv_heads, cap, d, k, v, p })
}

/// Moves the kept entries of each head to its first slots, in order, in place: `kept[h]` is
/// head `h`'s list of kept slots, validated (strictly ascending, below `lens[h]`) before upload.
///
/// # Shapes
/// - `cache`: see [`CacheTensors`]
/// - `kept`, `lens`: one entry per KV head, `lens[h] ≤ capacity`
///
/// Returns the new lengths (the lists' lengths).
pub fn compact_in_place_host(cache: CacheTensors<'_>, kept: &[Vec<u32>], lens: &[u32]) -> Result<Vec<u32>> {
    let c = check_cache(&cache, lens)?;
    if kept.len() != c.kv_heads {
        return Err(KernelError::PerHead { what: "kept lists", expected: c.kv_heads, got: kept.len() });
    }
    for (h, list) in kept.iter().enumerate() {
        let len = lens[h] as usize;
        for (index, &position) in list.iter().enumerate() {
            let ascending = index == 0 || list[index - 1] < position;
            if !ascending || position as usize >= len {
                return Err(KernelError::KeptOrder { head: h, index, position, len });
            }
        }
    }
    let width = kept.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let mut table = vec![u32::MAX; c.kv_heads * width];
    for (h, list) in kept.iter().enumerate() {
        table[h * width..h * width + list.len()].copy_from_slice(list);
    }
    let counts: Vec<u32> = kept.iter().map(|l| l.len() as u32).collect();
    let kept = Gpu::new(&c.k).upload_u32(&table, &[c.kv_heads, width]);
    launch_compact(&c, &kept, width, &counts);
    Ok(counts)
}

fn launch_compact(c: &Checked, kept: &burn::backend::wgpu::CubeTensor, width: usize, counts: &[u32]) {
    let g = Gpu::new(&c.k);
    // at most one row per invocation, so every row of a chunk has an invocation for its position
    let rows_per_chunk = ((COMPACT_WG * COMPACT_PER_THREAD) as usize / c.d).min(COMPACT_WG as usize);
    let params = CompactParams {
        kv_heads: c.kv_heads as u32,
        cap: c.cap as u32,
        head_dim: c.d as u32,
        kept_stride: width as u32,
        rows_per_chunk: rows_per_chunk as u32,
    };
    g.launch(
        Family::Compact,
        "compact",
        (c.kv_heads as u32, 1, 1),
        vec![g.params(&params, counts), bind(&c.k), bind(&c.v), bind(&c.p), bind(kept)],
    );
}

/// Appends `t` rows to every head at its current length (slots `lens[h] .. lens[h] + t`),
/// in place.
///
/// # Shapes
/// - `cache`: see [`CacheTensors`]
/// - `new_keys`, `new_values`: `[kv_heads, t, head_dim]` f32
/// - `new_positions`: `[kv_heads, t]` i32/u32
/// - `lens`: one entry per KV head, `lens[h] + t ≤ capacity`
///
/// Returns the new lengths.
pub fn append_rows(
    cache: CacheTensors<'_>,
    new_keys: &Tensor<3>,
    new_values: &Tensor<3>,
    new_positions: &Tensor<2, Int>,
    lens: &[u32],
) -> Result<Vec<u32>> {
    let c = check_cache(&cache, lens)?;
    let [_, t, _] = new_keys.dims();
    gpu::expect_shape("new_keys", &new_keys.dims(), &[c.kv_heads, t, c.d])?;
    gpu::expect_shape("new_values", &new_values.dims(), &[c.kv_heads, t, c.d])?;
    gpu::expect_shape("new_positions", &new_positions.dims(), &[c.kv_heads, t])?;
    let mut new_lens = Vec::with_capacity(c.kv_heads);
    for (h, &len) in lens.iter().enumerate() {
        let after = len as usize + t;
        if after > c.cap {
            return Err(KernelError::LengthPastCapacity { head: h, len: after, capacity: c.cap });
        }
        new_lens.push(after as u32);
    }
    gpu::check_groups("append workgroups", div_ceil(t * c.d, APPEND_WG) as usize)?;
    let nk = gpu::float_input("new_keys", new_keys)?;
    let nv = gpu::float_input("new_values", new_values)?;
    let np = gpu::int_input("new_positions", new_positions)?;
    for (name, x) in [("new_keys", &nk), ("new_values", &nv), ("new_positions", &np)] {
        gpu::same_device(("keys", &c.k), (name, x))?;
    }
    let (nk, nv, np) = (gpu::ready(nk), gpu::ready(nv), gpu::ready(np));
    let g = Gpu::new(&c.k);
    let params =
        AppendParams { kv_heads: c.kv_heads as u32, cap: c.cap as u32, head_dim: c.d as u32, t: t as u32, flags: 1 };
    g.launch(
        Family::Append,
        "append",
        (div_ceil(t * c.d, APPEND_WG), c.kv_heads as u32, 1),
        vec![g.params(&params, lens), bind(&c.k), bind(&c.v), bind(&c.p), bind(&nk), bind(&nv), bind(&np)],
    );
    Ok(new_lens)
}

/// Writes `t` rows into every KV head `h` at slots `starts[h] .. starts[h] + t`, in one
/// dispatch: an append (`starts` = the lengths) or a decode-time slot write (`t = 1`, `starts` =
/// the slots an eviction rule chose). Source positions are not touched (the caller keeps them).
///
/// The cache tensors are written in place when they own their buffers; a buffer shared with
/// another tensor (a clone of the cache) is copied first, so the clone keeps its contents.
///
/// # Shapes
/// - `keys`, `values`: `[kv_heads, capacity, head_dim]` f32 (any `head_dim`)
/// - `new_keys`, `new_values`: `[kv_heads, t, head_dim]` f32
/// - `starts`: one entry per KV head, `starts[h] + t ≤ capacity`
///
/// On error nothing was dispatched and the tensors are unchanged.
pub fn write_rows(
    keys: &mut Tensor<3>,
    values: &mut Tensor<3>,
    new_keys: &Tensor<3>,
    new_values: &Tensor<3>,
    starts: &[u32],
) -> Result<()> {
    let [kv_heads, cap, d] = keys.dims();
    gpu::expect_shape("values", &values.dims(), &[kv_heads, cap, d])?;
    let [_, t, _] = new_keys.dims();
    gpu::expect_shape("new_keys", &new_keys.dims(), &[kv_heads, t, d])?;
    gpu::expect_shape("new_values", &new_values.dims(), &[kv_heads, t, d])?;
    if kv_heads == 0 {
        return Err(KernelError::Empty { what: "kv_heads" });
    }
    if d == 0 {
        return Err(KernelError::HeadDim { head_dim: d, max: usize::MAX });
    }
    gpu::check_elements("keys", &[kv_heads, cap, d])?;
    gpu::check_groups("kv_heads", kv_heads)?;
    if starts.len() != kv_heads {
        return Err(KernelError::PerHead { what: "starts", expected: kv_heads, got: starts.len() });
    }
    for (h, &start) in starts.iter().enumerate() {
        let after = start as usize + t;
        if after > cap {
            return Err(KernelError::LengthPastCapacity { head: h, len: after, capacity: cap });
        }
    }
    gpu::check_groups("append workgroups", div_ceil(t * d, APPEND_WG) as usize)?;
    let k = gpu::float_input("keys", keys)?;
    let v = gpu::float_input("values", values)?;
    let nk = gpu::float_input("new_keys", new_keys)?;
    let nv = gpu::float_input("new_values", new_values)?;
    for (name, x) in [("values", &v), ("new_keys", &nk), ("new_values", &nv)] {
        gpu::same_device(("keys", &k), (name, x))?;
    }
    drop((k, v));
    if t == 0 {
        return Ok(());
    }
    let (nk, nv) = (gpu::ready(nk), gpu::ready(nv));
    let k = gpu::take_writable(keys, new_keys.clone())?;
    let v = gpu::take_writable(values, new_values.clone())?;
    let g = Gpu::new(&k);
    let params = AppendParams { kv_heads: kv_heads as u32, cap: cap as u32, head_dim: d as u32, t: t as u32, flags: 0 };
    g.launch(
        Family::Append,
        "append",
        (div_ceil(t * d, APPEND_WG), kv_heads as u32, 1),
        vec![g.params(&params, starts), bind(&k), bind(&v), g.dummy(), bind(&nk), bind(&nv), g.dummy()],
    );
    *keys = gpu::float_tensor(k);
    *values = gpu::float_tensor(v);
    Ok(())
}
