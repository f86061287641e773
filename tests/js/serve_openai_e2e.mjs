// End-to-end: the real `sieve serve` on a loopback port, driven by the official `openai` client
// (and raw fetch for malformed requests). Usage:
//   node tests/js/serve_openai_e2e.mjs --sieve build/sieve --workdir /tmp/sieve-e2e
import OpenAI from 'openai';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { ensureTinyModel, startServer, stopServer, metrics, waitIdle, check, eq, section, summary, parseArgs } from './serve_lib.mjs';

const args = parseArgs(process.argv.slice(2));
const sieve = path.resolve(args.sieve || 'build/sieve');
const work = path.resolve(args.workdir || '/tmp/sieve-serve-e2e');
fs.mkdirSync(work, { recursive: true });
const model = ensureTinyModel(sieve, path.join(work, 'tiny-model'));
const KEY = 'sk-e2e-secret';
const NAME = 'tiny';
const MAX_LEN = 1024;
const profiles = path.join(work, 'profiles');
fs.rmSync(profiles, { recursive: true, force: true });

const srv = await startServer(sieve, ['--model', model, '--served-model-name', NAME, '--api-key', KEY,
  '--kv-cache-memory', '64MiB', '--max-model-len', String(MAX_LEN), '--max-request-bytes', '1MiB',
  '--max-num-batched-tokens', '256', '--profiler-dir', profiles, '--trust-remote-code',
  '--enable-auto-tool-choice', '--tool-call-parser', 'minimax_m3']);
const client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: KEY, maxRetries: 0, timeout: 120000 });

const idsOf = (lp) => lp.tokens.map((t) => Number(t.replace('token_id:', '')));
const greedy = { temperature: 0, ignore_eos: true };

async function complete(prompt, max_tokens, extra = {}) {
  return client.completions.create({ model: NAME, prompt, max_tokens, ...greedy, ...extra });
}
async function streamText(params) {
  const stream = await client.completions.create({ model: NAME, stream: true, ...params });
  let text = '';
  let finish = null;
  for await (const c of stream) {
    if (c.choices.length) {
      text += c.choices[0].text;
      if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
    }
  }
  return { text, finish };
}

await section('models', async () => {
  const list = await client.models.list();
  eq(list.data.map((m) => m.id), [NAME], 'served model name');
  eq(list.data[0].max_model_len, MAX_LEN, 'max_model_len');
});

await section('greedy through the server equals sieve generate', async () => {
  const prompt = [5, 17, 99, 260, 3, 42, 7, 128, 300, 11];
  const n = 24;
  const r = await complete(prompt, n, { logprobs: 1, return_tokens_as_token_ids: true });
  eq(r.object, 'text_completion', 'object');
  check(r.id.startsWith('cmpl-'), 'id prefix', r.id);
  eq(r.model, NAME, 'model');
  check(Number.isInteger(r.created), 'created');
  eq([r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens], [prompt.length, n, prompt.length + n], 'usage');
  eq(r.choices[0].finish_reason, 'length', 'finish_reason');
  const gen = JSON.parse(execFileSync(sieve, ['generate', '--device', 'cpu', '--model', model, '--prompt-ids', prompt.join(','),
    '--max-tokens', String(n), '--temperature', '0', '--ignore-eos', '--json']).toString());
  eq(idsOf(r.choices[0].logprobs), gen.token_ids, 'token ids equal sieve generate');
  const lp = r.choices[0].logprobs.token_logprobs;
  check(lp.every((v, i) => Math.abs(v - gen.logprobs[i]) < 1e-3), 'logprobs equal sieve generate', { lp, gen: gen.logprobs });
});

let greedyText = '';
await section('completions: streaming equals non-streaming; text prompts', async () => {
  const r = await complete('Once upon a time', 40);
  greedyText = r.choices[0].text;
  check(r.usage.completion_tokens === 40, 'completion tokens', r.usage);
  const s = await streamText({ prompt: 'Once upon a time', max_tokens: 40, ...greedy });
  eq(s.text, greedyText, 'streamed text');
  eq(s.finish, 'length', 'stream finish_reason');
  const echo = await complete('Once upon a time', 5, { echo: true });
  check(echo.choices[0].text.startsWith('Once upon a time'), 'echo prepends the prompt', echo.choices[0].text);
  const echoed = await streamText({ prompt: 'Once upon a time', max_tokens: 5, echo: true, ...greedy });
  eq(echoed.text, echo.choices[0].text, 'streamed echo');
});

await section('chat: streaming and not, include_usage', async () => {
  const messages = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Say something.' }];
  const r = await client.chat.completions.create({ model: NAME, messages, max_tokens: 12, ...greedy });
  eq(r.object, 'chat.completion', 'object');
  check(r.id.startsWith('chatcmpl-'), 'id prefix', r.id);
  eq(r.choices[0].message.role, 'assistant', 'role');
  eq(r.choices[0].finish_reason, 'length', 'finish_reason');
  eq(r.usage.completion_tokens, 12, 'completion tokens');
  const stream = await client.chat.completions.create({ model: NAME, messages, max_tokens: 12, stream: true,
    stream_options: { include_usage: true }, ...greedy });
  let content = '';
  let first = null, finish = null, usage = null, chunks = 0;
  for await (const c of stream) {
    ++chunks;
    eq(c.object, 'chat.completion.chunk', 'chunk object');
    if (c.usage) { usage = c.usage; eq(c.choices, [], 'usage chunk has no choices'); }
    if (!c.choices.length) continue;
    if (first === null) first = c.choices[0].delta;
    content += c.choices[0].delta.content || '';
    if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
  }
  eq(first && first.role, 'assistant', 'first delta carries the role');
  eq(content, r.choices[0].message.content, 'streamed content equals non-streamed');
  eq(finish, 'length', 'stream finish_reason');
  eq(usage, r.usage, 'stream usage equals non-stream usage');
  // Content parts are joined; the result is the same prompt.
  const parts = await client.chat.completions.create({ model: NAME, max_tokens: 12, ...greedy,
    messages: [messages[0], { role: 'user', content: [{ type: 'text', text: 'Say something.' }] }] });
  eq(parts.choices[0].message.content, r.choices[0].message.content, 'content parts');
});

