//! Device selection: a wgpu adapter chosen automatically (or on a named graphics API), or
//! Burn's CPU backend as the reference.

use burn::tensor::Device;
use burn::tensor::wgpu::{WgpuBackend, WgpuInitError, wgpu};

use crate::error::{Result, RuntimeError};

/// Which device to run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// wgpu, adapter and graphics API chosen automatically.
    #[default]
    Wgpu,
    /// wgpu pinned to one graphics API.
    WgpuApi(GraphicsApi),
    /// One adapter of one graphics API: its place in wgpu's list of that API's adapters
    /// ([`list_adapters`]; `kvslice doctor` prints it as `wgpu:API:INDEX`).
    WgpuAdapter(GraphicsApi, usize),
    /// Burn's pure-Rust CPU backend (the reference).
    Cpu,
    /// wgpu on a hardware adapter; Burn's CPU backend when the only adapter is a software
    /// rasteriser (lavapipe, SwiftShader), which the CPU backend outruns.
    Auto,
}

/// Graphics APIs wgpu can run kvslice's WGSL on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphicsApi {
    Vulkan,
    Metal,
    Dx12,
    Gl,
    WebGpu,
}

impl GraphicsApi {
    /// The name `--device wgpu:NAME` takes.
    pub fn name(self) -> &'static str {
        match self {
            GraphicsApi::Vulkan => "vulkan",
            GraphicsApi::Metal => "metal",
            GraphicsApi::Dx12 => "dx12",
            GraphicsApi::Gl => "gl",
            GraphicsApi::WebGpu => "webgpu",
        }
    }

    #[cfg(not(target_family = "wasm"))]
    fn wgpu_backend(self) -> wgpu::Backend {
        match self {
            GraphicsApi::Vulkan => wgpu::Backend::Vulkan,
            GraphicsApi::Metal => wgpu::Backend::Metal,
            GraphicsApi::Dx12 => wgpu::Backend::Dx12,
            GraphicsApi::Gl => wgpu::Backend::Gl,
            GraphicsApi::WebGpu => wgpu::Backend::BrowserWebGpu,
        }
    }
}

impl std::fmt::Display for DeviceChoice {
    /// The spelling [`str::parse`] takes back.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceChoice::Wgpu => write!(f, "wgpu"),
            DeviceChoice::WgpuApi(api) => write!(f, "wgpu:{}", api.name()),
            DeviceChoice::WgpuAdapter(api, index) => write!(f, "wgpu:{}:{index}", api.name()),
            DeviceChoice::Cpu => write!(f, "cpu"),
            DeviceChoice::Auto => write!(f, "auto"),
        }
    }
}

impl std::str::FromStr for DeviceChoice {
    type Err = RuntimeError;

    /// `wgpu`, `cpu`, `auto`, `wgpu:vulkan|metal|dx12|gl|webgpu`, or `wgpu:API:INDEX` for one
    /// adapter of an API (the index `kvslice doctor` lists).
    fn from_str(s: &str) -> Result<Self> {
        let api = |name: &str| -> Result<GraphicsApi> {
            Ok(match name {
                "vulkan" => GraphicsApi::Vulkan,
                "metal" => GraphicsApi::Metal,
                "dx12" => GraphicsApi::Dx12,
                "gl" | "opengl" => GraphicsApi::Gl,
                "webgpu" => GraphicsApi::WebGpu,
                other => {
                    return Err(RuntimeError::Device(format!(
                        "unknown graphics API `{other}` (vulkan, metal, dx12, gl, webgpu)"
                    )));
                }
            })
        };
        match s.to_ascii_lowercase().as_str() {
            "wgpu" | "gpu" => Ok(DeviceChoice::Wgpu),
            "auto" => Ok(DeviceChoice::Auto),
            "cpu" | "flex" => Ok(DeviceChoice::Cpu),
            other => match other.strip_prefix("wgpu:") {
                Some(rest) => match rest.split_once(':') {
                    Some((name, index)) => {
                        let index = index.parse().map_err(|_| {
                            RuntimeError::Device(format!(
                                "`{s}`: the adapter index must be a number (`kvslice doctor` lists them)"
                            ))
                        })?;
                        Ok(DeviceChoice::WgpuAdapter(api(name)?, index))
                    }
                    None => Ok(DeviceChoice::WgpuApi(api(rest)?)),
                },
                None => Ok(DeviceChoice::WgpuApi(api(other).map_err(|_| {
                    RuntimeError::Device(format!("unknown device `{s}` (wgpu, cpu, wgpu:vulkan, wgpu:gl, ...)"))
                })?)),
            },
        }
    }
}

