//! Kernel 4: compaction against its twin (bit-exact), in the same buffers, and the freed slots
//! reused by appends (the append kernel and Burn's slice_assign).

use burn::tensor::{Int, Tensor};
use kvslice_kernels::{
    CacheTensors, KernelError, append_rows, buffer_id, compact_in_place_host, cpu, decode_attention, int_buffer_id,
    write_rows,
};
use proptest::prelude::*;

use crate::common::{Rng, assert_close, device, f2, f3, i2, read, read_i32};

struct Host {
    kv_heads: usize,
    cap: usize,
    d: usize,
    k: Vec<f32>,
    v: Vec<f32>,
    p: Vec<i32>,
}

impl Host {
    fn random(kv_heads: usize, cap: usize, d: usize, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let k = rng.vec(kv_heads * cap * d, 1.0);
        let v = rng.vec(kv_heads * cap * d, 1.0);
        let p = (0..kv_heads * cap).map(|i| (i % cap) as i32 + 1000 * (i / cap) as i32).collect();
        Host { kv_heads, cap, d, k, v, p }
    }

    fn upload(&self) -> (Tensor<3>, Tensor<3>, Tensor<2, Int>) {
        let dev = device();
        (
            f3(self.k.clone(), [self.kv_heads, self.cap, self.d], &dev),
            f3(self.v.clone(), [self.kv_heads, self.cap, self.d], &dev),
            i2(self.p.clone(), [self.kv_heads, self.cap], &dev),
        )
    }