await section('logprobs', async () => {
  // Token ids as names, so that alternatives that decode to the same text stay apart.
  const r = await complete('The', 8, { logprobs: 3, return_tokens_as_token_ids: true });
  const lp = r.choices[0].logprobs;
  const named = await complete('The', 8, { logprobs: 3 });
  eq(named.choices[0].text, r.choices[0].text, 'same text either way');
  check(named.choices[0].logprobs.tokens.every((t) => typeof t === 'string' && !t.startsWith('token_id:')), 'token strings');
  eq(lp.tokens.length, 8, 'one entry per token');
  check(lp.token_logprobs.every((v) => v <= 0 && Number.isFinite(v)), 'log probabilities', lp.token_logprobs);
  check(lp.top_logprobs.every((t) => Object.keys(t).length === 3), 'top_logprobs size', lp.top_logprobs);
  // Greedy picks the most likely raw token: its logprob is the best alternative's.
  lp.top_logprobs.forEach((t, i) => check(Math.abs(Math.max(...Object.values(t)) - lp.token_logprobs[i]) < 1e-6, `greedy token is top-1 at ${i}`));
  const c = await client.chat.completions.create({ model: NAME, max_tokens: 6, ...greedy, logprobs: true, top_logprobs: 2,
    messages: [{ role: 'user', content: 'hi' }] });
  const content = c.choices[0].logprobs.content;
  eq(content.length, 6, 'chat logprobs entries');
  for (const e of content) {
    eq(e.top_logprobs.length, 2, 'chat top_logprobs count');
    check(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob, 'sorted');
    check(Math.abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6, 'chat greedy token is top-1');
    check(Array.isArray(e.bytes), 'bytes');
  }
  let sawLp = 0;
  const stream = await client.chat.completions.create({ model: NAME, max_tokens: 6, ...greedy, logprobs: true, top_logprobs: 1,
    messages: [{ role: 'user', content: 'hi' }], stream: true });
  for await (const ch of stream) if (ch.choices.length && ch.choices[0].logprobs) sawLp += ch.choices[0].logprobs.content.length;
  eq(sawLp, 6, 'streamed chat logprobs');
});

await section('stop strings (across tokens, excluded from the output)', async () => {
  // A two-character stop string whose first occurrence straddles a token boundary: the prefix
  // text of every token count comes from /detokenize.
  const prompt = 'Once upon a time';
  const r0 = await complete(prompt, 80, { logprobs: 0, return_tokens_as_token_ids: true });
  const full = r0.choices[0].text;
  const ids = idsOf(r0.choices[0].logprobs);
  const clean = (c) => c && c >= '!' && c <= '~';
  let stop = null;
  for (let k = 1; k < ids.length && stop === null; ++k) {
    const prefix = (await raw('POST', '/detokenize', { tokens: ids.slice(0, k) })).json.prompt;
    const b = prefix.length;
    if (!full.startsWith(prefix) || b < 1 || b >= full.length) continue;
    const cand = full.slice(b - 1, b + 1);
    if (clean(cand[0]) && clean(cand[1]) && full.indexOf(cand) === b - 1) stop = cand;
  }
  check(stop !== null, 'found a stop string across a token boundary', full);
  if (stop === null) return;
  const expected = full.slice(0, full.indexOf(stop));
  const r = await complete(prompt, 80, { stop: [stop, 'never-appears-123'] });
  eq(r.choices[0].text, expected, 'text before the stop string');
  eq(r.choices[0].finish_reason, 'stop', 'finish_reason stop');
  eq(r.choices[0].stop_reason, stop, 'stop_reason');
  check(r.usage.completion_tokens < 80, 'generation ended at the stop string', r.usage);
  const s = await streamText({ prompt, max_tokens: 80, ...greedy, stop });
  eq(s.text, expected, 'streamed text before the stop string');
  eq(s.finish, 'stop', 'streamed finish_reason');
  const inc = await complete(prompt, 80, { stop, include_stop_str_in_output: true });
  eq(inc.choices[0].text, expected + stop, 'include_stop_str_in_output');
  await waitIdle(srv.base);
});