/// What was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// `wgpu` or `cpu`.
    pub kind: &'static str,
    /// Adapter name (e.g. `llvmpipe (LLVM 15.0.6, 256 bits)`).
    pub name: String,
    /// Graphics API (Vulkan, Metal, ...).
    pub backend: String,
    /// Discrete, integrated, virtual or CPU.
    pub device_type: String,
    pub driver: String,
    /// Largest storage buffer binding the device was opened with.
    pub max_storage_buffer_binding_size: u64,
    pub max_buffer_size: u64,
}

impl DeviceInfo {
    /// Output rows per invocation of the projection kernel over quantized weights: 4 on CPU
    /// adapters (llvmpipe, SwiftShader), where a load costs a loop over the SIMD lanes and one
    /// load of the inputs then serves four rows (2.1× faster on lavapipe than one row, and
    /// faster than 8, which spills; docs/BENCHMARKS.md, "Weights kept in their blocks"); 1 on
    /// hardware adapters, which want an invocation per row.
    pub fn projection_rows(&self) -> u32 {
        if self.kind == "wgpu" && self.device_type == "Cpu" { 4 } else { 1 }
    }

    /// Every how many kernel launches the host hands the queue to the device and waits parked
    /// for it ([`kvslice_kernels::set_flush_interval`]): 4 on native CPU adapters, where a host
    /// spinning on a full queue takes a core from the adapter's own threads (lavapipe decode
    /// projections 25% faster; docs/BENCHMARKS.md, "Decode attention and the host on CPU
    /// adapters"); 0 (never) on hardware adapters, which have cores to spare, and in the
    /// browser, whose queue never spins.
    pub fn flush_interval(&self) -> usize {
        if cfg!(target_family = "wasm") || self.kind != "wgpu" || self.device_type != "Cpu" { 0 } else { 4 }
    }

    /// Up to how many rows a projection runs through kvslice's skinny-product kernel rather
    /// than Burn's tiled matmul on this adapter (`kvslice bench-kernels`-style figures in
    /// docs/BENCHMARKS.md, "Projections on software adapters"):
    /// - lavapipe (`llvmpipe`): 32 — the kernel is 1.2–2× faster up to 32 rows, the matmul
    ///   faster from 64;
    /// - other CPU adapters (SwiftShader, which is also the browser's WebGPU without a GPU):
    ///   every row — there Burn's untuned matmul is 6–20× slower than the kernel at 22–256 rows;
    /// - hardware adapters: [`kvslice_model::model::SKINNY_ROWS`] (decode steps only).
    pub fn skinny_rows(&self) -> usize {
        if self.kind != "wgpu" {
            return 0;
        }
        if self.device_type != "Cpu" {
            return kvslice_model::model::SKINNY_ROWS;
        }
        if self.name.contains("llvmpipe") { 32 } else { usize::MAX }
    }
}

/// The adapter `device` was opened on by [`init_device`], if it was.
pub fn device_info(device: &Device) -> Option<DeviceInfo> {
    let opened = opened().lock().ok()?;
    opened.iter().find(|(_, d, _, _)| d == device).map(|(_, _, info, _)| info.clone())
}

impl std::fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.kind == "cpu" {
            return write!(f, "cpu ({})", self.name);
        }
        write!(
            f,
            "wgpu: {} [{}; {}; driver {}] max storage binding {} MiB, max buffer {} MiB",
            self.name,
            self.backend,
            self.device_type,
            self.driver,
            self.max_storage_buffer_binding_size >> 20,
            self.max_buffer_size >> 20
        )
    }
}

