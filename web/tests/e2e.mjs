// End-to-end test of the browser demo in Debian's headless Chromium, WebGPU on the CPU through
// SwiftShader. Run by `scripts/web.sh test`, which builds web/pkg and serves web/ on 127.0.0.1:
//   node web/tests/e2e.mjs --url http://127.0.0.1:PORT/ --cli target/debug/kvslice --artifacts web/artifacts
// Checks: the page finds WebGPU; a corrupt model file gives a message; the default model loads
// (and comes from the browser's cache the second time); short greedy generations, with the full
// cache and with eviction policies, equal the native CLI's output for the same prompt; the
// kernel conformance suite passes on the page's device; a panic destroys the page's WebGPU device
// (freeing its memory) and the page asks for a reload. Leaves a screenshot and the measured
// numbers (results.json) in the artifacts folder.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';

const arg = (name, fallback) => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : fallback;
};
const url = arg('url');
const cli = arg('cli', 'target/debug/kvslice');
const artifacts = arg('artifacts', 'web/artifacts');
const chromiumPath = arg('chromium', '/usr/bin/chromium');
if (!url) throw new Error('--url is required');
fs.mkdirSync(artifacts, { recursive: true });

// Short, because WebGPU on SwiftShader is slow (see docs/BENCHMARKS.md): 22 prompt tokens, 5 new ones, and
// policies that need no observation window longer than the prompt.
const PROMPT = 'The Eiffel Tower is in Paris. The Colosseum is in Rome. The Brandenburg Gate is in';
const MAX_NEW = 5;
// Full cache, a one-shot policy (key norms) and a decode-time one (StreamingLLM: the cache keeps
// its size while decoding, so the kept positions change with every token).
const CASES = [
  { policy: '', budget: '' },
  { policy: 'knorm', budget: '50%' },
  { policy: 'streaming-llm', budget: '50%' },
];

let passed = 0;
let failed = 0;
const results = { url, prompt: PROMPT, max_new_tokens: MAX_NEW, generations: [], checks: [] };

function check(name, ok, detail = '') {
  results.checks.push({ name, ok, detail });
  if (ok) {
    passed++;
    console.log(`ok - ${name}${detail ? ` (${detail})` : ''}`);
  } else {
    failed++;
    console.log(`FAILED - ${name}${detail ? `: ${detail}` : ''}`);
  }
}

/**
 * The native CLI's greedy text for the same prompt (stdout without its final newline), on Burn's
 * CPU backend: an independent reference for the page's WebGPU kernels, and seconds instead of a
 * minute per case on lavapipe.
 */
function nativeText(policy, budget) {
  const args = ['generate', '--device', 'cpu', '--prompt', PROMPT, '--max-new-tokens', String(MAX_NEW)];
  if (policy) args.push('--policy', policy, '--budget', budget);
  const t0 = performance.now();
  const out = execFileSync(cli, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], maxBuffer: 1 << 20 });
  return { text: out.replace(/\n$/, ''), ms: performance.now() - t0 };
}

const wait = (page, id, states, timeout) =>
  page.waitForFunction(
    ([i, s]) => s.includes(document.getElementById(i).dataset.state),
    [id, states],
    { timeout, polling: 250 },
  );
// Buttons that start long work are clicked from inside the page: the work keeps the page's main
// thread busy between GPU round trips, and playwright's click waits for the page to answer.
const press = (page, id) => page.$eval(`#${id}`, (b) => b.click());
const state = (page, id) => page.$eval(`#${id}`, (e) => ({ state: e.dataset.state, text: e.textContent }));

async function loadDefaultModel(page) {
  await press(page, 'load-url');
  await wait(page, 'model-status', ['ready', 'error'], 15 * 60_000);
  return page.evaluate(() => window.kvsliceDemo.model);
}

const userDataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'kvslice-chromium-'));
const context = await chromium.launchPersistentContext(userDataDir, {
  executablePath: chromiumPath,
  headless: true,
  viewport: { width: 1100, height: 1500 },
  args: [
    '--enable-unsafe-webgpu',
    '--no-sandbox',
    '--disable-quic',
    '--no-first-run',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
  ],
});
const console_lines = [];
try {
  // Every WebGPU device the page opens, to see what becomes of it after a panic.
  await context.addInitScript(() => {
    window.__gpuDevices = [];
    if (!('gpu' in navigator)) return;
    const request = GPUAdapter.prototype.requestDevice;
    GPUAdapter.prototype.requestDevice = async function (...args) {
      const device = await request.apply(this, args);
      const entry = { lost: null };
      device.lost.then((info) => {
        entry.lost = info.reason;
      });
      window.__gpuDevices.push(entry);
      return device;
    };
  });
  const page = await context.newPage();
  page.setDefaultTimeout(180_000);
  page.on('console', (m) => console_lines.push(`${m.type()}: ${m.text()}`));
  page.on('pageerror', (e) => console_lines.push(`pageerror: ${e.message}`));
  await page.goto(url);

  // 1. WebGPU
  await wait(page, 'gpu', ['ready', 'error'], 120_000);
  const gpu = await state(page, 'gpu');
  check('WebGPU device opened', gpu.state === 'ready', gpu.text);
  if (gpu.state !== 'ready') throw new Error(`no WebGPU: ${gpu.text}`);
  results.device = await page.evaluate(() => ({ ...window.kvsliceDemo.device, adapter: window.kvsliceDemo.gpu }));

  // 2. A corrupt model file is refused with a message.
  await page.setInputFiles('#model-file', { name: 'corrupt.gguf', mimeType: 'application/octet-stream', buffer: Buffer.from('GGUF\x03\x00\x00\x00garbage that is not a model') });
  await wait(page, 'model-status', ['ready', 'error'], 60_000);
  const corrupt = await state(page, 'model-status');
  check('a corrupt model file shows an error', corrupt.state === 'error' && /invalid GGUF model/.test(corrupt.text), corrupt.text);
  await page.setInputFiles('#model-file', { name: 'notes.gguf', mimeType: 'text/plain', buffer: Buffer.from('hello') });
  await wait(page, 'model-status', ['ready', 'error'], 60_000);
  const notGguf = await state(page, 'model-status');
  check('a non-GGUF file shows an error', notGguf.state === 'error' && /not a GGUF file/.test(notGguf.text), notGguf.text);

  // 3. The default model, downloaded with progress.
  const model = await loadDefaultModel(page);
  const ms = await state(page, 'model-status');
  check('the default model loads from the server', ms.state === 'ready' && model && model.source === 'network', ms.text);
  if (ms.state !== 'ready') throw new Error(ms.text);
  results.model = model;

  // 4. Generations equal the native CLI's.
  for (const c of CASES) {
    const label = c.policy ? `${c.policy}@${c.budget}` : 'full cache';
    const native = nativeText(c.policy, c.budget);
    await page.fill('#prompt', PROMPT);
    await page.selectOption('#policy', c.policy);
    if (c.policy) await page.fill('#budget', c.budget);
    await page.fill('#max-new', String(MAX_NEW));
    await press(page, 'generate');
    await wait(page, 'gen-status', ['done', 'error'], 20 * 60_000);
    const st = await state(page, 'gen-status');
    const { outcome, timings, shown } = await page.evaluate(() => ({
      outcome: window.kvsliceDemo.lastOutcome,
      timings: window.kvsliceDemo.lastTimings,
      shown: document.getElementById('output').textContent,
    }));
    if (st.state !== 'done') {
      check(`generation (${label})`, false, st.text);
      continue;
    }
    const same = outcome.text === native.text;
    check(`browser text equals the native CLI's (${label})`, same, same ? JSON.stringify(outcome.text) : `browser ${JSON.stringify(outcome.text)} vs native ${JSON.stringify(native.text)}`);
    check(`the page shows the generated text (${label})`, shown === outcome.text);
    if (c.policy) {
      const full = outcome.prompt_tokens * outcome.layers * outcome.kv_heads;
      check(`${label} keeps fewer entries than the full cache`, outcome.kept_entries > 0 && outcome.kept_entries < full, `${outcome.kept_entries} of ${full}`);
    }
    results.generations.push({ label, text: outcome.text, native: native.text, tokens: outcome.tokens.length, prompt_tokens: outcome.prompt_tokens, kept_entries: outcome.kept_entries, memory: outcome.memory, timings, native_cli_ms: native.ms });
    console.log(`  ${label}: prefill ${timings.prefillTokPerS.toFixed(2)} tok/s, decode ${timings.decodeTokPerS ? timings.decodeTokPerS.toFixed(2) : '-'} tok/s`);
  }
  await page.screenshot({ path: path.join(artifacts, 'e2e.png'), fullPage: true });

  // 5. Kernel conformance on the page's device.
  await press(page, 'conformance');
  await wait(page, 'conf-status', ['done', 'error'], 15 * 60_000);
  const conf = await state(page, 'conf-status');
  const suite = await page.evaluate(() => window.kvsliceDemo.conformance);
  const bad = (suite || []).filter((r) => !r.passed);
  check('kernel conformance suite passes in the browser', conf.state === 'done' && suite && suite.length > 0 && bad.length === 0, bad.length ? bad.map((r) => `${r.kernel} [${r.case}]: ${r.failure}`).join('; ') : conf.text);
  // The page runs the same cases as the native suite (`kvslice conformance`), none skipped.
  const native = JSON.parse(execFileSync(cli, ['conformance', '--json'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], maxBuffer: 1 << 20 }));
  const key = (r) => `${r.kernel} [${r.case}]`;
  const missing = native.map(key).filter((k) => !(suite || []).some((r) => key(r) === k));
  check('the browser runs every case of the native suite', suite && missing.length === 0 && suite.length === native.length, missing.length ? `missing: ${missing.join('; ')}` : `${suite ? suite.length : 0} of ${native.length} cases`);
  results.conformance = suite;
  await page.screenshot({ path: path.join(artifacts, 'e2e-conformance.png'), fullPage: true });

  // 6. A second visit reads the model from the browser's cache.
  await page.reload();
  await wait(page, 'gpu', ['ready', 'error'], 120_000);
  const again = await loadDefaultModel(page);
  check('the model comes from the browser cache the second time', again && again.source === 'browser cache', again ? again.source : (await state(page, 'model-status')).text);

  // 7. A panic (last: the page is unusable after it) frees the GPU memory the aborted wasm
  // instance still holds (the loaded model's weights): its WebGPU device is destroyed, and the
  // page says to reload.
  const before = await page.evaluate(() => window.__gpuDevices.map((d) => d.lost));
  await page.evaluate(() => window.kvsliceDemo.panicForTests());
  await page.waitForFunction(() => window.__gpuDevices.some((d) => d.lost !== null), null, { timeout: 30_000 }).catch(() => {});
  const after = await page.evaluate(() => window.__gpuDevices.map((d) => d.lost));
  const crash = await state(page, 'gen-status');
  check('a panic destroys the WebGPU device (its memory freed)', before.length > 0 && before.every((r) => r === null) && after.some((r) => r === 'destroyed'), `devices lost before: ${JSON.stringify(before)}, after: ${JSON.stringify(after)}`);
  check('the page tells the user to reload after a panic', crash.state === 'error' && /reload the page/.test(crash.text) && (await page.$eval('#generate', (b) => b.disabled)), crash.text);
  check('the panic message reaches the console', console_lines.some((l) => l.includes('panic requested by the end-to-end test') && l.includes('destroyed')), '');
} catch (e) {
  check('the test ran to its end', false, e.stack || String(e));
} finally {
  results.console = console_lines;
  fs.writeFileSync(path.join(artifacts, 'results.json'), JSON.stringify(results, null, 2));
  await context.close();
  fs.rmSync(userDataDir, { recursive: true, force: true });
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 && passed > 0 ? 0 : 1);