await section('stop token ids, min_tokens, ignore_eos', async () => {
  const prompt = [9, 8, 7, 6, 5];
  const base = idsOf((await complete(prompt, 20, { logprobs: 0, return_tokens_as_token_ids: true })).choices[0].logprobs);
  const stopId = base[5];
  const first = base.indexOf(stopId);
  const r = await complete(prompt, 20, { stop_token_ids: [stopId], logprobs: 0, return_tokens_as_token_ids: true });
  eq(idsOf(r.choices[0].logprobs), base.slice(0, first + 1), 'ends with the stop token');
  eq(r.choices[0].finish_reason, 'stop', 'finish_reason');
  eq(r.choices[0].stop_reason, stopId, 'stop_reason is the token id');
  const s = await client.completions.create({ model: NAME, prompt, max_tokens: 20, ...greedy, stop_token_ids: [stopId], stream: true });
  let finish = null, stopReason;
  for await (const c of s) if (c.choices.length && c.choices[0].finish_reason) { finish = c.choices[0].finish_reason; stopReason = c.choices[0].stop_reason; }
  eq([finish, stopReason], ['stop', stopId], 'streamed stop token');
  const m = await complete(prompt, 20, { stop_token_ids: [stopId], min_tokens: first + 3, logprobs: 0, return_tokens_as_token_ids: true });
  const mi = idsOf(m.choices[0].logprobs);
  check(mi.length >= first + 3, 'min_tokens holds the stop token back', mi);
  check(mi.slice(0, first + 2).every((t) => t !== stopId), 'no stop token before min_tokens', mi);
});

await section('logit_bias', async () => {
  const prompt = [9, 8, 7, 6, 5];
  const base = idsOf((await complete(prompt, 8, { logprobs: 0, return_tokens_as_token_ids: true })).choices[0].logprobs);
  const forced = 41;
  const r = await complete(prompt, 8, { logit_bias: { [forced]: 100 }, logprobs: 0, return_tokens_as_token_ids: true });
  eq(idsOf(r.choices[0].logprobs), Array(8).fill(forced), 'a +100 bias forces its token at every step');
  const b = await complete(prompt, 8, { logit_bias: { [base[0]]: -100 }, logprobs: 0, return_tokens_as_token_ids: true });
  check(idsOf(b.choices[0].logprobs)[0] !== base[0], 'a -100 bias removes the greedy token', { base, got: idsOf(b.choices[0].logprobs) });
  const c = await client.chat.completions.create({ model: NAME, messages: [{ role: 'user', content: 'hi' }], max_tokens: 4,
    ...greedy, logit_bias: { [forced]: 100 }, logprobs: true });
  eq(c.choices[0].logprobs.content.length, 4, 'chat honours logit_bias too');
});

await section('n completions a prompt, and batches of prompts', async () => {
  // Greedy: every sample of a prompt is its greedy completion.
  const one = await complete([9, 8, 7, 6, 5], 6, { logprobs: 0, return_tokens_as_token_ids: true });
  const many = await complete([9, 8, 7, 6, 5], 6, { n: 3, logprobs: 0, return_tokens_as_token_ids: true });
  eq(many.choices.map((c) => c.index), [0, 1, 2], 'choice indices');
  for (const c of many.choices) eq(idsOf(c.logprobs), idsOf(one.choices[0].logprobs), `greedy sample ${c.index}`);
  eq([many.usage.prompt_tokens, many.usage.completion_tokens], [5, 18], 'usage: the prompt once, every sample\'s tokens');
  // Seeded: sample j draws with seed + j, so it equals a request with that seed.
  const p = { prompt: 'Seeds:', max_tokens: 10, temperature: 1.0, ignore_eos: true };
  const s = await client.completions.create({ model: NAME, ...p, n: 3, seed: 77 });
  for (let j = 0; j < 3; ++j) {
    const alone = await client.completions.create({ model: NAME, ...p, seed: 77 + j });
    eq(s.choices[j].text, alone.choices[0].text, `seeded sample ${j} equals seed ${77 + j}`);
  }
  // A batch: choice i * n + j is sample j of prompt i.
  const b = await client.completions.create({ model: NAME, prompt: ['Call me', [9, 8, 7, 6, 5]], max_tokens: 6, ...greedy, n: 2,
    logprobs: 0, return_tokens_as_token_ids: true });
  eq(b.choices.map((c) => c.index), [0, 1, 2, 3], 'batch choice indices');
  eq(idsOf(b.choices[2].logprobs), idsOf(one.choices[0].logprobs), 'prompt 1, sample 0');
  eq(idsOf(b.choices[3].logprobs), idsOf(one.choices[0].logprobs), 'prompt 1, sample 1');
  const a = await complete('Call me', 6, { logprobs: 0, return_tokens_as_token_ids: true });
  eq(idsOf(b.choices[0].logprobs), idsOf(a.choices[0].logprobs), 'prompt 0, sample 0');
  eq(b.usage.prompt_tokens, a.usage.prompt_tokens + 5, 'usage: each prompt once');
  // Streaming: every choice's chunks, each choice's finish, then usage and [DONE].
  const st = await client.completions.create({ model: NAME, prompt: [9, 8, 7, 6, 5], max_tokens: 6, ...greedy, n: 3, stream: true,
    stream_options: { include_usage: true } });
  const texts = ['', '', ''], fins = [null, null, null];
  let usage = null;
  for await (const c of st) {
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) { texts[ch.index] += ch.text; if (ch.finish_reason) fins[ch.index] = ch.finish_reason; }
  }
  eq(texts, Array(3).fill(one.choices[0].text), 'streamed samples equal the greedy text');
  eq(fins, ['length', 'length', 'length'], 'each choice finishes');
  eq(usage && usage.completion_tokens, 18, 'streamed usage');
  const ch = await client.chat.completions.create({ model: NAME, messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, ...greedy, n: 2 });
  eq(ch.choices.length, 2, 'chat: n choices');
  eq(ch.choices[0].message.content, ch.choices[1].message.content, 'chat: greedy samples agree');
  await waitIdle(srv.base);
});