/// Opens the chosen device. On wgpu the device is requested with the adapter's own limits
/// (wgpu's defaults cap storage buffers at 128 MiB, too small for a vocabulary projection).
/// `KVSLICE_WGPU_BACKEND` (vulkan, metal, dx12, gl, webgpu) pins the API when the choice is
/// plain `wgpu`.
pub async fn init_device(choice: DeviceChoice) -> Result<(Device, DeviceInfo)> {
    let choice = match choice {
        #[cfg(not(target_family = "wasm"))]
        DeviceChoice::Wgpu => match std::env::var("KVSLICE_WGPU_BACKEND") {
            Ok(v) if !v.is_empty() => {
                v.parse().map_err(|e: RuntimeError| RuntimeError::Device(format!("KVSLICE_WGPU_BACKEND: {e}")))?
            }
            _ => DeviceChoice::Wgpu,
        },
        other => other,
    };
    // On Linux, Vulkan is the API every driver (lavapipe included) offers; probing the others
    // first only prints EGL/Wayland noise. Fall back to wgpu's own choice when it is absent.
    #[cfg(target_os = "linux")]
    if choice == DeviceChoice::Wgpu
        && let Ok(found) = Box::pin(init_device(DeviceChoice::WgpuApi(GraphicsApi::Vulkan))).await
    {
        return Ok(found);
    }
    match choice {
        DeviceChoice::Auto => match Box::pin(init_device(DeviceChoice::Wgpu)).await {
            Ok((device, info)) if info.device_type != "Cpu" => Ok((device, info)),
            _ => Box::pin(init_device(DeviceChoice::Cpu)).await,
        },
        #[cfg(target_family = "wasm")]
        DeviceChoice::Cpu => {
            Err(RuntimeError::Device("the CPU backend is not part of the browser build: use WebGPU".into()))
        }
        #[cfg(not(target_family = "wasm"))]
        DeviceChoice::Cpu => Ok((
            Device::flex(),
            DeviceInfo {
                kind: "cpu",
                name: "burn flex".into(),
                backend: "cpu".into(),
                device_type: "Cpu".into(),
                driver: String::new(),
                max_storage_buffer_binding_size: 0,
                max_buffer_size: 0,
            },
        )),
        DeviceChoice::Wgpu | DeviceChoice::WgpuApi(_) | DeviceChoice::WgpuAdapter(..) => {
            // A wgpu runtime can be registered once per process: later calls reuse it. Natively,
            // threads open devices one at a time (two threads racing to register the same
            // adapter would see the second fail and fall back to probing every API, GL's EGL
            // included, which is not safe to initialise from two threads at once).
            #[cfg(not(target_family = "wasm"))]
            let _one_at_a_time = init_gate().lock().unwrap_or_else(|e| e.into_inner());
            if let Some(found) = opened().lock().ok().and_then(|m| m.iter().find(|(c, _, _, _)| *c == choice).cloned())
            {
                return Ok((found.1, found.2));
            }
            let mut options = Device::wgpu_options();
            if let DeviceChoice::WgpuApi(api) | DeviceChoice::WgpuAdapter(api, _) = choice {
                options = options.graphics_api(match api {
                    GraphicsApi::Vulkan => WgpuBackend::Vulkan,
                    GraphicsApi::Metal => WgpuBackend::Metal,
                    GraphicsApi::Dx12 => WgpuBackend::Dx12,
                    GraphicsApi::Gl => WgpuBackend::Gl,
                    GraphicsApi::WebGpu => WgpuBackend::WebGpu,
                });
            }
            #[cfg(not(target_family = "wasm"))]
            if let DeviceChoice::WgpuAdapter(api, index) = choice {
                options = options.device_kind(adapter_kind(api, index)?);
            }
            #[cfg(target_family = "wasm")]
            if let DeviceChoice::WgpuAdapter(..) = choice {
                return Err(RuntimeError::Device("the browser offers one adapter: use --device wgpu".into()));
            }
            // Natively, driven here so that no `.await` is crossed with the gate held.
            #[cfg(not(target_family = "wasm"))]
            let (device, setup) = pollster::block_on(options.init_with_setup_async()).map_err(wgpu_error)?;
            #[cfg(target_family = "wasm")]
            let (device, setup) = options.init_with_setup_async().await.map_err(wgpu_error)?;
            let info = setup.adapter.get_info();
            let limits = setup.device.limits();
            let result = (
                device,
                DeviceInfo {
                    kind: "wgpu",
                    name: info.name.clone(),
                    backend: format!("{:?}", info.backend),
                    device_type: format!("{:?}", info.device_type),
                    driver: format!("{} {}", info.driver, info.driver_info).trim().to_string(),
                    max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size,
                    max_buffer_size: limits.max_buffer_size,
                },
            );
            if let Ok(mut m) = opened().lock() {
                m.push((choice, result.0.clone(), result.1.clone(), setup.device.clone()));
            }
            Ok(result)
        }
    }
}

