// Shared by every kernel: the shader template prepends this file (with `touch_bindings`
// generated from the kernel's own storage bindings) to each module.
//
// Template values: {{ tile }} score-tile length (the workgroup size of the entry points that run
// an online softmax), {{ touch }} the sum of arrayLength over the kernel's array bindings.

// Keeps every binding in the automatic pipeline layout of each entry point: the entry points of
// a family share one binding set, and an entry point that does not read a binding would drop it.
fn touch_bindings() -> u32 {
    return {{ touch }};
}

const TILE: u32 = {{ tile }}u;

// One tile of scores and of their exponentials, one entry per invocation.
var<workgroup> s_tile: array<f32, TILE>;
var<workgroup> p_tile: array<f32, TILE>;

// Largest of the first `cnt` scores of the tile (cnt ≥ 1).
fn tile_max(cnt: u32) -> f32 {
    var x = s_tile[0];
    for (var t = 1u; t < cnt; t++) {
        x = max(x, s_tile[t]);
    }
    return x;
}

// Sum of the first `cnt` exponentials of the tile.
fn tile_sum(cnt: u32) -> f32 {
    var x = 0.0;
    for (var t = 0u; t < cnt; t++) {
        x += p_tile[t];
    }
    return x;
}

// One step of an online softmax: the running max `m` (meaningless before the first tile) meets a
// tile whose max is `tmax`. Returns the new running max and the factor that rescales the terms
// accumulated so far (0 for the first tile, when there are none).
fn online_max(m: f32, tmax: f32, first: bool) -> vec2<f32> {
    if first {
        return vec2<f32>(tmax, 0.0);
    }
    let m_new = max(m, tmax);
    return vec2<f32>(m_new, exp(m - m_new));
}

