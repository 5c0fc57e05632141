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
    let (k, _) = layer.storage_mut();
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
    let (k, _) = layer.storage();
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