/// One adapter wgpu finds on one graphics API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterEntry {
    pub api: GraphicsApi,
    /// Its place in wgpu's list of `api`'s adapters: [`DeviceChoice::WgpuAdapter`]'s index.
    pub index: usize,
    pub name: String,
    /// Discrete, integrated, virtual, CPU or other, as the API reports it.
    pub device_type: String,
    pub driver: String,
}

impl AdapterEntry {
    /// The choice that opens this adapter.
    pub fn choice(&self) -> DeviceChoice {
        DeviceChoice::WgpuAdapter(self.api, self.index)
    }
}

/// Every adapter wgpu finds on every native graphics API this build has (Vulkan, Metal, DX12,
/// GL), in wgpu's order per API. One physical GPU appears once per API that reaches it.
#[cfg(not(target_family = "wasm"))]
pub fn list_adapters() -> Vec<AdapterEntry> {
    let _one_at_a_time = init_gate().lock().unwrap_or_else(|e| e.into_inner());
    let mut out = Vec::new();
    for api in [GraphicsApi::Vulkan, GraphicsApi::Metal, GraphicsApi::Dx12, GraphicsApi::Gl] {
        for (index, info) in adapters_on(api).into_iter().enumerate() {
            out.push(AdapterEntry {
                api,
                index,
                name: info.name.clone(),
                device_type: format!("{:?}", info.device_type),
                driver: format!("{} {}", info.driver, info.driver_info).trim().to_string(),
            });
        }
    }
    out
}

/// The adapters of one API, in the order wgpu (and so Burn's adapter selection) lists them.
#[cfg(not(target_family = "wasm"))]
fn adapters_on(api: GraphicsApi) -> Vec<wgpu::AdapterInfo> {
    let backend = api.wgpu_backend();
    if !wgpu::Instance::enabled_backend_features().contains(backend.into()) {
        return Vec::new();
    }
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: backend.into(),
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    pollster::block_on(instance.enumerate_adapters(backend.into())).iter().map(wgpu::Adapter::get_info).collect()
}

/// Burn's name for the `index`-th adapter of `api`: adapters are addressed by their kind and
/// their place among the adapters of that kind.
#[cfg(not(target_family = "wasm"))]
fn adapter_kind(api: GraphicsApi, index: usize) -> Result<burn::tensor::DeviceKind> {
    use burn::tensor::DeviceKind;
    let adapters = adapters_on(api);
    let Some(info) = adapters.get(index) else {
        return Err(RuntimeError::Device(format!(
            "wgpu:{}:{index}: {} has {} adapter(s) here (`kvslice doctor` lists them)",
            api.name(),
            api.name(),
            adapters.len()
        )));
    };
    let same_kind_before = adapters[..index].iter().filter(|a| a.device_type == info.device_type).count();
    Ok(match info.device_type {
        wgpu::DeviceType::DiscreteGpu => DeviceKind::DiscreteGpu(same_kind_before),
        wgpu::DeviceType::IntegratedGpu => DeviceKind::IntegratedGpu(same_kind_before),
        wgpu::DeviceType::VirtualGpu => DeviceKind::VirtualGpu(same_kind_before),
        // Burn names one CPU adapter per API, the first.
        wgpu::DeviceType::Cpu if same_kind_before == 0 => DeviceKind::Cpu,
        // An adapter of no known kind can be reached as the API's only adapter.
        wgpu::DeviceType::Other if adapters.len() == 1 => DeviceKind::DefaultDevice,
        _ => {
            return Err(RuntimeError::Device(format!(
                "wgpu:{}:{index} ({}, {:?}) cannot be opened on its own: only the first CPU adapter \
                 of an API, and an adapter of unknown kind only as its API's one adapter, can be named",
                api.name(),
                info.name,
                info.device_type
            )));
        }
    })
}

/// The wgpu devices this process opened: the choice, Burn's device, its description and the
/// wgpu handle (for [`release_gpu_memory`]).
type Opened = std::sync::Mutex<Vec<(DeviceChoice, Device, DeviceInfo, wgpu::Device)>>;

/// Held while a native thread opens a wgpu device.
#[cfg(not(target_family = "wasm"))]
fn init_gate() -> &'static std::sync::Mutex<()> {
    static GATE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    &GATE
}

