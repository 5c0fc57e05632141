//! Plumbing between Burn tensors and the WGSL launches: unwrapping a tensor into its wgpu
//! buffer, validating element types and devices, allocating outputs and small parameter
//! buffers, and launching an entry point. Nothing here reads device memory back.

use burn::backend::wgpu::{CubeBackend, CubeTensor, SourceKernel, into_contiguous};
use burn::cubecl::server::{BufferBinding, Handle, KernelArguments};
use burn::cubecl::{CubeCount, CubeDim, RuntimeId};
use burn::tensor::{DType, Int, Shape, Tensor};

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{KernelError, Result};
use crate::shader::{Family, WgslKernel};

/// Identity of the device buffer behind a tensor: the allocation and the byte range used.
///
/// Two tensors with equal ids read and write the same memory; an in-place kernel leaves the
/// id of its tensors unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufferId {
    /// Allocation id of the memory manager (never reused while the allocation lives).
    pub allocation: usize,
    /// First byte of the tensor in the allocation.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
}

/// The buffer behind a wgpu tensor, or `None` for a tensor of another backend.
pub fn buffer_id<const D: usize>(tensor: &Tensor<D>) -> Option<BufferId> {
    let prim = tensor.clone().try_into_primitive::<CubeBackend>().ok()?;
    Some(handle_id(&prim.handle))
}

/// [`buffer_id`] for an integer tensor.
pub fn int_buffer_id<const D: usize>(tensor: &Tensor<D, Int>) -> Option<BufferId> {
    let prim = tensor.clone().try_into_primitive::<CubeBackend>().ok()?;
    Some(handle_id(&prim.handle))
}

fn handle_id(handle: &Handle) -> BufferId {
    let (id, start, end) = handle.clone().binding().claim_key();
    BufferId { allocation: id.value, start, end }
}

/// Checks rank-`D` dims against `expected` (`usize::MAX` = any).
pub(crate) fn expect_shape(tensor: &'static str, got: &[usize], expected: &[usize]) -> Result<()> {
    let ok = got.len() == expected.len() && got.iter().zip(expected).all(|(g, e)| *e == usize::MAX || g == e);
    if ok { Ok(()) } else { Err(KernelError::Shape { tensor, expected: expected.to_vec(), got: got.to_vec() }) }
}

pub(crate) fn check_u32(what: &'static str, value: usize) -> Result<u32> {
    u32::try_from(value).map_err(|_| KernelError::TooLarge { what, value })
}

/// Fails unless `count` elements are addressable by 32-bit shader indices.
pub(crate) fn check_elements(what: &'static str, dims: &[usize]) -> Result<()> {
    let mut total: usize = 1;
    for &d in dims {
        total = total.saturating_mul(d);
    }
    check_u32(what, total).map(|_| ())
}

/// Fails when a dispatch dimension would pass WebGPU's guaranteed 65535 workgroups.
pub(crate) fn check_groups(what: &'static str, count: usize) -> Result<()> {
    if count > 65_535 {
        return Err(KernelError::TooLarge { what, value: count });
    }
    Ok(())
}

pub(crate) fn check_head_dim(head_dim: usize) -> Result<()> {
    if head_dim == 0 || head_dim > crate::shader::MAX_HEAD_DIM {
        return Err(KernelError::HeadDim { head_dim, max: crate::shader::MAX_HEAD_DIM });
    }
    Ok(())
}

pub(crate) fn check_grouping(heads: usize, kv_heads: usize) -> Result<()> {
    if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(KernelError::Grouping { heads, kv_heads });
    }
    Ok(())
}

/// A wgpu float tensor's primitive, validated (f32, wgpu device); pass it through [`ready`]
/// once every argument is validated.
pub(crate) fn float_input<const D: usize>(tensor: &'static str, t: &Tensor<D>) -> Result<CubeTensor> {
    float_prim(tensor, t)
}

/// The primitive laid out contiguously for reading: a no-op for a plain tensor, a device-side
/// copy for views and tiled layouts. Called after validation, so an error never follows work.
pub(crate) fn ready(prim: CubeTensor) -> CubeTensor {
    into_contiguous(prim)
}

