// End-to-end cache exhaustion: more concurrent long requests than the KV cache holds. They are
// preempted (recomputed) and resumed, and every one completes with the tokens it gets alone.
//   node tests/js/serve_preemption_e2e.mjs --sieve build/sieve --workdir /tmp/sieve-e2e
import OpenAI from 'openai';
import fs from 'node:fs';
import path from 'node:path';
import { ensureTinyModel, startServer, stopServer, metrics, waitIdle, check, eq, section, summary, parseArgs } from './serve_lib.mjs';

const args = parseArgs(process.argv.slice(2));
const sieve = path.resolve(args.sieve || 'build/sieve');
const work = path.resolve(args.workdir || '/tmp/sieve-serve-e2e');
fs.mkdirSync(work, { recursive: true });
const model = ensureTinyModel(sieve, path.join(work, 'tiny-model'));

// About 6 blocks of 128 tokens: two of the requests below fit at a time. No prefix caching: its
// outputs are the reference for the server that reuses blocks, below.
const srv = await startServer(sieve, ['--model', model, '--served-model-name', 'tiny', '--kv-cache-memory', '2MiB',
  '--max-model-len', '512', '--max-num-batched-tokens', '256', '--max-num-seqs', '16', '--no-enable-prefix-caching']);
const client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
const idsOf = (r) => r.choices[0].logprobs.tokens.map((t) => Number(t.replace('token_id:', '')));

await section('more concurrent requests than the cache holds: preempted, resumed, correct', async () => {
  const m0 = await metrics(srv.base);
  const total = m0['sieve:kv_cache_blocks_total'];
  check(total >= 3 && total <= 8, 'a small cache', total);
  const jobs = [...Array(8).keys()].map((i) => ({
    model: 'tiny',
    prompt: [...Array(180 + 7 * i).keys()].map((k) => (k * 31 + i * 17) % 500),
    max_tokens: 150,
    ignore_eos: true,
    logprobs: 0,
    return_tokens_as_token_ids: true,
    ...(i % 2 ? { temperature: 0 } : { temperature: 0.9, seed: 100 + i }),
  }));
  const need = jobs.reduce((a, j) => a + Math.ceil((j.prompt.length + j.max_tokens) / 128), 0);
  check(need > 2 * total, 'the requests need far more blocks than exist', { need, total });
  const solo = [];
  for (const j of jobs) solo.push(idsOf(await client.completions.create(j)));
  const streams = jobs.map(async (j) => {
    const s = await client.completions.create({ ...j, stream: true });
    const ids = [];
    let finish = null;
    for await (const c of s) {
      if (!c.choices.length) continue;
      if (c.choices[0].logprobs) ids.push(...c.choices[0].logprobs.tokens.map((t) => Number(t.replace('token_id:', ''))));
      if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
    }
    return { ids, finish };
  });
  const res = await Promise.all(streams);
  res.forEach((r, i) => {
    eq(r.finish, 'length', `request ${i} finished`);
    eq(r.ids, solo[i], `request ${i} tokens equal its solo run`);
  });
  const m = await waitIdle(srv.base);
  check(m['sieve:num_preemptions_total'] > m0['sieve:num_preemptions_total'], 'requests were preempted', m['sieve:num_preemptions_total']);
  eq(m['sieve:kv_cache_blocks_free'], total, 'every block free at the end');
  eq((await fetch(`${srv.base}/health`)).status, 200, 'healthy');
});

// The same long prompts, greedy, on the cache-starved server above (no prefix caching) are the
// reference for a server that reuses prefix blocks (KV and index keys together).
const shared = [...Array(300).keys()].map((k) => (k * 13 + 5) % 500);
const variants = [0, 1, 2].map((v) => [...shared, 7 + v, 11 * v + 3, 42]);
const job = (prompt) => ({ model: 'tiny', prompt, max_tokens: 40, temperature: 0, ignore_eos: true, logprobs: 0, return_tokens_as_token_ids: true });
const reference = [];
await section('reference outputs without prefix caching', async () => {
  for (const p of variants) reference.push(idsOf(await client.completions.create(job(p))));
});
const r = await stopServer(srv);
eq(r.code, 0, 'clean exit');

const pc = await startServer(sieve, ['--model', model, '--served-model-name', 'tiny', '--kv-cache-memory', '8MiB',
  '--max-model-len', '1024', '--enable-prefix-caching', '--enforce-eager']);
const pclient = new OpenAI({ baseURL: `${pc.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
await section('prefix caching reuses blocks without changing outputs', async () => {
  const first = idsOf(await pclient.completions.create(job(variants[0])));
  eq(first, reference[0], 'first request (cold cache)');
  const m0 = await metrics(pc.base);
  const again = await Promise.all(variants.map((p) => pclient.completions.create(job(p))));
  again.forEach((a, i) => eq(idsOf(a), reference[i], `variant ${i} with cached prefix blocks`));
  const m1 = await waitIdle(pc.base);
  // Each of the three requests finds the two full blocks of the shared 300-token prefix.
  check(m1['sieve:prefix_cache_hits_total'] - m0['sieve:prefix_cache_hits_total'] >= 3 * 256, 'prefix cache hits',
    m1['sieve:prefix_cache_hits_total'] - m0['sieve:prefix_cache_hits_total']);
});
const r2 = await stopServer(pc);
eq(r2.code, 0, 'clean exit (prefix caching server)');
process.exit(summary());
