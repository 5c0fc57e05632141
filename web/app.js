// kvslice's browser demo: WebGPU check, model download (cached in Cache Storage) or file,
// streamed greedy generation with a policy and budget, the kept positions as a heatmap, and
// the kernel conformance suite. State for tests is mirrored in `window.kvsliceDemo`.
import init, * as kv from './pkg/kvslice_web.js';

const $ = (id) => document.getElementById(id);
const MODEL_CACHE = 'kvslice-models';
const demo = { gpu: null, device: null, model: null, lastOutcome: null, lastTimings: null, conformance: null, errors: [] };
window.kvsliceDemo = demo;
let stopRequested = false;
let busy = false;

function setStatus(id, state, text) {
  const el = $(id);
  el.dataset.state = state;
  el.textContent = text;
  if (state === 'error') demo.errors.push(`${id}: ${text}`);
}

const mib = (b) => `${(b / (1 << 20)).toFixed(2)} MiB`;
const rate = (n, ms) => (ms > 0 ? `${(n / (ms / 1000)).toFixed(2)} tok/s` : '–');
const errText = (e) => (e && e.message ? e.message : String(e));
const nextFrame = () => new Promise((r) => setTimeout(r, 20));

// A panic (a bug in kvslice) aborts the wasm instance: it traps with a WebAssembly.RuntimeError
// and cannot be used again. Its panic hook has destroyed the WebGPU device, freeing the model's
// and the session's GPU memory; the page says so and stays disabled until reloaded.
let crashed = false;
function failed(id, what, e) {
  if (e instanceof WebAssembly.RuntimeError) {
    crashed = true;
    demo.crashed = errText(e);
    enable(false);
    setStatus(id, 'error', `${what}: kvslice crashed (${errText(e)}; the console has its message). Its GPU memory was freed; reload the page to go on.`);
    setStatus('gpu', 'error', 'The WebGPU device was released after a crash: reload the page.');
  } else {
    setStatus(id, 'error', `${what}: ${errText(e)}`);
  }
}
// The end-to-end test's way to check what a panic leaves behind.
demo.panicForTests = () => {
  try {
    kv.panicForTests();
  } catch (e) {
    failed('gen-status', 'Generation failed', e);
  }
};

function enable(on) {
  on = on && !crashed;
  for (const id of ['load-url', 'model-file', 'conformance']) $(id).disabled = !on;
  $('generate').disabled = !on || !demo.model;
}

// 1. WebGPU: present, an adapter, limits; then the wasm module and its device.
async function startGpu() {
  if (!('gpu' in navigator)) {
    const why = window.isSecureContext ? '' : ' (the page is not in a secure context: serve it over https or from 127.0.0.1/localhost)';
    setStatus('gpu', 'error', `WebGPU is not available in this browser${why}. Use a browser with WebGPU enabled (Chrome/Edge 113+, or Chromium on Linux with --enable-unsafe-webgpu).`);
    return;
  }
  let adapter;
  try {
    adapter = await navigator.gpu.requestAdapter();
  } catch (e) {
    adapter = null;
  }
  if (!adapter) {
    setStatus('gpu', 'error', 'WebGPU is present but offers no GPU adapter (blocked or unsupported GPU/driver): kvslice cannot run here.');
    return;
  }
  const limits = adapter.limits;
  const info = adapter.info || {};
  demo.gpu = {
    vendor: info.vendor || '',
    architecture: info.architecture || '',
    fallback: !!info.isFallbackAdapter,
    maxStorageBufferBindingSize: limits.maxStorageBufferBindingSize,
    maxBufferSize: limits.maxBufferSize,
  };
  // WebGPU guarantees 128 MiB bindings; the default model's largest tensor needs 108 MiB.
  const need = 108 * (1 << 20);
  if (limits.maxStorageBufferBindingSize < need || limits.maxBufferSize < need) {
    setStatus('gpu', 'error', `This GPU adapter's limits are too small: maxStorageBufferBindingSize ${mib(limits.maxStorageBufferBindingSize)}, maxBufferSize ${mib(limits.maxBufferSize)}; the default model needs ${mib(need)} in one buffer.`);
    return;
  }
  try {
    await init();
    demo.device = JSON.parse(await kv.openDevice());
  } catch (e) {
    setStatus('gpu', 'error', `Could not open the WebGPU device: ${errText(e)}`);
    return;
  }
  const d = demo.device;
  setStatus('gpu', 'ready', `WebGPU: ${d.name || demo.gpu.vendor + ' ' + demo.gpu.architecture}${demo.gpu.fallback ? ' (software fallback adapter)' : ''}; max storage binding ${mib(d.max_storage_buffer_binding_size)}, max buffer ${mib(d.max_buffer_size)}.`);
  for (const p of JSON.parse(kv.policies())) {
    const o = document.createElement('option');
    o.value = p.name;
    o.textContent = p.name;
    o.title = `${p.paper}\n${p.summary}`;
    $('policy').append(o);
  }
  enable(true);
}

