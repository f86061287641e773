// Helpers for the end-to-end server tests: start `sieve serve` on a free loopback port, wait
// for it, read /metrics, and a tiny check harness. Every wait is bounded.
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

export function ensureTinyModel(sieve, dir) {
  if (!fs.existsSync(path.join(dir, 'config.json')) || !fs.existsSync(path.join(dir, 'tokenizer.json'))) {
    fs.mkdirSync(dir, { recursive: true });
    execFileSync(sieve, ['make-tiny-model', '--out', dir], { stdio: 'inherit' });
  }
  return dir;
}

export async function startServer(sieve, args, { env = {}, timeoutMs = 60000 } = {}) {
  // The CPU suite runs the CPU backend even on a machine with a GPU (the GPU has its own tests).
  const device = args.includes('--device') ? [] : ['--device', 'cpu'];
  const proc = spawn(sieve, ['serve', '--port', '0', ...device, ...args], {
    env: { ...process.env, SIEVE_API_KEY: '', VLLM_API_KEY: '', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let log = '';
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not start in ${timeoutMs} ms:\n${log}`)), timeoutMs);
    const onData = (d) => {
      log += d.toString();
      const m = log.match(/on http:\/\/[^:]+:(\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    };
    proc.stdout.on('data', onData);
    proc.stderr.on('data', onData);
    proc.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`server exited with ${code} before listening:\n${log}`));
    });
  });
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  proc.stdout.on('data', (d) => { log += d.toString(); });
  proc.stderr.on('data', (d) => { log += d.toString(); });
  return { proc, port, base: `http://127.0.0.1:${port}`, exited, log: () => log };
}

export async function stopServer(srv, timeoutMs = 10000) {
  srv.proc.kill('SIGTERM');
  const t0 = Date.now();
  const r = await Promise.race([srv.exited, new Promise((res) => setTimeout(() => res(null), timeoutMs))]);
  if (r === null) {
    srv.proc.kill('SIGKILL');
    throw new Error(`server did not exit within ${timeoutMs} ms of SIGTERM`);
  }
  return { ...r, ms: Date.now() - t0 };
}

export async function metrics(base) {
  const text = await (await fetch(`${base}/metrics`)).text();
  const out = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = line.match(/^([a-zA-Z_:]+)(\{[^}]*\})?\s+(\S+)$/);
    if (m && !(m[1] in out)) out[m[1]] = Number(m[3]);
  }
  return out;
}

// Waits until the engine is idle: nothing running or waiting and every block free.
export async function waitIdle(base, timeoutMs = 10000) {
  const t0 = Date.now();
  let m;
  while (Date.now() - t0 < timeoutMs) {
    m = await metrics(base);
    if (m['sieve:num_requests_running'] === 0 && m['sieve:num_requests_waiting'] === 0 &&
        m['sieve:kv_cache_blocks_free'] === m['sieve:kv_cache_blocks_total']) return m;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`engine not idle after ${timeoutMs} ms: ${JSON.stringify(m)}`);
}

let failures = 0;
let checks = 0;
export function check(cond, what, detail) {
  ++checks;
  if (!cond) {
    ++failures;
    console.log(`FAIL ${what}${detail !== undefined ? ': ' + (typeof detail === 'string' ? detail : JSON.stringify(detail)) : ''}`);
  }
}
export function eq(a, b, what) {
  const ja = JSON.stringify(a), jb = JSON.stringify(b);
  check(ja === jb, what, `got ${ja.slice(0, 400)} expected ${jb.slice(0, 400)}`);
}
// Runs one named part of a test; `onFail(name)` (optional) may save what helps (a screenshot).
export async function section(name, fn, onFail) {
  const t0 = Date.now();
  const before = failures;
  try {
    await fn();
  } catch (e) {
    ++failures;
    console.log(`FAIL ${name}: threw ${e && e.stack ? e.stack : e}`);
  }
  if (failures !== before && onFail) {
    try {
      await onFail(name);
    } catch (e) {
      console.log(`  (could not save the failure's evidence: ${e.message})`);
    }
  }
  console.log(`${failures === before ? 'ok  ' : 'FAIL'} ${name} (${Date.now() - t0} ms)`);
}
export function summary() {
  console.log(`${checks} checks, ${failures} failed`);
  return failures === 0 ? 0 : 1;
}

export function parseArgs(argv) {
  const a = {};
  for (let i = 0; i < argv.length; ++i) {
    if (argv[i].startsWith('--')) a[argv[i].slice(2)] = argv[i + 1], ++i;
  }
  return a;
}