    /// The twin: each head gathered in place.
    fn compacted(&self, kept: &[Vec<u32>]) -> Host {
        let (cap, d) = (self.cap, self.d);
        let mut out = Host { k: vec![], v: vec![], p: vec![], ..*self };
        for (h, list) in kept.iter().enumerate() {
            out.k.extend(cpu::compact(&self.k[h * cap * d..(h + 1) * cap * d], d, list));
            out.v.extend(cpu::compact(&self.v[h * cap * d..(h + 1) * cap * d], d, list));
            out.p.extend(cpu::compact(&self.p[h * cap..(h + 1) * cap], 1, list));
        }
        out
    }
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

proptest! {
    #![proptest_config(crate::common::gpu_config(16))]

    #[test]
    fn matches_twin_bit_for_bit(
        kv_heads in 1usize..5,
        cap in 1usize..400,
        d in prop::sample::select(vec![64usize, 128, 5, 96]),
        seed in any::<u64>(),
    ) {
        let host = Host::random(kv_heads, cap, d, seed);
        let mut rng = Rng::new(seed ^ 1);
        let mut lens = Vec::new();
        let mut kept = Vec::new();
        for _ in 0..kv_heads {
            let len = rng.below(cap + 1);
            let count = match rng.below(4) { 0 => 0, 1 => len, _ => rng.below(len + 1) };
            lens.push(len as u32);
            kept.push(rng.subset(len, count));
        }
        let (mut k, mut v, mut p) = host.upload();
        let new_lens = compact_in_place_host(CacheTensors { keys: &mut k, values: &mut v, positions: &mut p }, &kept, &lens).unwrap();
        let want = host.compacted(&kept);
        prop_assert_eq!(new_lens, kept.iter().map(|l| l.len() as u32).collect::<Vec<_>>());
        prop_assert_eq!(bits(&read(k)), bits(&want.k));
        prop_assert_eq!(bits(&read(v)), bits(&want.v));
        prop_assert_eq!(read_i32(p), want.p);
    }
}

#[test]
fn gathers_past_the_chunk_boundary() {
    // kept = [1, 5, …]: slot 1 is a source of t = 0 and the destination of t = 1, and with
    // d = 128 a chunk is 8 rows, so sources cross chunks in both directions.
    let host = Host::random(1, 300, 128, 42);
    let kept = vec![(1..300).step_by(4).map(|x| x as u32).collect::<Vec<_>>()];
    let (mut k, mut v, mut p) = host.upload();
    compact_in_place_host(CacheTensors { keys: &mut k, values: &mut v, positions: &mut p }, &kept, &[300]).unwrap();
    let want = host.compacted(&kept);
    assert_eq!(bits(&read(k)), bits(&want.k));
    assert_eq!(bits(&read(v)), bits(&want.v));
    assert_eq!(read_i32(p), want.p);
}

#[test]
fn same_buffers_and_freed_slots_reused_by_appends() {
    let dev = device();
    let (kv_heads, cap, d) = (3usize, 64usize, 64usize);
    let host = Host::random(kv_heads, cap, d, 5);
    let (mut k, mut v, mut p) = host.upload();
    let ids = (buffer_id(&k).unwrap(), buffer_id(&v).unwrap(), int_buffer_id(&p).unwrap());
    let lens = vec![cap as u32, 50, 20];

    let mut rng = Rng::new(8);
    let kept_host: Vec<Vec<u32>> =
        [(64usize, 10usize), (50, 33), (20, 20)].iter().map(|&(len, count)| rng.subset(len, count)).collect();
    let lens =
        compact_in_place_host(CacheTensors { keys: &mut k, values: &mut v, positions: &mut p }, &kept_host, &lens)
            .unwrap();
    assert_eq!(lens, [10, 33, 20]);
    assert_eq!(
        (buffer_id(&k).unwrap(), buffer_id(&v).unwrap(), int_buffer_id(&p).unwrap()),
        ids,
        "compaction reallocated"
    );

    let mut want = host.compacted(&kept_host);

    // append two rows per head at slots lens[h], lens[h] + 1: the freed slots
    let t = 2;
    let nk = rng.vec(kv_heads * t * d, 1.0);
    let nv = rng.vec(kv_heads * t * d, 1.0);
    let np: Vec<i32> = (0..kv_heads * t).map(|i| 5000 + i as i32).collect();
    let lens = append_rows(
        CacheTensors { keys: &mut k, values: &mut v, positions: &mut p },
        &f3(nk.clone(), [kv_heads, t, d], &dev),
        &f3(nv.clone(), [kv_heads, t, d], &dev),
        &i2(np.clone(), [kv_heads, t], &dev),
        &lens,
    )
    .unwrap();
    assert_eq!(lens, [12, 35, 22]);
    for h in 0..kv_heads {
        for r in 0..t {
            let slot = [10, 33, 20][h] + r;
            let dst = (h * cap + slot) * d;
            let src = (h * t + r) * d;
            want.k[dst..dst + d].copy_from_slice(&nk[src..src + d]);
            want.v[dst..dst + d].copy_from_slice(&nv[src..src + d]);
            want.p[h * cap + slot] = np[h * t + r];
        }
    }

    // one more row into head 1 through Burn's slice_assign, which writes in place when the
    // tensor is the buffer's only owner
    let row = rng.vec(d, 1.0);
    k = k.slice_assign([1..2, 35..36, 0..d], f3(row.clone(), [1, 1, d], &dev));
    want.k[(cap + 35) * d..(cap + 36) * d].copy_from_slice(&row);

    assert_eq!(
        (buffer_id(&k).unwrap(), buffer_id(&v).unwrap(), int_buffer_id(&p).unwrap()),
        ids,
        "appends reallocated"
    );
    assert_eq!(bits(&read(k.clone())), bits(&want.k));
    assert_eq!(bits(&read(v.clone())), bits(&want.v));
    assert_eq!(read_i32(p.clone()), want.p);

    // decode over the compacted, refilled cache sees exactly the twin's cache
    let lens = [12u32, 35, 22];
    let q = rng.vec(kv_heads * d, 1.0);
    let out = decode_attention(&f2(q.clone(), [kv_heads, d], &dev), &k, &v, &lens, None).unwrap();
    let (want_out, _) = cpu::decode_attention(&q, &want.k, &want.v, kv_heads, kv_heads, cap, d, &lens);
    assert_close("decode after compaction", &read(out), &want_out, 1e-4, 1e-5);
}

#[test]
fn host_kept_lists_are_validated() {
    let host = Host::random(2, 8, 64, 1);
    let (mut k2, mut v2, mut p2) = host.upload();
    let err = compact_in_place_host(
        CacheTensors { keys: &mut k2, values: &mut v2, positions: &mut p2 },
        &[vec![0, 2, 2], vec![]],
        &[8, 8],
    );
    assert_eq!(err.unwrap_err(), KernelError::KeptOrder { head: 0, index: 2, position: 2, len: 8 });
    let err = compact_in_place_host(
        CacheTensors { keys: &mut k2, values: &mut v2, positions: &mut p2 },
        &[vec![0], vec![6]],
        &[8, 6],
    );
    assert_eq!(err.unwrap_err(), KernelError::KeptOrder { head: 1, index: 0, position: 6, len: 6 });
    let err = compact_in_place_host(
        CacheTensors { keys: &mut k2, values: &mut v2, positions: &mut p2 },
        &[vec![0], vec![1]],
        &[9, 6],
    );
    assert_eq!(err.unwrap_err(), KernelError::LengthPastCapacity { head: 0, len: 9, capacity: 8 });
    // appends past the capacity
    let dev = device();
    let err = append_rows(
        CacheTensors { keys: &mut k2, values: &mut v2, positions: &mut p2 },
        &f3(vec![0.0; 2 * 3 * 64], [2, 3, 64], &dev),
        &f3(vec![0.0; 2 * 3 * 64], [2, 3, 64], &dev),
        &i2(vec![0; 6], [2, 3], &dev),
        &[5, 6],
    );
    assert_eq!(err.unwrap_err(), KernelError::LengthPastCapacity { head: 1, len: 9, capacity: 8 });
    let one = f3(vec![0.0; 2 * 64], [2, 1, 64], &dev);
    let err = write_rows(&mut k2, &mut v2, &one, &one, &[7, 8]);
    assert_eq!(err.unwrap_err(), KernelError::LengthPastCapacity { head: 1, len: 9, capacity: 8 });
    let err = write_rows(&mut k2, &mut v2, &one, &one, &[7]);
    assert_eq!(err.unwrap_err(), KernelError::PerHead { what: "starts", expected: 2, got: 1 });
    // nothing was dispatched: the cache is untouched
    assert_eq!(bits(&read(k2)), bits(&host.k));
}

proptest! {
    #![proptest_config(crate::common::gpu_config(12))]

    /// Row writes at per-head slots against the same writes on the host, bit for bit, in the
    /// cache's own buffers; a clone taken before the write keeps its contents.
    #[test]
    fn row_writes_match_twin_in_place(
        kv_heads in 1usize..5,
        cap in 1usize..80,
        d in prop::sample::select(vec![64usize, 128, 5, 200]),
        t_frac in 0.0f64..1.0,
        seed in any::<u64>(),
    ) {
        let dev = device();
        let host = Host::random(kv_heads, cap, d, seed);
        let (mut k, mut v, _) = host.upload();
        let mut rng = Rng::new(seed ^ 3);
        let t = 1 + ((cap - 1) as f64 * t_frac * 0.5) as usize;
        let starts: Vec<u32> = (0..kv_heads).map(|_| rng.below(cap - t + 1) as u32).collect();
        let nk = rng.vec(kv_heads * t * d, 1.0);
        let nv = rng.vec(kv_heads * t * d, 1.0);
        let ids = (buffer_id(&k).unwrap(), buffer_id(&v).unwrap());
        write_rows(&mut k, &mut v, &f3(nk.clone(), [kv_heads, t, d], &dev), &f3(nv.clone(), [kv_heads, t, d], &dev), &starts).unwrap();
        prop_assert_eq!((buffer_id(&k).unwrap(), buffer_id(&v).unwrap()), ids, "written in place");
        let (mut want_k, mut want_v) = (host.k.clone(), host.v.clone());
        for (h, &start) in starts.iter().enumerate() {
            for r in 0..t {
                let dst = (h * cap + start as usize + r) * d;
                let src = (h * t + r) * d;
                want_k[dst..dst + d].copy_from_slice(&nk[src..src + d]);
                want_v[dst..dst + d].copy_from_slice(&nv[src..src + d]);
            }
        }
        prop_assert_eq!(bits(&read(k.clone())), bits(&want_k));
        prop_assert_eq!(bits(&read(v.clone())), bits(&want_v));

        // copy on write: the clone keeps the old rows, the written tensor gets a new buffer
        let clone = k.clone();
        let before = read(clone.clone());
        let zeros = f3(vec![0.0; kv_heads * t * d], [kv_heads, t, d], &dev);
        write_rows(&mut k, &mut v, &zeros, &zeros, &starts).unwrap();
        prop_assert_eq!(bits(&read(clone)), bits(&before));
        prop_assert_ne!(buffer_id(&k).unwrap(), ids.0);
    }
}