fn float_prim<const D: usize>(tensor: &'static str, t: &Tensor<D>) -> Result<CubeTensor> {
    let prim = t
        .clone()
        .try_into_primitive::<CubeBackend>()
        .map_err(|e| KernelError::Device { tensor, reason: format!("{e:?}") })?;
    check_prim(tensor, &prim, &[DType::F32], "f32")?;
    Ok(prim)
}

fn int_prim<const D: usize>(tensor: &'static str, t: &Tensor<D, Int>) -> Result<CubeTensor> {
    let prim = t
        .clone()
        .try_into_primitive::<CubeBackend>()
        .map_err(|e| KernelError::Device { tensor, reason: format!("{e:?}") })?;
    check_prim(tensor, &prim, &[DType::I32, DType::U32], "i32 or u32")?;
    Ok(prim)
}

fn check_prim(tensor: &'static str, prim: &CubeTensor, dtypes: &[DType], expected: &'static str) -> Result<()> {
    if prim.device.runtime() != RuntimeId::Wgpu {
        return Err(KernelError::Device { tensor, reason: format!("runtime {:?}", prim.device.runtime()) });
    }
    if !dtypes.contains(&prim.dtype) {
        return Err(KernelError::DType { tensor, expected, got: format!("{:?}", prim.dtype) });
    }
    Ok(())
}

/// A float tensor updated in place: must be contiguous (its buffer is written directly).
pub(crate) fn float_in_place<const D: usize>(tensor: &'static str, t: &Tensor<D>) -> Result<CubeTensor> {
    let prim = float_prim(tensor, t)?;
    if !prim.is_contiguous() {
        return Err(KernelError::NotContiguous { tensor });
    }
    Ok(prim)
}

/// An i32/u32 tensor updated in place.
pub(crate) fn int_in_place<const D: usize>(tensor: &'static str, t: &Tensor<D, Int>) -> Result<CubeTensor> {
    let prim = int_prim(tensor, t)?;
    if !prim.is_contiguous() {
        return Err(KernelError::NotContiguous { tensor });
    }
    Ok(prim)
}

/// An i32/u32 tensor read by a kernel (see [`ready`]).
pub(crate) fn int_input<const D: usize>(tensor: &'static str, t: &Tensor<D, Int>) -> Result<CubeTensor> {
    int_prim(tensor, t)
}

/// Takes a float tensor, already validated with [`float_input`], out of `slot` for an in-place
/// write, leaving `placeholder` there until the caller puts the result back. A buffer shared
/// with another tensor, or laid out with strides, is copied first (as Burn's own in-place ops
/// do), so no other tensor sees the write.
pub(crate) fn take_writable<const D: usize>(slot: &mut Tensor<D>, placeholder: Tensor<D>) -> Result<CubeTensor> {
    let t = std::mem::replace(slot, placeholder);
    let prim = t
        .try_into_primitive::<CubeBackend>()
        .map_err(|e| KernelError::Device { tensor: "cache", reason: format!("{e:?}") })?;
    Ok(if !prim.is_contiguous() {
        into_contiguous(prim)
    } else if !prim.can_mut() {
        prim.copy()
    } else {
        prim
    })
}

pub(crate) fn same_device(a: (&'static str, &CubeTensor), b: (&'static str, &CubeTensor)) -> Result<()> {
    if a.1.device != b.1.device {
        return Err(KernelError::DeviceMismatch { tensor: b.0, other: a.0 });
    }
    Ok(())
}

/// Launch context: the client and device of a reference tensor.
pub(crate) struct Gpu {
    like: CubeTensor,
}

impl Gpu {
    pub fn new(like: &CubeTensor) -> Self {
        Gpu { like: like.clone() }
    }

    /// An uninitialised contiguous tensor.
    pub fn empty(&self, shape: &[usize], dtype: DType) -> CubeTensor {
        let elems: usize = shape.iter().product();
        let handle = self.like.client.empty((elems * dtype.size()).max(4));
        CubeTensor::new_contiguous(
            self.like.client.clone(),
            self.like.device.clone(),
            Shape::from(shape.to_vec()),
            handle,
            dtype,
        )
    }

