//! The cache on Burn's CPU backend: appends land in place at each head's end, metadata follows.

use burn::tensor::{Device, Tensor, TensorData};
use kvslice_cache::{CacheError, CacheGeometry, EMPTY_SLOT, KvCache, KvStore};

fn device() -> Device {
    Device::flex()
}

fn rows(kv: usize, n: usize, d: usize, base: f32, dev: &Device) -> Tensor<3> {
    let data: Vec<f32> = (0..kv * n * d).map(|i| base + i as f32).collect();
    Tensor::from_data(TensorData::new(data, [kv, n, d]), dev)
}

fn geometry() -> CacheGeometry {
    CacheGeometry { layers: 2, kv_heads: 2, head_dim: 3, capacity: 4 }
}

#[test]
fn appends_fill_slots_in_order_and_record_positions() {
    let dev = device();
    let mut cache = KvCache::new(geometry(), &dev).unwrap();
    cache.append(1, rows(2, 2, 3, 0.0, &dev), rows(2, 2, 3, 100.0, &dev), &[0, 1]).unwrap();
    cache.append(1, rows(2, 1, 3, 50.0, &dev), rows(2, 1, 3, 150.0, &dev), &[7]).unwrap();
    let layer = cache.layer(1).unwrap();
    assert_eq!(layer.lens(), &[3, 3]);
    assert_eq!(layer.head_positions(0), &[0, 1, 7]);
    assert_eq!(layer.positions()[3], EMPTY_SLOT);
    let (k, v) = layer.view();
    assert_eq!(k.dims(), [2, 3, 3]);
    let k: Vec<f32> = k.into_data().try_to_vec::<f32>().unwrap();
    // head 0: rows 0..6 of the first append, then 50,51,52; head 1: 6..12 then 53,54,55.
    assert_eq!(&k[..9], &[0., 1., 2., 3., 4., 5., 50., 51., 52.]);
    assert_eq!(&k[9..], &[6., 7., 8., 9., 10., 11., 53., 54., 55.]);
    let v: Vec<f32> = v.into_data().try_to_vec::<f32>().unwrap();
    assert_eq!(&v[6..9], &[150., 151., 152.]);
    // Layer 0 untouched.
    assert_eq!(cache.layer(0).unwrap().lens(), &[0, 0]);
    assert_eq!(cache.occupied_slots(), 6);
}

#[test]
fn ragged_heads_append_at_their_own_end() {
    let dev = device();
    let mut cache = KvCache::new(geometry(), &dev).unwrap();
    cache.append(0, rows(2, 3, 3, 0.0, &dev), rows(2, 3, 3, 0.0, &dev), &[0, 1, 2]).unwrap();
    // Keep slot 2 of head 0 only, slots 0 and 2 of head 1 (as a compaction would leave them).
    let layer = cache.layer_mut(0).unwrap();
    let (k, _) = layer.storage_mut().unwrap();
    let head1 = k.clone().narrow(0, 1, 1).narrow(1, 2, 1);
    *k = k.clone().slice_assign([1..2, 1..2, 0..3], head1);
    let head0 = k.clone().narrow(0, 0, 1).narrow(1, 2, 1);
    *k = k.clone().slice_assign([0..1, 0..1, 0..3], head0);
    layer.set_metadata(vec![1, 2], vec![vec![2], vec![0, 2]]).unwrap();
    cache.append(0, rows(2, 1, 3, 90.0, &dev), rows(2, 1, 3, 0.0, &dev), &[3]).unwrap();
    let layer = cache.layer(0).unwrap();
    assert_eq!(layer.lens(), &[2, 3]);
    assert_eq!(layer.head_positions(0), &[2, 3]);
    assert_eq!(layer.head_positions(1), &[0, 2, 3]);
    let (k, _) = layer.storage().unwrap();
    let k: Vec<f32> = k.clone().into_data().try_to_vec::<f32>().unwrap();
    // head 0 slot 0 = old slot 2 (6,7,8), slot 1 = new row (90,91,92)
    assert_eq!(&k[0..6], &[6., 7., 8., 90., 91., 92.]);
    // head 1 slots: old 0 (9,10,11), old 2 (15,16,17), new (93,94,95)
    assert_eq!(&k[12..21], &[9., 10., 11., 15., 16., 17., 93., 94., 95.]);
}

#[test]
fn bad_appends_are_errors_before_any_write() {
    let dev = device();
    let mut cache = KvCache::new(geometry(), &dev).unwrap();
    let err = cache.append(0, rows(2, 5, 3, 0.0, &dev), rows(2, 5, 3, 0.0, &dev), &[0, 1, 2, 3, 4]);
    assert!(matches!(err, Err(CacheError::Full { capacity: 4, requested: 5, .. })));
    let err = cache.append(0, rows(3, 1, 3, 0.0, &dev), rows(2, 1, 3, 0.0, &dev), &[0]);
    assert!(matches!(err, Err(CacheError::ShapeMismatch { what: "keys", .. })));
    assert!(matches!(
        cache.append(9, rows(2, 1, 3, 0.0, &dev), rows(2, 1, 3, 0.0, &dev), &[0]),
        Err(CacheError::LayerOutOfRange { .. })
    ));
    assert_eq!(cache.occupied_slots(), 0);
    let dup = cache.layer_mut(0).unwrap().set_metadata(vec![2, 0], vec![vec![1, 1], vec![]]);
    assert!(matches!(dup, Err(CacheError::BadKeep { head: 0, .. })));
    assert!(KvCache::new(CacheGeometry { capacity: 0, ..geometry() }, &dev).is_err());
    assert!(KvCache::new(CacheGeometry { capacity: usize::MAX / 2, ..geometry() }, &dev).is_err());
}