await section("echo with logprobs: the prompt's log-probs (lm-eval's loglikelihood requests)", async () => {
  const base = [9, 8, 7, 6, 5];
  const g = await complete(base, 4, { logprobs: 1, return_tokens_as_token_ids: true });
  const gen = idsOf(g.choices[0].logprobs);
  const full = base.concat(gen);
  const r = await complete([full], 1, { echo: true, logprobs: 1, return_tokens_as_token_ids: true });
  const lp = r.choices[0].logprobs;
  eq(lp.tokens.length, full.length + 1, 'the prompt tokens, then the generated one');
  eq(lp.tokens.slice(0, full.length), full.map((t) => `token_id:${t}`), "the prompt's tokens");
  check(lp.token_logprobs[0] === null && lp.top_logprobs[0] === null, 'the first prompt token has none');
  const tail = lp.token_logprobs.slice(base.length, full.length);
  check(tail.every((v, i) => Math.abs(v - g.choices[0].logprobs.token_logprobs[i]) < 1e-3),
    "the continuation's log-probs equal the greedy run's", { tail, greedy: g.choices[0].logprobs.token_logprobs });
  for (let i = base.length; i < full.length; ++i) {
    const top = lp.top_logprobs[i];
    const best = Object.keys(top).reduce((a, b) => (top[a] >= top[b] ? a : b));
    eq(best, `token_id:${full[i]}`, `is_greedy at position ${i}`);
  }
  check(lp.text_offset.every((v, i) => i === 0 || v >= lp.text_offset[i - 1]), 'text offsets never decrease', lp.text_offset);
  const z = await complete(full, 0, { echo: true, logprobs: 0, return_tokens_as_token_ids: true });
  eq(z.choices[0].logprobs.tokens.length, full.length, 'max_tokens 0: the prompt alone');
  eq(z.usage.completion_tokens, 0, 'max_tokens 0: no completion tokens');
  eq(z.choices[0].logprobs.token_logprobs.slice(1), lp.token_logprobs.slice(1, full.length), 'the same prompt log-probs');
  const st = await client.completions.create({ model: NAME, prompt: full, max_tokens: 2, ...greedy, echo: true, logprobs: 0,
    stream: true, return_tokens_as_token_ids: true });
  const toks = [];
  for await (const c of st) for (const ch of c.choices) if (ch.logprobs) toks.push(...ch.logprobs.tokens);
  eq(toks.length, full.length + 2, 'streamed: the prompt tokens, then the generated ones');
  await waitIdle(srv.base);
});

await section('seeded sampling reproduces, in any batch', async () => {
  const p = { prompt: 'Seeds:', max_tokens: 20, temperature: 1.0, top_p: 0.95, ignore_eos: true };
  const a = await client.completions.create({ model: NAME, ...p, seed: 1234, logprobs: 0, return_tokens_as_token_ids: true });
  const b = await client.completions.create({ model: NAME, ...p, seed: 1234, logprobs: 0, return_tokens_as_token_ids: true });
  const c = await client.completions.create({ model: NAME, ...p, seed: 99, logprobs: 0, return_tokens_as_token_ids: true });
  eq(idsOf(b.choices[0].logprobs), idsOf(a.choices[0].logprobs), 'same seed, same tokens');
  check(JSON.stringify(idsOf(c.choices[0].logprobs)) !== JSON.stringify(idsOf(a.choices[0].logprobs)), 'another seed differs');
  const solo = [];
  for (let i = 0; i < 6; ++i)
    solo.push((await client.completions.create({ model: NAME, ...p, prompt: `Seeds ${i}:`, seed: 7 + i })).choices[0].text);
  const together = await Promise.all([...Array(6).keys()].map((i) =>
    client.completions.create({ model: NAME, ...p, prompt: `Seeds ${i}:`, seed: 7 + i })));
  eq(together.map((r) => r.choices[0].text), solo, 'seeded outputs under concurrency');
});

await section('64 concurrent streams complete with their solo outputs', async () => {
  const prompts = [...Array(64).keys()].map((i) => `Request ${i}: ${'abcdefghij'.slice(0, i % 10)} tell me`);
  const solo = [];
  for (const p of prompts) solo.push((await complete(p, 16)).choices[0].text);
  const before = await metrics(srv.base);
  const res = await Promise.all(prompts.map((p) => streamText({ prompt: p, max_tokens: 16, ...greedy })));
  eq(res.map((r) => r.text), solo, 'concurrent streamed outputs equal solo outputs');
  check(res.every((r) => r.finish === 'length'), 'all finished');
  const after = await waitIdle(srv.base);
  eq(after['sieve:generation_tokens_total'] - before['sieve:generation_tokens_total'], 64 * 16, 'generation token counter');
});

await section('a client that disconnects mid-stream frees its blocks', async () => {
  const controller = new AbortController();
  const stream = await client.completions.create({ model: NAME, prompt: 'long story', max_tokens: 900, stream: true, ...greedy },
    { signal: controller.signal });
  let got = 0;
  let busy = null;
  try {
    for await (const c of stream) {
      if (++got === 3) busy = await metrics(srv.base);
      if (got === 5) controller.abort();
    }
  } catch (e) {
    // The abort surfaces as an error in the loop.
  }
  check(busy && busy['sieve:num_requests_running'] === 1, 'running while streaming', busy);
  check(busy && busy['sieve:kv_cache_blocks_free'] < busy['sieve:kv_cache_blocks_total'], 'holding blocks while streaming', busy);
  const m = await waitIdle(srv.base, 5000);
  eq(m['sieve:num_requests_running'], 0, 'nothing running after the disconnect');
});

