// Makes the screenshots of the chat page and dashboard in docs/images (light, dark, a phone):
//   node tests/web/screenshots.mjs --sieve build/sieve --out docs/images
// The bundled model writes noise, so the replies are shaped by a regular expression (reasoning,
// then markdown with a list and code); the dashboard is drawn after a minute of mixed load.
import fs from 'node:fs';
import path from 'node:path';
import { startServer, stopServer, parseArgs } from '../js/serve_lib.mjs';
import { findChromium, launch, newPage } from './web_lib.mjs';

const args = parseArgs(process.argv.slice(2));
const sieve = path.resolve(args.sieve || 'build/sieve');
const out = path.resolve(args.out || 'docs/images');
const loadSeconds = Number(args['load-seconds'] || 60);
fs.mkdirSync(out, { recursive: true });
const chromium = findChromium();
if (!chromium) throw new Error('no Chromium: install it (scripts/setup) or set SIEVE_CHROMIUM');

const SHAPE = '<think>[a-z ,]{40,70}</think>### [A-Z][a-z]{4,9} [a-z]{4,9}\n\n[A-Z][a-z ,]{30,50}\\.\n\n' +
  '- \\*\\*[A-Z][a-z]{3,8}\\*\\*: [a-z ,]{10,20}\n- \\*\\*[A-Z][a-z]{3,8}\\*\\*: [a-z ,]{10,20}\n\n' +
  '```python\ndef [a-z]{4,8}\\(n\\):\n    # [a-z ]{6,14}\n    return n \\* [0-9]{1,2} \\+ [0-9]{1,3}\n```\n';

const srv = await startServer(sieve, ['--reasoning-parser', 'minimax_m3', '--kv-cache-memory', '256MiB', '--seed', '3']);
const base = srv.base;

// Load for the dashboard: waves of streams sharing a long prefix (prefix-cache hits), some
// stopped early, at a varying concurrency.
async function load(seconds) {
  const shared = 'Call me Ishmael. Some years ago, never mind how long precisely, having little or no money ' +
    'in my purse, and nothing particular to interest me on shore, I thought I would sail about a little. ';
  const t0 = Date.now();
  let wave = 0;
  while (Date.now() - t0 < seconds * 1000) {
    const n = 2 + (wave % 5) * 2;
    await Promise.all(Array.from({ length: n }, (_, i) => fetch(`${base}/v1/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: shared.repeat(6) + `Chapter ${wave}.${i}.`, max_tokens: 40 + 20 * (i % 4), ignore_eos: true }),
    }).then((r) => r.text())));
    ++wave;
  }
}

async function chat(page) {
  await page.goto(`${base}/`);
  await page.waitForSelector('#server-state.up', { state: 'attached' });
  await page.evaluate((shape) => {
    localStorage.setItem('sieve.settings', JSON.stringify({ thinking: false, max_tokens: 400, extra: JSON.stringify({ structured_outputs: { regex: shape } }) }));
  }, SHAPE);
  await page.reload();
  await page.waitForSelector('#server-state.up', { state: 'attached' });
  for (const q of ['How should I cache a prompt prefix?', 'Show it as a small function.']) {
    await page.fill('#input', q);
    await page.press('#input', 'Enter');
    await page.waitForFunction(() => {
      const m = [...document.querySelectorAll('.msg.assistant')].pop();
      return m && m.dataset.state !== 'streaming';
    }, null, { timeout: 120000 });
    const state = await page.locator('.msg.assistant').last().getAttribute('data-state');
    if (state !== 'done') throw new Error(`the reply ended ${state}: ${await page.locator('.msg.assistant').last().textContent()}`);
  }
  await page.locator('.msg.assistant details.reasoning').last().evaluate((d) => { d.open = true; });
  await page.evaluate(() => { document.getElementById('messages').scrollTop = 1e9; });
}

const browser = await launch(chromium);
const views = [
  ['light', { viewport: { width: 1200, height: 760 }, colorScheme: 'light' }],
  ['dark', { viewport: { width: 1200, height: 760 }, colorScheme: 'dark' }],
  ['phone', { viewport: { width: 390, height: 780 }, colorScheme: 'light' }],
];
for (const [name, opts] of views) {
  const page = await newPage(browser, opts);
  await chat(page);
  await page.screenshot({ path: path.join(out, `chat-${name}.png`) });
  console.log(`wrote chat-${name}.png`);
  await page.context().close();
}
// The dashboard while the load still runs, so the gauges are not all zero.
const loading = load(loadSeconds + 40);
await new Promise((r) => setTimeout(r, loadSeconds * 1000));
for (const [name, opts] of views) {
  const tall = name === 'phone' ? opts : { ...opts, viewport: { width: 1200, height: 1040 } };
  const page = await newPage(browser, tall);
  await page.goto(`${base}/dashboard`);
  await page.selectOption('#dash-window', '60');
  await page.waitForSelector('[data-card="generated"] .value[data-value]');
  await page.waitForTimeout(2500);
  await page.screenshot({ path: path.join(out, `dashboard-${name}.png`) });
  console.log(`wrote dashboard-${name}.png`);
  await page.context().close();
}
await loading;
await browser.close();
await stopServer(srv);