// 2. Model bytes: Cache Storage first, else a download with progress, then stored.
async function readWithProgress(body, total) {
  const reader = body.getReader();
  const chunks = [];
  let got = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    chunks.push(value);
    got += value.length;
    if (total > 0) $('progress').value = got / total;
    setStatus('model-status', 'loading', `Downloading: ${mib(got)}${total > 0 ? ` of ${mib(total)}` : ''}`);
  }
  const bytes = new Uint8Array(got);
  let at = 0;
  for (const c of chunks) {
    bytes.set(c, at);
    at += c.length;
  }
  return bytes;
}

async function modelFromUrl(url) {
  const key = new URL(url, location.href).href;
  const cache = 'caches' in window ? await caches.open(MODEL_CACHE) : null;
  const cached = cache ? await cache.match(key) : null;
  if (cached) {
    setStatus('model-status', 'loading', 'Reading the model from the browser cache…');
    const bytes = await readWithProgress(cached.body, +cached.headers.get('content-length') || 0);
    return { bytes, source: 'browser cache' };
  }
  const resp = await fetch(key);
  if (!resp.ok) throw new Error(`${url}: HTTP ${resp.status} ${resp.statusText}`);
  const bytes = await readWithProgress(resp.body, +resp.headers.get('content-length') || 0);
  if (cache) {
    try {
      await cache.put(key, new Response(bytes, { headers: { 'content-type': 'application/octet-stream', 'content-length': String(bytes.length) } }));
    } catch (e) {
      console.warn(`not cached: ${errText(e)}`);
    }
  }
  return { bytes, source: 'network' };
}

async function loadBytes(what, getBytes) {
  if (busy) return;
  busy = true;
  enable(false);
  $('progress').value = 0;
  demo.model = null;
  setStatus('model-status', 'loading', `Loading ${what}…`);
  try {
    const t0 = performance.now();
    const { bytes, source } = await getBytes();
    $('progress').value = 1;
    setStatus('model-status', 'loading', `Parsing and uploading ${what} (${mib(bytes.length)}) to the GPU…`);
    await nextFrame();
    const t1 = performance.now();
    const config = JSON.parse(kv.loadModel(bytes));
    demo.model = { name: what, source, bytes: bytes.length, config, downloadMs: t1 - t0, uploadMs: performance.now() - t1 };
    setStatus('model-status', 'ready', `Loaded ${what} from ${source}: ${config.architecture}, ${config.layers} layers, ${config.heads} heads (${config.kv_heads} KV heads), ${(config.parameters / 1e6).toFixed(1)}M parameters; read in ${((t1 - t0) / 1000).toFixed(1)} s, uploaded in ${(demo.model.uploadMs / 1000).toFixed(1)} s.`);
  } catch (e) {
    failed('model-status', `Could not load ${what}`, e);
  } finally {
    busy = false;
    enable(true);
  }
}

// 3. Generation: streamed text, timings, memory and the heatmap after every token.
function drawHeat(step) {
  const canvas = $('heatmap');
  const ctx = canvas.getContext('2d');
  const { rows, width, mask } = step;
  const img = new ImageData(width, rows);
  for (let i = 0; i < rows * width; i++) {
    const kept = mask[i] === 1;
    img.data[4 * i] = kept ? 24 : 232;
    img.data[4 * i + 1] = kept ? 74 : 235;
    img.data[4 * i + 2] = kept ? 140 : 239;
    img.data[4 * i + 3] = 255;
  }
  const off = new OffscreenCanvas(width, rows);
  off.getContext('2d').putImageData(img, 0, 0);
  ctx.imageSmoothingEnabled = false;
  ctx.fillStyle = '#fff';
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  ctx.drawImage(off, 0, 0, canvas.width, canvas.height);
  // layer boundaries
  const kvHeads = demo.model ? demo.model.config.kv_heads : 1;
  ctx.strokeStyle = 'rgba(255,255,255,0.9)';
  ctx.lineWidth = 1;
  for (let r = kvHeads; r < rows; r += kvHeads) {
    const y = Math.round((r * canvas.height) / rows) + 0.5;
    ctx.beginPath();
    ctx.moveTo(0, y);
    ctx.lineTo(canvas.width, y);
    ctx.stroke();
  }
}

