// Ragged append: head h receives `t` new rows at slots start_h .. start_h + t (its current
// length), K and V rows and their source positions.
//
// Rust wrapper: crates/kvslice-kernels/src/compact.rs (`append_rows`). Data is moved as raw
// 32-bit words.
//
// Template values: {{ wg }} workgroup size, entry point name.

// Every buffer is declared read_write, inputs included: Burn's memory pool sub-allocates small
// tensors from shared wgpu buffers, and wgpu refuses one buffer bound read-only and read-write
// in the same dispatch.

// [0] kv_heads, [1] capacity, [2] head_dim, [3] rows per head t, [4..8] unused,
// then per head h: [8 + h] start_h.
@group(0) @binding(0) var<storage, read_write> prm: array<u32>;
// [kv_heads, capacity, head_dim]
@group(0) @binding(1) var<storage, read_write> kc: array<u32>;
// [kv_heads, capacity, head_dim]
@group(0) @binding(2) var<storage, read_write> vc: array<u32>;
// [kv_heads, capacity]
@group(0) @binding(3) var<storage, read_write> pc: array<u32>;
// [kv_heads, t, head_dim]
@group(0) @binding(4) var<storage, read_write> new_k: array<u32>;
// [kv_heads, t, head_dim]
@group(0) @binding(5) var<storage, read_write> new_v: array<u32>;
// [kv_heads, t]
@group(0) @binding(6) var<storage, read_write> new_pos: array<u32>;

const WG: u32 = {{ wg }}u;

@compute @workgroup_size(WG)
fn {{ entry_append }}(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let h = wid.y;
    let cap = prm[1];
    let d = prm[2];
    let t = prm[3];
    let start = prm[8u + h];
    let e = wid.x * WG + lid;
    if e >= t * d {
        return;
    }
    let row = e / d;
    let c = e % d;
    let dst = (h * cap + start + row) * d + c;
    let src = (h * t + row) * d + c;
    kc[dst] = new_k[src];
    vc[dst] = new_v[src];
    if c == 0u {
        pc[h * cap + start + row] = new_pos[h * t + row];
    }
}