async function abortedCount() {
  const text = await (await fetch(`${srv.base}/metrics`)).text();
  const m = text.match(/sieve:request_success_total\{[^}]*finished_reason="abort"\} (\d+)/);
  return m ? Number(m[1]) : NaN;
}

await section('a non-streaming client that disconnects frees its blocks', async () => {
  const before = await abortedCount();
  const controller = new AbortController();
  const pending = client.completions.create({ model: NAME, prompt: 'a long answer', max_tokens: 900, ...greedy },
    { signal: controller.signal }).then(() => 'completed', () => 'aborted');
  const t0 = Date.now();
  while ((await metrics(srv.base))['sieve:num_requests_running'] !== 1 && Date.now() - t0 < 5000) await new Promise((r) => setTimeout(r, 10));
  controller.abort();
  eq(await pending, 'aborted', 'client side');
  await waitIdle(srv.base, 3000);
  eq(await abortedCount(), before + 1, 'the server aborted the request');
});

async function raw(method, pathname, body, { key = KEY, headers = {} } = {}) {
  const h = { ...headers };
  if (key !== null) h.Authorization = `Bearer ${key}`;
  if (body !== undefined && !h['Content-Type']) h['Content-Type'] = 'application/json';
  const res = await fetch(`${srv.base}${pathname}`, { method, headers: h, body: typeof body === 'string' ? body : body === undefined ? undefined : JSON.stringify(body) });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* checked by the caller */ }
  return { status: res.status, json, text };
}
async function expectError(what, status, method, pathname, body, opts) {
  const r = await raw(method, pathname, body, opts);
  check(r.status === status, `${what}: status`, `got ${r.status} ${r.text.slice(0, 200)}`);
  const e = r.json && r.json.error;
  check(e && typeof e.message === 'string' && e.message.length > 0 && typeof e.type === 'string' && 'param' in e && e.code === status,
    `${what}: OpenAI error object`, r.text.slice(0, 300));
}

await section('bad input gets a 4xx error object and the server keeps serving', async () => {
  const C = '/v1/completions', CH = '/v1/chat/completions';
  await expectError('malformed JSON', 400, 'POST', C, '{"prompt": "x", "max_tokens": ');
  await expectError('not an object', 400, 'POST', C, '[1,2]');
  await expectError('empty body', 400, 'POST', C, '');
  await expectError('prompt of a wrong type', 400, 'POST', C, { model: NAME, prompt: 5 });
  await expectError('max_tokens of a wrong type', 400, 'POST', C, { prompt: 'x', max_tokens: 'ten' });
  await expectError('temperature of a wrong type', 400, 'POST', C, { prompt: 'x', temperature: 'hot' });
  await expectError('stream of a wrong type', 400, 'POST', C, { prompt: 'x', stream: 'yes' });
  await expectError('stop of a wrong type', 400, 'POST', C, { prompt: 'x', stop: 5 });
  await expectError('messages of a wrong type', 400, 'POST', CH, { messages: 'hi' });
  await expectError('message without a role', 400, 'POST', CH, { messages: [{ content: 'hi' }] });
  await expectError('empty messages', 400, 'POST', CH, { messages: [] });
  await expectError('missing prompt', 400, 'POST', C, { max_tokens: 3 });
  await expectError('max_tokens 0', 400, 'POST', C, { prompt: 'x', max_tokens: 0 });
  await expectError('max_tokens negative', 400, 'POST', C, { prompt: 'x', max_tokens: -5 });
  await expectError('chat max_tokens negative', 400, 'POST', CH, { messages: [{ role: 'user', content: 'x' }], max_tokens: -1 });
  await expectError('negative temperature', 400, 'POST', C, { prompt: 'x', temperature: -0.5 });
  await expectError('top_p 0', 400, 'POST', C, { prompt: 'x', top_p: 0 });
  await expectError('n = 0', 400, 'POST', C, { prompt: 'x', n: 0 });
  await expectError('best_of above n', 400, 'POST', C, { prompt: 'x', n: 2, best_of: 3 });
  await expectError('a batch with an empty prompt', 400, 'POST', C, { prompt: ['x', ''] });
  await expectError('logit_bias outside the vocabulary', 400, 'POST', C, { prompt: 'x', logit_bias: { 99999999: 5 } });
  await expectError('logit_bias out of range', 400, 'POST', C, { prompt: 'x', logit_bias: { 5: 101 } });
  await expectError('best_of = 3', 400, 'POST', C, { prompt: 'x', best_of: 3 });
  await expectError('prompt longer than max-model-len', 400, 'POST', C, { prompt: Array(MAX_LEN + 10).fill(1) });
  await expectError('prompt + max_tokens over max-model-len', 400, 'POST', C, { prompt: Array(1000).fill(1), max_tokens: 100 });
  await expectError('long text prompt', 400, 'POST', C, { prompt: 'z'.repeat(4 * MAX_LEN) });
  await expectError('token id above the vocabulary', 400, 'POST', C, { prompt: [1, 2, 999999] });
  await expectError('token id just past the vocabulary', 400, 'POST', C, { prompt: [1, 512] });
  await expectError('negative token id', 400, 'POST', C, { prompt: [1, -3] });
  await expectError('fractional token id', 400, 'POST', C, { prompt: [1, 2.5] });
  await expectError('body over the limit', 413, 'POST', C, { prompt: 'y'.repeat(2 << 20) });
  {
    // A body declared as anything but JSON is refused, as vLLM does (curl -d alone sends
    // application/x-www-form-urlencoded); a JSON type with parameters is fine.
    const r = await raw('POST', C, { model: NAME, prompt: 'hi', max_tokens: 2, pad: 'x'.repeat(20000) },
      { headers: { 'Content-Type': 'application/x-www-form-urlencoded' } });
    eq(r.status, 415, 'form-encoded content type');
    const r2 = await raw('POST', C, { model: NAME, prompt: 'hi', max_tokens: 2, pad: 'x'.repeat(20000) },
      { headers: { 'Content-Type': 'application/json; charset=utf-8' } });
    eq(r2.status, 200, 'JSON content type with parameters and a 20 kB body');
    // A chunked body (no Content-Length) over the limit.
    const chunk = new TextEncoder().encode('{"prompt": "' + 'z'.repeat(64 * 1024));
    let sent = 0;
    const body = new ReadableStream({ pull(c) { if (sent++ < 40) c.enqueue(chunk); else c.close(); } });
    const res = await fetch(`${srv.base}${C}`, { method: 'POST', body, duplex: 'half',
      headers: { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' } }).catch((e) => ({ status: -1, e }));
    eq(res.status, 413, 'chunked body over the limit');
  }
  await expectError('unknown model', 404, 'POST', C, { model: 'no-such-model', prompt: 'x' });
  await expectError('unknown model (chat)', 404, 'POST', CH, { model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] });
  await expectError('missing API key', 401, 'POST', C, { prompt: 'x' }, { key: null });
  await expectError('wrong API key', 401, 'POST', C, { prompt: 'x' }, { key: 'sk-wrong' });
  await expectError('wrong API key on /v1/models', 401, 'GET', '/v1/models', undefined, { key: 'nope' });
  await expectError('unknown route', 404, 'GET', '/v1/nothing-here');
  await expectError('unknown route (POST)', 404, 'POST', '/v2/completions', { prompt: 'x' });
  await expectError('detokenize outside the vocabulary', 400, 'POST', '/detokenize', { tokens: [1, 100000] });
  // The official client sees these as APIError with the status.
  let status = 0;
  try { await client.completions.create({ model: NAME, prompt: 'x', max_tokens: 0 }); } catch (e) { status = e.status; }
  eq(status, 400, 'openai client: APIError 400');
  try { await new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'bad', maxRetries: 0 }).models.list(); } catch (e) { status = e.status; }
  eq(status, 401, 'openai client: APIError 401');
  // Still serving.
  const ok = await complete('still alive?', 4);
  eq(ok.choices[0].finish_reason, 'length', 'serves after bad input');
  eq((await fetch(`${srv.base}/health`)).status, 200, 'health');
  await waitIdle(srv.base);
});