fn keys_of(layer: &kvslice_cache::LayerKv) -> Vec<f32> {
    layer.storage().unwrap().0.clone().into_data().try_to_vec::<f32>().unwrap()
}

/// Gather keeps the listed slots of each head, in order, in storage of the new capacity;
/// write_slots reuses a slot; compact moves kept slots to the front in place.
#[test]
fn gather_write_and_compact_by_hand() {
    let dev = device();
    let mut cache = KvCache::new(geometry(), &dev).unwrap();
    // head 0 keys rows 0..4 = [0,1,2],[3,4,5],[6,7,8],[9,10,11]; head 1 = 12.. ; positions 10..14
    cache.append(0, rows(2, 4, 3, 0.0, &dev), rows(2, 4, 3, 100.0, &dev), &[10, 11, 12, 13]).unwrap();
    let layer = cache.layer(0).unwrap();
    let g = layer.gather(&[vec![1, 3], vec![0, 2, 3]], 5).unwrap();
    assert_eq!(g.capacity(), 5);
    assert_eq!(g.lens(), &[2, 3]);
    assert_eq!(g.head_positions(0), &[11, 13]);
    assert_eq!(g.head_positions(1), &[10, 12, 13]);
    let k = keys_of(&g);
    assert_eq!(&k[..6], &[3., 4., 5., 9., 10., 11.]);
    assert_eq!(&k[15..24], &[12., 13., 14., 18., 19., 20., 21., 22., 23.]);
    // the source is untouched
    assert_eq!(layer.lens(), &[4, 4]);
    assert!(matches!(layer.gather(&[vec![4], vec![0]], 5), Err(CacheError::BadKeep { head: 0, .. })));
    assert!(matches!(layer.gather(&[vec![0, 1, 2]], 5), Err(CacheError::ShapeMismatch { .. })));

    // slot reuse: head 0 writes into its free slot 2, head 1 overwrites slot 0 (position 10)
    let mut g = g;
    g.write_slots(&[2, 0], rows(2, 1, 3, 500.0, &dev), rows(2, 1, 3, 600.0, &dev), 20).unwrap();
    assert_eq!(g.lens(), &[3, 3]);
    assert_eq!(g.head_positions(0), &[11, 13, 20]);
    assert_eq!(g.head_positions(1), &[20, 12, 13]);
    let k = keys_of(&g);
    assert_eq!(&k[6..9], &[500., 501., 502.]);
    assert_eq!(&k[15..18], &[503., 504., 505.]);
    // a slot past the first free one, or a position already cached, is refused
    assert!(g.clone().write_slots(&[4, 0], rows(2, 1, 3, 0.0, &dev), rows(2, 1, 3, 0.0, &dev), 21).is_err());
    assert!(g.clone().write_slots(&[3, 1], rows(2, 1, 3, 0.0, &dev), rows(2, 1, 3, 0.0, &dev), 13).is_err());

    // compaction in the same storage: head 0 keeps slots 0 and 2, head 1 keeps slot 2
    g.compact(&[vec![0, 2], vec![2]]).unwrap();
    assert_eq!(g.capacity(), 5);
    assert_eq!(g.lens(), &[2, 1]);
    assert_eq!(g.head_positions(0), &[11, 20]);
    assert_eq!(g.head_positions(1), &[13]);
    let k = keys_of(&g);
    assert_eq!(&k[..6], &[3., 4., 5., 500., 501., 502.]);
    assert_eq!(&k[15..18], &[21., 22., 23.]);
    assert!(g.compact(&[vec![1, 0], vec![0]]).is_err());
}

#[test]
fn truncation_undoes_appends_and_refuses_to_grow() {
    let dev = device();
    let mut cache = KvCache::new(geometry(), &dev).unwrap();
    cache.append(0, rows(2, 2, 3, 0.0, &dev), rows(2, 2, 3, 100.0, &dev), &[0, 1]).unwrap();
    let mark = cache.lens_by_layer();
    assert_eq!(mark, vec![vec![2, 2], vec![0, 0]]);
    cache.append(0, rows(2, 1, 3, 50.0, &dev), rows(2, 1, 3, 150.0, &dev), &[2]).unwrap();
    cache.append(1, rows(2, 1, 3, 50.0, &dev), rows(2, 1, 3, 150.0, &dev), &[2]).unwrap();
    cache.truncate(&mark).unwrap();
    assert_eq!(cache.lens_by_layer(), mark);
    let layer = cache.layer(0).unwrap();
    assert_eq!(layer.head_positions(1), &[0, 1]);
    assert_eq!(&layer.positions()[..4], &[0, 1, EMPTY_SLOT, EMPTY_SLOT]);
    assert_eq!(cache.layer(1).unwrap().positions(), &[EMPTY_SLOT; 8]);
    for layer in cache.layers() {
        layer.check().unwrap();
    }
    // the same token again lands where it did before
    cache.append(0, rows(2, 1, 3, 60.0, &dev), rows(2, 1, 3, 160.0, &dev), &[2]).unwrap();
    assert_eq!(cache.layer(0).unwrap().head_positions(0), &[0, 1, 2]);
    // a mark longer than the cache, or of another shape, is refused and changes nothing
    assert!(cache.truncate(&[vec![4, 4], vec![0, 0]]).is_err());
    assert!(cache.truncate(&[vec![0, 0]]).is_err());
    assert_eq!(cache.lens_by_layer(), vec![vec![3, 3], vec![0, 0]]);
}
