// In-place compaction of a per-head KV cache: slot t < count_h of head h receives the entry
// that sat in slot kept[h, t]; K rows, V rows and source positions move together.
//
// Rust wrapper, invariants and the race-freedom argument: crates/kvslice-kernels/src/compact.rs.
// One workgroup per KV head walks the destinations in chunks of `rows_per_chunk` slots: it reads
// every source row of the chunk into registers (a bounded scratch), synchronises, then writes
// them. Because kept positions are strictly ascending, kept[t] ≥ t, so a chunk only reads slots
// at or after its own first destination and later chunks never read what earlier chunks wrote.
//
// Data is moved as raw 32-bit words, so the move is exact for any element bit pattern.
//
// Template values: {{ wg }} workgroup size, {{ per_thread }} words of K (and of V) each
// invocation holds per chunk, entry point name.

// Every buffer is declared read_write, inputs included: Burn's memory pool sub-allocates small
// tensors from shared wgpu buffers, and wgpu refuses one buffer bound read-only and read-write
// in the same dispatch.

struct Params {
    kv_heads: u32,
    // slots per KV head
    cap: u32,
    head_dim: u32,
    // row stride of kept
    kept_stride: u32,
    rows_per_chunk: u32,
    // per head h: count_h, the slots it keeps
    counts: array<u32>,
}

@group(0) @binding(0) var<storage, read_write> prm: Params;
// [kv_heads, capacity, head_dim]
@group(0) @binding(1) var<storage, read_write> kc: array<u32>;
// [kv_heads, capacity, head_dim]
@group(0) @binding(2) var<storage, read_write> vc: array<u32>;
// [kv_heads, capacity] source positions
@group(0) @binding(3) var<storage, read_write> pc: array<u32>;
// [kv_heads, kept stride] kept slots, strictly ascending in 0..capacity
@group(0) @binding(4) var<storage, read_write> kept: array<u32>;

const WG: u32 = {{ wg }}u;
const PER: u32 = {{ per_thread }}u;

// Chunking read through workgroup memory so that WebGPU's uniformity analysis (Tint) sees the
// bounds of the barrier-holding loop as uniform: (rows per chunk, count of this head).
var<workgroup> chunking_shared: vec2<u32>;

@compute @workgroup_size(WG)
fn {{ entry_compact }}(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    _ = touch_bindings();
    let h = wid.x;
    let cap = prm.cap;
    let d = prm.head_dim;
    let kstride = prm.kept_stride;
    if lid == 0u {
        chunking_shared = vec2<u32>(prm.rows_per_chunk, prm.counts[h]);
    }
    let chunking = workgroupUniformLoad(&chunking_shared);
    let rows = chunking.x;
    let count = chunking.y;
    let head_row = h * cap;

    var kbuf: array<u32, PER>;
    var vbuf: array<u32, PER>;
    var pbuf = 0u;

    for (var t0 = 0u; t0 < count; t0 += rows) {
        // read phase: sources of destinations t0 .. t0 + rows
        for (var r = 0u; r < PER; r++) {
            let e = lid + r * WG;
            let t = t0 + e / d;
            if e < rows * d && t < count {
                let src = kept[h * kstride + t];
                if src < cap {
                    let at = (head_row + src) * d + e % d;
                    kbuf[r] = kc[at];
                    vbuf[r] = vc[at];
                }
            }
        }
        if lid < rows && t0 + lid < count {
            let src = kept[h * kstride + t0 + lid];
            if src < cap {
                pbuf = pc[head_row + src];
            }
        }
        storageBarrier();
        // write phase
        for (var r = 0u; r < PER; r++) {
            let e = lid + r * WG;
            let t = t0 + e / d;
            if e < rows * d && t < count {
                let src = kept[h * kstride + t];
                if src < cap && src != t {
                    let at = (head_row + t) * d + e % d;
                    kc[at] = kbuf[r];
                    vc[at] = vbuf[r];
                }
            }
        }
        if lid < rows && t0 + lid < count {
            let src = kept[h * kstride + t0 + lid];
            if src < cap && src != t0 + lid {
                pc[head_row + t0 + lid] = pbuf;
            }
        }
        storageBarrier();
    }
}