await section('tool calls: a forced call, streamed in pieces that the SDK puts together', async () => {
  const tools = [{ type: 'function', function: { name: 'get_weather',
    parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
  const params = { model: NAME, messages: [{ role: 'user', content: 'Weather in Paris?' }], tools, max_tokens: 150,
    temperature: 0, tool_choice: { type: 'function', function: { name: 'get_weather' } },
    chat_template_kwargs: { enable_thinking: false } };
  const full = await client.chat.completions.create(params);
  const stream = client.chat.completions.stream(params);
  const pieces = [];
  stream.on('tool_calls.function.arguments.delta', (e) => pieces.push(e.arguments_delta));
  const done = await stream.finalChatCompletion();
  const call = done.choices[0].message.tool_calls?.[0];
  check(call !== undefined, 'the streamed message has a tool call', JSON.stringify(done.choices[0].message));
  if (call === undefined) return;
  eq(done.choices[0].finish_reason, 'tool_calls', 'streamed finish_reason');
  eq(call.function.name, 'get_weather', 'the named function');
  check(/^call_/.test(call.id), 'a call id', call.id);
  let args = null;
  try { args = JSON.parse(call.function.arguments); } catch { /* checked below */ }
  check(args !== null && typeof args === 'object', 'the arguments are a JSON object', call.function.arguments);
  eq(pieces.join(''), call.function.arguments, 'the argument pieces add up');
  // (The tiny model's vocabulary spells the call's opening in many tokens: max_tokens leaves room.)
  // Not streamed, the same greedy text: the call when it completed within max_tokens, else the text.
  const m = full.choices[0].message;
  if (full.choices[0].finish_reason === 'tool_calls') eq(m.tool_calls[0].function.arguments, call.function.arguments, 'same arguments');
  else check(typeof m.content === 'string' && m.content.length > 0 && (m.tool_calls ?? []).length === 0, 'cut short: content', JSON.stringify(m));
});

await section('guided decoding: JSON objects, schemas and choices, streamed and not', async () => {
  let objects = 0;
  for (let seed = 0; seed < 6; ++seed) {
    const params = { model: NAME, messages: [{ role: 'user', content: 'JSON please' }], max_tokens: 48, temperature: 1,
      seed, response_format: { type: 'json_object' } };
    const r = await client.chat.completions.create(params);
    const content = r.choices[0].message.content;
    if (r.choices[0].finish_reason === 'stop') {
      ++objects;
      let parsed = null;
      try { parsed = JSON.parse(content); } catch { /* checked below */ }
      check(parsed !== null && typeof parsed === 'object' && !Array.isArray(parsed), 'a JSON object', content);
    }
    const stream = await client.chat.completions.create({ ...params, stream: true });
    let streamed = '';
    for await (const c of stream) if (c.choices.length) streamed += c.choices[0].delta.content || '';
    eq(streamed, content, 'streamed JSON equals non-streamed (same seed)');
  }
  // Favouring the tokens that close strings and objects makes objects complete within max_tokens.
  const idOf = async (text) => {
    const t = await (await fetch(`${srv.base}/tokenize`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: NAME, prompt: text, add_special_tokens: false }) })).json();
    return t.tokens[0];
  };
  const bias = { [await idOf('"')]: 30, [await idOf('}')]: 30 };
  for (let seed = 0; seed < 3; ++seed) {
    const r = await client.chat.completions.create({ model: NAME, messages: [{ role: 'user', content: 'JSON please' }],
      max_tokens: 48, temperature: 1, seed, logit_bias: bias, response_format: { type: 'json_object' } });
    eq(r.choices[0].finish_reason, 'stop', 'a favoured object completes');
    if (r.choices[0].finish_reason === 'stop') ++objects;
    let parsed = null;
    try { parsed = JSON.parse(r.choices[0].message.content); } catch { /* checked below */ }
    check(parsed !== null && typeof parsed === 'object' && !Array.isArray(parsed), 'a JSON object', r.choices[0].message.content);
  }
  check(objects > 0, 'some JSON objects completed within max_tokens', objects);
  for (let seed = 0; seed < 4; ++seed) {
    const r = await client.completions.create({ model: NAME, prompt: 'Answer:', max_tokens: 8, temperature: 1, seed,
      guided_choice: ['yes', 'no', 'not sure'] });
    check(['yes', 'no', 'not sure'].includes(r.choices[0].text), 'one of the choices', r.choices[0].text);
    eq(r.choices[0].finish_reason, 'stop', 'a choice ends the request');
  }
  // A JSON schema: required properties in order, typed values.
  const schema = { type: 'object', properties: { name: { type: 'string' }, n: { type: 'integer' },
    tag: { enum: ['a', 'b'] } }, required: ['name', 'n'] };
  let shaped = 0;
  for (let seed = 0; seed < 3; ++seed) {
    const r = await client.chat.completions.create({ model: NAME, messages: [{ role: 'user', content: 'JSON please' }],
      max_tokens: 48, temperature: 1, seed, logit_bias: bias,
      response_format: { type: 'json_schema', json_schema: { name: 's', schema } } });
    if (r.choices[0].finish_reason !== 'stop') continue;
    ++shaped;
    let v = null;
    try { v = JSON.parse(r.choices[0].message.content); } catch { /* checked below */ }
    check(v !== null && typeof v.name === 'string' && Number.isInteger(v.n) && (v.tag === undefined || ['a', 'b'].includes(v.tag)),
      'matches the schema', r.choices[0].message.content);
  }
  check(shaped > 0, 'some schema objects completed', shaped);
  const res = await fetch(`${srv.base}/v1/chat/completions`, {
    method: 'POST', headers: { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: NAME, messages: [{ role: 'user', content: 'x' }],
      response_format: { type: 'json_schema', json_schema: { name: 's', schema: { type: 'object', properties: { a: { type: 'string', pattern: 'x+' } } } } } }) });
  eq(res.status, 400, 'an unsupported schema keyword is refused');
  const err = (await res.json()).error;
  eq(err.param, 'response_format', 'naming response_format');
  check(err.message.includes('pattern'), 'and the keyword', err.message);
});

