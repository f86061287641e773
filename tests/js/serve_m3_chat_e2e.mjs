// End-to-end: MiniMax-M3's chat format through `sieve serve` on the bundled model, driven by the
// official `openai` client: <mm:think> reasoning in `reasoning_content` (and `reasoning`),
// namespaced tool calls with nested arguments, forced calls valid against their schemas, the
// thinking modes (--default-chat-template-kwargs, chat_template_kwargs) and a conversation that
// goes back to the server as the same text. The tiny model was trained on plain text and does not
// write the format on its own: replies are shaped by guided decoding (a regex) or by the forced
// tool-call grammar, and the parsers turn them into messages. Usage:
//   node tests/js/serve_m3_chat_e2e.mjs --sieve build/sieve --workdir /tmp/sieve-m3-e2e
import OpenAI from 'openai';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startServer, stopServer, waitIdle, check, eq, section, summary, parseArgs } from './serve_lib.mjs';

const args = parseArgs(process.argv.slice(2));
const sieve = path.resolve(args.sieve || 'build/sieve');
const work = path.resolve(args.workdir || '/tmp/sieve-m3-e2e');
fs.mkdirSync(work, { recursive: true });
const model = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../models/minimax-m3-tiny');
const NAME = 'm3';
const NS = ']<]minimax[>[';

const srv = await startServer(sieve, ['--model', model, '--served-model-name', NAME, '--kv-cache-memory', '64MiB',
  '--max-model-len', '2048', '--reasoning-parser', 'minimax_m3', '--enable-auto-tool-choice',
  '--tool-call-parser', 'minimax_m3', '--default-chat-template-kwargs', '{"thinking_mode": "enabled"}']);
// Constrained replies run token by token on a CPU that other tests share: generous per-request
// time (the test's own limit is CTest's).
const client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'none', maxRetries: 0, timeout: 600000 });
const adaptive = { chat_template_kwargs: { thinking_mode: 'adaptive' } };

const el = (tag, body) => `${NS}<${tag}>${body}${NS}</${tag}>`;
const invoke = (name, params) => `${NS}<invoke name="${name}">${params}${NS}</invoke>\n`;
const block = (invokes) => `${NS}<tool_call>\n${invokes}${NS}</tool_call>`;
// A grammar that derives `text` only.
const only = (text) => `root ::= ${JSON.stringify(text)}`;
// The tiny model spells the namespace token byte by byte unless told otherwise: favouring its one
// token (where the constraint allows it) keeps the constrained replies short.
const nsToken = (await (await fetch(`${srv.base}/tokenize`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
  body: JSON.stringify({ model: NAME, prompt: NS, add_special_tokens: false }) })).json()).tokens;
const favourNs = nsToken.length === 1 ? { logit_bias: { [nsToken[0]]: 50 } } : {};

const tools = [
  { type: 'function', function: { name: 'plan_trip', description: 'Plan a trip', parameters: { type: 'object',
    properties: { city: { type: 'string' }, days: { type: 'integer' }, metric: { type: 'boolean' },
      where: { type: 'object', properties: { lat: { type: 'number' }, tags: { type: 'array', items: { type: 'string' } } },
        required: ['lat'] },
      stops: { type: 'array', items: { type: 'object', properties: { name: { type: 'string' }, nights: { type: 'integer' } },
        required: ['name'] } } },
    required: ['city', 'days'] } } },
  { type: 'function', function: { name: 'set_alarm', description: 'Set an alarm', parameters: { type: 'object',
    properties: { hour: { type: 'integer' }, loud: { type: 'boolean' },
      days: { type: 'array', items: { enum: ['mon', 'tue'] }, minItems: 1, maxItems: 2 },
      repeat: { type: 'object', properties: { unit: { enum: ['min', 'hour'] } }, required: ['unit'] } },
    required: ['hour', 'days', 'repeat'] } } },
];

// Whether `v` matches the JSON schema subset the tools use.
function valid(v, s) {
  if (s.enum) return s.enum.some((e) => JSON.stringify(e) === JSON.stringify(v));
  switch (s.type) {
    case 'integer': return Number.isInteger(v);
    case 'number': return typeof v === 'number';
    case 'boolean': return typeof v === 'boolean';
    case 'string': return typeof v === 'string';
    case 'array':
      return Array.isArray(v) && v.length >= (s.minItems ?? 0) && v.length <= (s.maxItems ?? Infinity) &&
        v.every((x) => valid(x, s.items ?? {}));
    case 'object':
      return v !== null && typeof v === 'object' && !Array.isArray(v) && (s.required ?? []).every((k) => k in v) &&
        Object.entries(v).every(([k, x]) => s.properties && k in s.properties && valid(x, s.properties[k]));
    default: return true;
  }
}

