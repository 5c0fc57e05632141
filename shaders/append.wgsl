// Ragged row writes: head h receives `t` new rows at slots start_h .. start_h + t (for an
// append, its current length; for a decode-time slot write, t = 1 and the slot the eviction
// rule chose), K and V rows and, on request, their source positions.
//
// Rust wrappers: crates/kvslice-kernels/src/compact.rs (`append_rows`, `write_rows`). Data is
// moved as raw 32-bit words.
//
// Template values: {{ wg }} workgroup size, entry point name.

struct Params {
    kv_heads: u32,
    // slots per KV head
    cap: u32,
    head_dim: u32,
    // rows per head
    t: u32,
    // bit 0: write source positions (pc, new_pos); otherwise those bindings are placeholders
    flags: u32,
    // per KV head h: first slot written
    start: array<u32>,
}

// Every buffer is declared read_write, inputs included: Burn's memory pool sub-allocates small
// tensors from shared wgpu buffers, and wgpu refuses one buffer bound read-only and read-write
// in the same dispatch.

@group(0) @binding(0) var<storage, read_write> prm: Params;
// [kv_heads, capacity, head_dim]
@group(0) @binding(1) var<storage, read_write> kc: array<u32>;
// [kv_heads, capacity, head_dim]
@group(0) @binding(2) var<storage, read_write> vc: array<u32>;
// [kv_heads, capacity] (positions only)
@group(0) @binding(3) var<storage, read_write> pc: array<u32>;
// [kv_heads, t, head_dim]
@group(0) @binding(4) var<storage, read_write> new_k: array<u32>;
// [kv_heads, t, head_dim]
@group(0) @binding(5) var<storage, read_write> new_v: array<u32>;
// [kv_heads, t] (positions only)
@group(0) @binding(6) var<storage, read_write> new_pos: array<u32>;

const WG: u32 = {{ wg }}u;

@compute @workgroup_size(WG)
fn {{ entry_append }}(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    _ = touch_bindings();
    let h = wid.y;
    let cap = prm.cap;
    let d = prm.head_dim;
    let t = prm.t;
    let start = prm.start[h];
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
    if c == 0u && (prm.flags & 1u) != 0u {
        pc[h * cap + start + row] = new_pos[h * t + row];
    }
}