fn opened() -> &'static Opened {
    static OPENED: std::sync::OnceLock<Opened> = std::sync::OnceLock::new();
    OPENED.get_or_init(|| std::sync::Mutex::new(Vec::new()))
}

/// Destroys every wgpu device this process opened, which frees all of their buffers at once;
/// returns how many. For after a panic, when the values that own the buffers will never be
/// dropped (a panic aborts the browser build's wasm instance where it stands, with the
/// session's cache and the model's weights still allocated). Any later use of those devices
/// fails: a process that goes on must open a new one.
pub fn release_gpu_memory() -> usize {
    // A panic while the lock was held leaves it poisoned; the handles are still good.
    let opened = opened().lock().unwrap_or_else(|e| e.into_inner());
    for (_, _, _, device) in opened.iter() {
        device.destroy();
    }
    opened.len()
}

fn wgpu_error(e: WgpuInitError) -> RuntimeError {
    RuntimeError::Device(format!(
        "no usable wgpu adapter: {e} (on Linux without a GPU, install Mesa's lavapipe: \
         `scripts/setup-system.sh`, or run with --device cpu)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(kind: &'static str, name: &str, device_type: &str) -> DeviceInfo {
        DeviceInfo {
            kind,
            name: name.into(),
            backend: "Vulkan".into(),
            device_type: device_type.into(),
            driver: String::new(),
            max_storage_buffer_binding_size: 0,
            max_buffer_size: 0,
        }
    }

    #[test]
    fn device_choices_parse_and_print_back() {
        for (text, choice) in [
            ("wgpu", DeviceChoice::Wgpu),
            ("cpu", DeviceChoice::Cpu),
            ("auto", DeviceChoice::Auto),
            ("wgpu:gl", DeviceChoice::WgpuApi(GraphicsApi::Gl)),
            ("wgpu:vulkan:1", DeviceChoice::WgpuAdapter(GraphicsApi::Vulkan, 1)),
        ] {
            assert_eq!(text.parse::<DeviceChoice>().unwrap(), choice, "{text}");
            assert_eq!(choice.to_string(), text);
        }
        assert_eq!("Vulkan".parse::<DeviceChoice>().unwrap(), DeviceChoice::WgpuApi(GraphicsApi::Vulkan));
        for bad in ["wgpu:vulkan:x", "wgpu:vulkan:-1", "wgpu:glide", "wgpu:glide:0", "tpu"] {
            let e = bad.parse::<DeviceChoice>().unwrap_err().to_string();
            assert!(e.contains("index") || e.contains("unknown"), "{bad}: {e}");
        }
    }

    #[test]
    fn skinny_rows_follow_the_adapter() {
        // The rows measured in docs/BENCHMARKS.md, "Projections on software adapters".
        assert_eq!(info("wgpu", "llvmpipe (LLVM 15.0.6, 256 bits)", "Cpu").skinny_rows(), 32);
        assert_eq!(info("wgpu", "SwiftShader Device (Subzero)", "Cpu").skinny_rows(), usize::MAX);
        // the browser's fallback adapter reports no name
        assert_eq!(info("wgpu", "", "Cpu").skinny_rows(), usize::MAX);
        assert_eq!(info("wgpu", "NVIDIA H200", "DiscreteGpu").skinny_rows(), 4);
        assert_eq!(info("cpu", "burn flex", "Cpu").skinny_rows(), 0);
    }

    #[test]
    fn projection_rows_follow_the_adapter() {
        assert_eq!(info("wgpu", "llvmpipe (LLVM 15.0.6, 256 bits)", "Cpu").projection_rows(), 4);
        assert_eq!(info("wgpu", "", "Cpu").projection_rows(), 4);
        assert_eq!(info("wgpu", "NVIDIA H200", "DiscreteGpu").projection_rows(), 1);
        assert_eq!(info("wgpu", "Apple M3", "IntegratedGpu").projection_rows(), 1);
    }

    #[test]
    fn only_cpu_adapters_flush_every_few_launches() {
        assert_eq!(info("wgpu", "llvmpipe (LLVM 15.0.6, 256 bits)", "Cpu").flush_interval(), 4);
        assert_eq!(info("wgpu", "NVIDIA H200", "DiscreteGpu").flush_interval(), 0);
        assert_eq!(info("cpu", "flex", "Cpu").flush_interval(), 0);
    }
}