// A streamed chat: reasoning and content deltas joined, the final message from the SDK.
async function streamed(params) {
  const stream = client.chat.completions.stream(params);
  let reasoning = '', reasoningAlias = '', content = '';
  const pieces = [];
  stream.on('chunk', (c) => {
    const d = c.choices[0]?.delta ?? {};
    reasoning += d.reasoning_content ?? '';
    reasoningAlias += d.reasoning ?? '';
    content += d.content ?? '';
  });
  stream.on('tool_calls.function.arguments.delta', (e) => { pieces[e.index] = (pieces[e.index] ?? '') + e.arguments_delta; });
  const done = await stream.finalChatCompletion();
  return { reasoning, reasoningAlias, content, pieces, done };
}

// The text of a chat prompt as the server renders it (special tokens left out).
async function rendered(messages, extra = {}) {
  const post = (route, body) => fetch(`${srv.base}${route}`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify(body) }).then((r) => r.json());
  const t = await post('/tokenize', { model: NAME, messages, tools, ...extra });
  return (await post('/detokenize', { model: NAME, tokens: t.tokens })).prompt;
}

const user = [{ role: 'user', content: 'Plan a short trip, then set an alarm.' }];
const reasoningText = 'plan';
const callText = block(
  invoke('plan_trip', el('city', 'Zürich') + el('days', '3') +
    el('where', el('lat', '47.5') + el('tags', el('item', 'lake') + el('item', 'old town'))) +
    el('stops', el('item', el('name', 'a')))) +
  invoke('set_alarm', el('hour', '7')));
const reply = `<mm:think>${reasoningText}</mm:think>Sure.${callText}`;
const wantArgs = [
  { city: 'Zürich', days: 3, where: { lat: 47.5, tags: ['lake', 'old town'] }, stops: [{ name: 'a' }] },
  { hour: 7 },
];

let first = null;
await section('a reply with reasoning, content and nested tool calls is parsed, streamed and not', async () => {
  const params = { model: NAME, messages: user, tools, temperature: 0, max_tokens: 600, ...adaptive,
    structured_outputs: { grammar: only(reply) }, ...favourNs };
  const r = await client.chat.completions.create(params);
  const s = await streamed(params);
  const c = r.choices[0];
  first = c.message;
  eq(c.finish_reason, 'tool_calls', 'finish_reason');
  eq(c.message.reasoning_content, reasoningText, 'reasoning_content');
  eq(c.message.reasoning, reasoningText, "vLLM's reasoning field");
  eq(c.message.content, 'Sure.', 'content');
  eq((c.message.tool_calls ?? []).map((t) => t.function.name), ['plan_trip', 'set_alarm'], 'the calls');
  eq((c.message.tool_calls ?? []).map((t) => JSON.parse(t.function.arguments)), wantArgs, 'nested arguments, typed');
  check(valid(JSON.parse(c.message.tool_calls?.[0]?.function.arguments ?? 'null'), tools[0].function.parameters),
    'valid against its schema');
  eq(s.reasoning, reasoningText, 'streamed reasoning_content');
  eq(s.reasoningAlias, reasoningText, 'streamed reasoning');
  eq(s.content, 'Sure.', 'streamed content');
  eq(s.done.choices[0].finish_reason, 'tool_calls', 'streamed finish_reason');
  eq(s.done.choices[0].message.tool_calls.map((t) => t.function.name), ['plan_trip', 'set_alarm'], 'streamed calls');
  eq(s.done.choices[0].message.tool_calls.map((t) => JSON.parse(t.function.arguments)), wantArgs, 'streamed arguments');
  eq(s.pieces, c.message.tool_calls.map((t) => t.function.arguments), 'the argument pieces add up to the full response');
});

await section('the conversation goes back to the server as the text the model wrote', async () => {
  check(first !== null, 'the first reply');
  if (!first) return;
  const messages = [...user, { role: 'assistant', content: first.content, reasoning_content: first.reasoning_content,
    tool_calls: first.tool_calls }];
  for (const [i, t] of first.tool_calls.entries())
    messages.push({ role: 'tool', tool_call_id: t.id, content: i === 0 ? '{"booked": true}' : 'set' });
  messages.push({ role: 'user', content: 'Thanks!' });
  const prompt = await rendered(messages, adaptive);
  check(prompt.includes(`ai\n${reply}`), 'the assistant turn renders as the reply it came from', prompt.slice(-900));
  check(prompt.includes('tool\n<response>{"booked": true}</response>\n<response>set</response>'), 'the tool results', prompt.slice(-400));
  check(prompt.endsWith('user\nThanks!\nai\n'), 'the generation prompt (adaptive)', prompt.slice(-40));
  check(prompt.includes('developer\nYou are a helpful assistant.\n\n# Tools\n'), 'the developer turn with the tools', prompt.slice(0, 900));
  check(prompt.includes('"description": "Plan a trip"'), 'the tools as JSON', prompt.slice(0, 900));
  const r = await client.chat.completions.create({ model: NAME, messages, tools, max_tokens: 4, temperature: 0, ...adaptive });
  eq(r.choices[0].finish_reason, 'length', 'the next turn is served');
});