async function generate() {
  if (busy || !demo.model) return;
  busy = true;
  stopRequested = false;
  enable(false);
  $('stop').disabled = false;
  $('output').textContent = '';
  demo.lastOutcome = null;
  demo.lastTimings = null;
  const policy = $('policy').value;
  const budget = $('budget').value.trim();
  const maxNew = Math.max(1, parseInt($('max-new').value, 10) || 1);
  setStatus('gen-status', 'running', policy ? `Prefilling, then compressing with ${policy} at ${budget}…` : 'Prefilling…');
  const t0 = performance.now();
  let tFirst = 0;
  let tLast = 0;
  let steps = 0;
  let promptTokens = 0;
  try {
    await nextFrame();
    const outcome = JSON.parse(await kv.generate($('prompt').value, $('chat').checked, policy, budget, maxNew, (step) => {
      const now = performance.now();
      if (step.index === 0) {
        tFirst = now;
        promptTokens = step.width;
        $('s-prompt').textContent = `${promptTokens} tokens`;
        $('s-prefill').textContent = `${rate(promptTokens, tFirst - t0)} (${((tFirst - t0) / 1000).toFixed(2)} s${policy ? ', compression included' : ''})`;
        setStatus('gen-status', 'running', 'Decoding…');
      }
      tLast = now;
      steps = step.index + 1;
      $('output').textContent += step.text;
      $('s-generated').textContent = `${steps} tokens`;
      $('s-decode').textContent = steps > 1 ? rate(steps - 1, tLast - tFirst) : '–';
      $('s-memory').textContent = `${mib(step.bytes)} used of ${mib(step.fullBytes)} for the full cache (${((100 * step.entries) / Math.max(1, step.fullEntries)).toFixed(1)}% of ${step.fullEntries} entries); storage ${mib(step.storageBytes)}`;
      drawHeat(step);
      return !stopRequested;
    }));
    demo.lastOutcome = outcome;
    demo.lastTimings = {
      promptTokens,
      prefillMs: tFirst - t0,
      decodeSteps: Math.max(0, steps - 1),
      decodeMs: tLast - tFirst,
      prefillTokPerS: promptTokens / ((tFirst - t0) / 1000),
      decodeTokPerS: steps > 1 ? (steps - 1) / ((tLast - tFirst) / 1000) : null,
    };
    // The final text (whole characters) replaces the streamed one.
    $('output').textContent = outcome.text;
    const kept = outcome.kept_entries != null ? `; ${outcome.policy} kept ${outcome.kept_entries} of ${outcome.prompt_tokens * outcome.layers * outcome.kv_heads} prompt entries` : '';
    setStatus('gen-status', 'done', `Done: ${outcome.tokens.length} tokens${kept}.`);
  } catch (e) {
    failed('gen-status', 'Generation failed', e);
  } finally {
    busy = false;
    $('stop').disabled = true;
    enable(true);
  }
}

// 4. Kernel conformance on this device.
async function conformance() {
  if (busy) return;
  busy = true;
  enable(false);
  setStatus('conf-status', 'running', 'Running every kernel against its CPU twin…');
  const table = $('conf-results');
  table.textContent = '';
  try {
    await nextFrame();
    const t0 = performance.now();
    const results = JSON.parse(await kv.runConformance());
    demo.conformance = results;
    for (const r of results) {
      const tr = table.insertRow();
      tr.insertCell().textContent = r.kernel;
      tr.insertCell().textContent = r.case;
      const c = tr.insertCell();
      c.textContent = r.passed ? `pass (${r.checked} values)` : `FAIL: ${r.failure}`;
      c.className = r.passed ? 'pass' : 'fail';
    }
    const failed = results.filter((r) => !r.passed).length;
    const secs = ((performance.now() - t0) / 1000).toFixed(1);
    setStatus('conf-status', failed ? 'error' : 'done', `${results.length - failed} passed, ${failed} failed (${secs} s)`);
  } catch (e) {
    failed('conf-status', 'The kernel tests could not run', e);
  } finally {
    busy = false;
    enable(true);
  }
}

$('load-url').addEventListener('click', () => {
  const url = $('model-url').value.trim();
  loadBytes(url.split('/').pop() || url, () => modelFromUrl(url));
});
$('model-file').addEventListener('change', () => {
  const file = $('model-file').files[0];
  if (file) loadBytes(file.name, async () => ({ bytes: await readWithProgress(file.stream(), file.size), source: 'file' }));
});
$('generate').addEventListener('click', generate);
$('stop').addEventListener('click', () => {
  stopRequested = true;
});
$('conformance').addEventListener('click', conformance);
$('policy').addEventListener('change', () => {
  const o = $('policy').selectedOptions[0];
  $('policy-info').textContent = o && o.value ? o.title : 'Full cache: nothing is evicted.';
  $('budget').disabled = !o.value;
});
$('budget').disabled = true;

startGpu().catch((e) => setStatus('gpu', 'error', `Start-up failed: ${errText(e)}`));