    /// A parameter block followed by a per-head list (the WGSL struct's runtime-sized tail;
    /// an empty tail still gets one word, so the array is never zero-sized).
    pub fn params<P: bytemuck::Pod>(&self, block: &P, tail: &[u32]) -> BufferBinding {
        let mut bytes = bytemuck::bytes_of(block).to_vec();
        let tail: &[u32] = if tail.is_empty() { &[0] } else { tail };
        bytes.extend_from_slice(bytemuck::cast_slice(tail));
        self.like.client.create_from_slice(&bytes).binding()
    }

    /// A placeholder for an optional binding the kernel does not touch.
    pub fn dummy(&self) -> BufferBinding {
        self.like.client.empty(16).binding()
    }

    /// Launches `family`/`entry` over `count` workgroups with `buffers` bound in order.
    pub fn launch(&self, family: Family, entry: &'static str, count: (u32, u32, u32), buffers: Vec<BufferBinding>) {
        self.launch_variant(family, entry, family.variants()[0], count, buffers);
    }

    /// [`Gpu::launch`] of one of the family's [`Family::variants`].
    pub fn launch_variant(
        &self,
        family: Family,
        entry: &'static str,
        variant: u32,
        count: (u32, u32, u32),
        buffers: Vec<BufferBinding>,
    ) {
        if count.0 == 0 || count.1 == 0 || count.2 == 0 {
            return;
        }
        let kernel = WgslKernel { family, entry, variant };
        let cube_dim = CubeDim::new_1d(family.workgroup_variant(entry, variant));
        crate::dispatch::labelled(family, entry, || {
            self.like.client.launch(
                Box::new(SourceKernel::new(kernel, cube_dim)),
                CubeCount::Static(count.0, count.1, count.2),
                KernelArguments::new().with_buffers(buffers),
            )
        });
        let every = FLUSH_EVERY.load(Ordering::Relaxed);
        if every > 0 && LAUNCHES.fetch_add(1, Ordering::Relaxed) % every == every - 1 {
            // A failed flush leaves the work queued: the next read or sync reports the fault.
            let _ = self.like.client.flush();
        }
    }
}

static FLUSH_EVERY: AtomicUsize = AtomicUsize::new(0);
static LAUNCHES: AtomicUsize = AtomicUsize::new(0);

/// Hands the queued work to the device every `n` kernel launches and waits for the device
/// thread to take it (0, the default: never; the queue is handed over when it fills).
///
/// Burn's wgpu client queues launches for a device thread, and a host thread that finds the
/// queue full spins until the device thread drains it. On a CPU adapter (lavapipe,
/// SwiftShader) the adapter's own worker threads run the kernels on the same cores, so that
/// spinning takes a core from them: 35% of a chain of decode projections' samples on a
/// two-core machine. Flushing every few launches makes the host wait parked instead
/// (docs/BENCHMARKS.md, "Decode attention and the host on CPU adapters"). Process-wide: the
/// runtime sets it when it loads a model on a CPU adapter.
pub fn set_flush_interval(n: usize) {
    FLUSH_EVERY.store(n, Ordering::Relaxed);
}

/// The interval [`set_flush_interval`] set (0: never).
pub fn flush_interval() -> usize {
    FLUSH_EVERY.load(Ordering::Relaxed)
}

pub(crate) fn bind(t: &CubeTensor) -> BufferBinding {
    t.handle.clone().binding()
}

pub(crate) fn float_tensor<const D: usize>(t: CubeTensor) -> Tensor<D> {
    Tensor::from_primitive::<CubeBackend>(t)
}

pub(crate) fn div_ceil(a: usize, b: u32) -> u32 {
    a.div_ceil(b as usize) as u32
}

impl Gpu {
    /// A u32 tensor uploaded from the host (kernel parameters given as host lists).
    pub fn upload_u32(&self, data: &[u32], shape: &[usize]) -> CubeTensor {
        let handle = if data.is_empty() {
            self.like.client.empty(4)
        } else {
            self.like.client.create_from_slice(bytemuck::cast_slice(data))
        };
        CubeTensor::new_contiguous(
            self.like.client.clone(),
            self.like.device.clone(),
            Shape::from(shape.to_vec()),
            handle,
            DType::U32,
        )
    }
}