await section('thinking_mode: enabled by --default-chat-template-kwargs, disabled or adaptive per request', async () => {
  const base = { model: NAME, messages: [{ role: 'user', content: 'Tell me about whales.' }], max_tokens: 12, temperature: 0 };
  const on = await client.chat.completions.create(base);
  const m = on.choices[0].message;
  check(typeof m.reasoning_content === 'string' && m.reasoning_content.length > 0, 'the whole reply is reasoning', m);
  eq(m.reasoning, m.reasoning_content, 'reasoning equals reasoning_content');
  const s = await streamed(base);
  eq(s.reasoning + s.content, (m.reasoning_content ?? '') + (m.content ?? ''), 'streamed, the same text');
  eq(s.reasoning, m.reasoning_content, 'streamed, the same reasoning');
  check((await rendered(base.messages)).endsWith('ai\n<mm:think>'), 'the prompt opens the block');
  const off = await client.chat.completions.create({ ...base, chat_template_kwargs: { thinking_mode: 'disabled' } });
  check(off.choices[0].message.reasoning_content == null && typeof off.choices[0].message.content === 'string',
    'thinking disabled: content only', off.choices[0].message);
  check((await rendered(base.messages, { chat_template_kwargs: { thinking_mode: 'disabled' } })).endsWith('ai\n</mm:think>'),
    'the prompt closes the block');
  // Guided decoding would constrain the reasoning: refused, saying how to turn thinking off.
  const res = await fetch(`${srv.base}/v1/chat/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ ...base, structured_outputs: { regex: 'a+' } }) });
  eq(res.status, 400, 'guided decoding inside reasoning');
  const err = (await res.json()).error;
  check(err.message.includes('thinking_mode'), 'the message names thinking_mode', err.message);
  const bad = await fetch(`${srv.base}/v1/chat/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ ...base, chat_template_kwargs: { thinking_mode: 'sometimes' } }) });
  eq(bad.status, 400, 'an unknown thinking_mode');
  eq((await bad.json()).error.param, 'chat_template_kwargs.thinking_mode', 'naming it');
});

await section('forced calls (a named function, "required") follow the M3 form and their schemas', async () => {
  let complete = 0;
  for (const [seed, choice] of [[0, { type: 'function', function: { name: 'set_alarm' } }], [1, 'required']]) {
    const params = { model: NAME, messages: user, tools: [tools[1], { type: 'function', function: { name: 'get_time',
      parameters: { type: 'object', properties: { zone: { enum: ['utc', 'cet'] } }, required: ['zone'] } } }],
    tool_choice: choice, temperature: 1, seed, max_tokens: 300, ...adaptive, ...favourNs };
    const r = await client.chat.completions.create(params);
    const c = r.choices[0];
      eq(c.finish_reason, 'tool_calls', `seed ${seed}: a call`);
    if (c.finish_reason !== 'tool_calls') continue;
    ++complete;
    for (const t of c.message.tool_calls) {
      const schema = params.tools.find((x) => x.function.name === t.function.name)?.function.parameters;
      check(schema !== undefined && valid(JSON.parse(t.function.arguments), schema), `seed ${seed}: valid arguments`,
        t.function);
    }
    if (typeof choice === 'object') eq(c.message.tool_calls.map((t) => t.function.name), ['set_alarm'], 'the named function');
    const s = await streamed(params);
    eq(s.done.choices[0].message.tool_calls.map((t) => [t.function.name, t.function.arguments]),
      c.message.tool_calls.map((t) => [t.function.name, t.function.arguments]), `seed ${seed}: streamed, the same calls`);
    eq(s.pieces, c.message.tool_calls.map((t) => t.function.arguments), `seed ${seed}: the pieces add up`);
  }
  check(complete === 2, 'every forced call completed', complete);
  await waitIdle(srv.base);
});

const stopped = await stopServer(srv, 15000);
eq(stopped.code, 0, 'exit code');
process.exit(summary());