await section('randomized requests over HTTP: every answer is a result or an error object', async () => {
  // Mutations of valid requests, through the whole path (JSON, validation, chat template,
  // tokenizer, engine, detokenizer). Bounded: 600 requests, 8 at a time, short generations.
  let seed = 12345;
  const rnd = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
  const values = [null, true, false, 0, 1, -1, 2, 3, 0.5, -0.5, 1e9, -1e300, 2147483648, 511, 512, '', 'x', '\u0000',
    'stop', '\ud800', 'é', '😀', [], [1], [[1, 2]], ['a', 'b'], [-1], [1.5], {}, { role: 'user' }, { role: 'user', content: 'hi' },
    [{ role: 'user', content: 'hi' }], [{ role: 'user', content: [{ type: 'text', text: 'x' }] }], [{ role: 'tool' }],
    [{ role: 'user', content: null }], '{{ raise_exception("boom") }}', '<|im_start|>', 'a'.repeat(300),
    { type: 'json_object' }, { type: 'json_schema' }, { type: 'text' }, { choice: ['x', 'y'] }, { json_object: true },
    'auto', 'none', 'required', ['yes', 'no']];
  const fields = ['model', 'prompt', 'messages', 'max_tokens', 'max_completion_tokens', 'temperature', 'top_p', 'top_k',
    'min_p', 'presence_penalty', 'frequency_penalty', 'repetition_penalty', 'seed', 'stop', 'stop_token_ids', 'ignore_eos',
    'min_tokens', 'logprobs', 'top_logprobs', 'stream', 'stream_options', 'n', 'echo', 'tools', 'chat_template_kwargs',
    'add_generation_prompt', 'continue_final_message', 'include_stop_str_in_output', 'skip_special_tokens', 'add_special_tokens',
    'response_format', 'guided_choice', 'structured_outputs', 'tool_choice'];
  const small = [1, 2, 3, 0, -1, 'x', null];
  let ok = 0, refused = 0, bad = 0;
  const one = async (i) => {
    const chat = rnd(2) === 1;
    const body = chat ? { messages: [{ role: 'user', content: 'hi' }], max_tokens: 3 } : { prompt: 'hello', max_tokens: 3 };
    const edits = 1 + rnd(4);
    for (let e = 0; e < edits; ++e) body[fields[rnd(fields.length)]] = values[rnd(values.length)];
    if (!('max_tokens' in body) || typeof body.max_tokens !== 'number' || body.max_tokens > 3) body.max_tokens = small[rnd(small.length)];
    if (body.max_completion_tokens !== undefined) body.max_completion_tokens = small[rnd(small.length)];
    if (typeof body.min_tokens === 'number' && body.min_tokens > 3) body.min_tokens = 1;
    let text = JSON.stringify(body);
    if (rnd(5) === 0) text = text.slice(0, rnd(text.length + 1));
    const res = await fetch(`${srv.base}${chat ? '/v1/chat/completions' : '/v1/completions'}`, {
      method: 'POST', headers: { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' }, body: text,
      signal: AbortSignal.timeout(30000) });
    const out = await res.text();
    if (res.status === 200) {
      ++ok;
      if (body.stream === true) { if (!out.trimEnd().endsWith('data: [DONE]')) { ++bad; console.log('bad stream', text, out.slice(-200)); } }
      else { try { const j = JSON.parse(out); if (!j.choices) throw 0; } catch { ++bad; console.log('bad 200', text, out.slice(0, 200)); } }
    } else {
      let e = null;
      try { e = JSON.parse(out).error; } catch { /* counted below */ }
      if (res.status >= 400 && res.status < 500 && e && typeof e.message === 'string' && e.code === res.status) ++refused;
      else { ++bad; console.log('bad answer', res.status, text, out.slice(0, 200)); }
    }
  };
  for (let i = 0; i < 600; i += 8) await Promise.all([...Array(8).keys()].map((k) => one(i + k)));
  eq(bad, 0, 'answers that are neither results nor 4xx error objects');
  check(ok > 30 && refused > 30, 'both kinds of answer', { ok, refused });
  eq((await fetch(`${srv.base}/health`)).status, 200, 'still healthy');
  await waitIdle(srv.base);
});

await section('tokenize / detokenize', async () => {
  const t = await raw('POST', '/tokenize', { model: NAME, prompt: 'Hello' });
  eq(t.status, 200, 'tokenize status');
  eq(t.json.count, t.json.tokens.length, 'count');
  const d = await raw('POST', '/detokenize', { model: NAME, tokens: t.json.tokens });
  eq(d.json.prompt, 'Hello', 'round trip');
  const c = await raw('POST', '/tokenize', { model: NAME, messages: [{ role: 'user', content: 'Hello' }] });
  check(c.status === 200 && c.json.count > 5, 'chat tokenize', c.text);
});

await section('profiler writes a Chrome trace', async () => {
  eq((await raw('POST', '/start_profile')).status, 200, 'start_profile');
  await complete('profile me', 4);
  const r = await raw('POST', '/stop_profile');
  eq(r.status, 200, 'stop_profile');
  const trace = JSON.parse(fs.readFileSync(r.json.trace, 'utf8'));
  const steps = trace.traceEvents.filter((e) => e.name === 'step');
  check(steps.length >= 4, 'step events', steps.length);
  check(trace.traceEvents.some((e) => e.name === 'forward' && e.ph === 'X' && e.dur >= 0), 'forward events');
  for (const op of ['linear', 'qkv_norm_rope_cache', 'indexer', 'attention', 'moe_experts'])
    check(trace.traceEvents.some((e) => e.cat === 'op' && e.name === op && e.ph === 'X' && e.dur >= 0), `op events: ${op}`);
});

await section('metrics exposition', async () => {
  const text = await (await fetch(`${srv.base}/metrics`)).text();
  for (const name of ['sieve:num_requests_running', 'sieve:num_requests_waiting', 'sieve:kv_cache_usage_perc',
    'sieve:prompt_tokens_total', 'sieve:generation_tokens_total', 'sieve:num_preemptions_total',
    'sieve:time_to_first_token_seconds_bucket', 'sieve:inter_token_latency_seconds_count', 'sieve:e2e_request_latency_seconds_sum'])
    check(text.includes(name), `metric ${name}`);
});

await section('SIGTERM with requests in flight exits 0 within seconds', async () => {
  // One client reads its stream to the end, one stops reading: neither may hold the exit.
  const reading = await client.completions.create({ model: NAME, prompt: 'forever', max_tokens: 1000, stream: true, ...greedy });
  const stalled = await client.completions.create({ model: NAME, prompt: 'stalled', max_tokens: 1000, stream: true, ...greedy });
  const it = stalled[Symbol.asyncIterator]();
  await it.next();
  let chunks = 0;
  let finish = null;
  const drain = (async () => {
    try {
      for await (const c of reading) {
        ++chunks;
        if (c.choices.length && c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
      }
    } catch { /* checked below */ }
  })();
  const r = await stopServer(srv, 15000);
  eq(r.code, 0, 'exit code');
  check(r.ms < 8000, 'exit time (ms)', r.ms);
  await drain;
  check(chunks > 0, 'the reading client got its stream', chunks);
  check(finish === 'abort' || finish === 'length', 'the reading client saw the end of its stream', finish);
});

process.exit(summary());
