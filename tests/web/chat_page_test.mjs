// Browser test of the chat page and dashboard: the real `sieve serve` (the bundled model on the
// CPU) and Debian's Chromium driven by playwright-core. Usage:
//   node tests/web/chat_page_test.mjs --sieve build/sieve --workdir /tmp/sieve-web
// Exits 77 (CTest: skipped) only when no Chromium is installed; a failed section saves a
// screenshot under WORKDIR/failures/.
import fs from 'node:fs';
import path from 'node:path';
import { startServer, stopServer, metrics, waitIdle, check, eq, section, summary, parseArgs } from '../js/serve_lib.mjs';
import { SKIP, findChromium, launch, newPage } from './web_lib.mjs';

const args = parseArgs(process.argv.slice(2));
const sieve = path.resolve(args.sieve || 'build/sieve');
const work = path.resolve(args.workdir || '/tmp/sieve-web-test');
const failDir = path.join(work, 'failures');
fs.rmSync(failDir, { recursive: true, force: true });
fs.mkdirSync(work, { recursive: true });

const chromiumPath = findChromium();
if (!chromiumPath) {
  console.log('SKIP: no Chromium found (scripts/setup installs Debian\'s chromium package; or set SIEVE_CHROMIUM): ' +
    'the browser tests of the chat page did not run');
  process.exit(SKIP);
}

// Replies the bundled model cannot make up on its own, forced by a regular expression: a
// reasoning part (MiniMax-M3's block), then an answer with markdown (bold, a code block).
const SHAPED = {
  structured_outputs: {
    regex: '<mm:think>[a-z ]{20,60}</mm:think>[A-Z][a-z ,]{10,40}\\. \\*\\*[A-Za-z]{3,8}\\*\\* [a-z ]{5,20}\\.\n\n```python\nprint\\([0-9]{1,3}\\)\n```\n',
  },
};
const TOOLS = [{ type: 'function', function: { name: 'get_weather', description: 'Weather of a city',
  parameters: { type: 'object', properties: { city: { type: 'string', enum: ['Paris', 'London', 'Tokyo'] } }, required: ['city'] } } }];

const srv = await startServer(sieve, ['--reasoning-parser', 'minimax_m3', '--enable-auto-tool-choice',
  '--tool-call-parser', 'minimax_m3', '--kv-cache-memory', '128MiB', '--seed', '7'],
  { env: { SIEVE_LOG_STATS_INTERVAL: '1000' } });
const browser = await launch(chromiumPath);
let page = await newPage(browser);
const base = srv.base;

async function shot(name) {
  fs.mkdirSync(failDir, { recursive: true });
  const file = path.join(failDir, `${name.replace(/[^a-z0-9]+/gi, '-')}.png`);
  await page.screenshot({ path: file, fullPage: true });
  console.log(`  screenshot: ${file}`);
  console.log(`  server log (last lines):\n${srv.log().split('\n').slice(-15).join('\n')}`);
}

async function setSettings(p, settings) {
  await p.evaluate((s) => localStorage.setItem('sieve.settings', JSON.stringify(s)), settings);
  await p.reload();
  await p.waitForSelector('#server-state.up');
}

// Records the last assistant message as the DOM changes: its state and the lengths of its
// reasoning and answer, to tell a streamed reply from one that arrived whole.
async function recordReplies(p) {
  await p.evaluate(() => {
    window.__rec = [];
    const box = document.getElementById('messages');
    new MutationObserver(() => {
      const m = [...box.querySelectorAll('.msg.assistant')].pop();
      if (!m) return;
      window.__rec.push({ state: m.dataset.state, reasoning: m.querySelector('.reasoning-text')?.textContent.length ?? 0,
        content: m.querySelector('.content')?.textContent.length ?? 0 });
    }).observe(box, { childList: true, subtree: true, characterData: true });
  });
}

const lastReply = '.msg.assistant:last-of-type';
const stat = async (p, name) => p.locator(`${lastReply} [data-stat="${name}"]`).textContent();

await section('the page loads and finds its server', async () => {
  const res = await page.goto(`${base}/`);
  eq(res.status(), 200, 'GET /');
  await page.waitForSelector('#server-state.up');
  eq(await page.textContent('#server-state'), 'minimax-m3-tiny', 'model name in the top bar');
  check((await page.textContent('.empty h1')).includes('minimax-m3-tiny'), 'empty conversation names the model');
  eq(await page.getAttribute('#tab-chat', 'aria-current'), 'page', 'chat tab current');
  eq((await (await fetch(`${base}/ui/info`)).json()).prefix_caching, true, 'prefix caching is on by default');
}, shot);

await section('a message gets a streamed reply with its reasoning folded apart', async () => {
  await setSettings(page, { thinking: false, max_tokens: 200, extra: JSON.stringify(SHAPED) });
  await recordReplies(page);
  await page.fill('#input', 'What is 2 + 3? Answer briefly.');
  await page.press('#input', 'Enter');
  eq(await page.textContent('.msg.user .bubble'), 'What is 2 + 3? Answer briefly.', 'the user message');
  await page.waitForSelector(`${lastReply}[data-state="done"]`, { timeout: 60000 });
  const rec = await page.evaluate(() => window.__rec);
  const streaming = rec.filter((r) => r.state === 'streaming');
  const reasoningSteps = new Set(streaming.map((r) => r.reasoning).filter((n) => n > 0));
  const contentSteps = new Set(streaming.map((r) => r.content).filter((n) => n > 0));
  check(reasoningSteps.size >= 3, 'the reasoning grew while streaming', [...reasoningSteps]);
  check(contentSteps.size >= 3, 'the answer grew while streaming', [...contentSteps]);
  const firstContent = streaming.findIndex((r) => r.content > 0);
  const firstReasoning = streaming.findIndex((r) => r.reasoning > 0);
  check(firstReasoning >= 0 && firstReasoning < firstContent, 'reasoning came before the answer', { firstReasoning, firstContent });

  const details = page.locator(`${lastReply} details.reasoning`);
  eq(await details.count(), 1, 'one reasoning fold');
  eq(await details.evaluate((d) => d.open), false, 'the reasoning is folded');
  check(/^Thought for \d+\.\d s$/.test(await details.locator('summary').textContent()), 'fold label',
    await details.locator('summary').textContent());
  const reasoning = await details.locator('.reasoning-text').textContent();
  check(/^[a-z ]{20,60}$/.test(reasoning), 'reasoning text (without the tags)', reasoning);
  const content = await page.textContent(`${lastReply} .content`);
  check(!content.includes('think') && !content.includes(reasoning.trim()), 'the answer is apart from the reasoning', content);
  eq(await page.locator(`${lastReply} .content strong`).count(), 1, 'markdown bold rendered');
  eq(await page.textContent(`${lastReply} .code-lang`), 'python', 'code block language');
  check(/^print\(\d{1,3}\)$/.test(await page.textContent(`${lastReply} pre code`)), 'code block text');
  eq(await page.locator(`${lastReply} .tok-number`).count(), 1, 'code highlighted');
  const tokens = Number(await page.locator(`${lastReply} [data-stat="completion_tokens"] b`).textContent());
  check(tokens > 10 && tokens <= 200, 'token count', tokens);
  check(Number(await page.locator(`${lastReply} [data-stat="prompt_tokens"] b`).textContent()) > 5, 'prompt token count');
  check(/^\d+\.\d tok\/s$/.test((await stat(page, 'tokens_per_second')).trim()), 'speed', await stat(page, 'tokens_per_second'));
  check(/ms to first token/.test(await stat(page, 'ttft_ms')), 'time to first token');
  eq(await stat(page, 'finish'), 'finished', 'finish reason');
  eq(await page.textContent('#conversations li.active .title'), 'What is 2 + 3? Answer briefly.', 'conversation title');
}, shot);

await section('copy and regenerate', async () => {
  await page.context().grantPermissions(['clipboard-read', 'clipboard-write'], { origin: base });
  await page.click(`${lastReply} [data-action="copy"]`);
  const copied = await page.evaluate(() => navigator.clipboard.readText());
  check(copied.includes('**') && copied.includes('```python'), 'the reply is copied as markdown', copied);
  const before = await page.textContent(`${lastReply} .content`);
  await page.click(`${lastReply} [data-action="regenerate"]`);
  await page.waitForSelector(`${lastReply}[data-state="streaming"]`);
  await page.waitForSelector(`${lastReply}[data-state="done"]`, { timeout: 60000 });
  eq(await page.locator('.msg.assistant').count(), 1, 'the reply was replaced, not added');
  eq(await page.locator('.msg.user').count(), 1, 'the question stays');
  check((await page.textContent(`${lastReply} .content`)) !== before, 'a new reply (sampled again)');
}, shot);

await section('stop aborts the reply on the server', async () => {
  const aborts = async () => Number(((await (await fetch(`${base}/metrics`)).text())
    .match(/sieve:request_success_total\{[^}]*finished_reason="abort"\} (\d+)/) || [])[1]);
  const m0 = await metrics(base);
  const a0 = await aborts();
  await setSettings(page, { thinking: true, max_tokens: 1500, extra: JSON.stringify({ ignore_eos: true }) });
  await page.click('#new-chat');
  await page.fill('#input', 'Tell me a long story.');
  await page.press('#input', 'Enter');
  await page.waitForFunction(() => {
    const m = [...document.querySelectorAll('.msg.assistant')].pop();
    return m && m.dataset.state === 'streaming' && (m.querySelector('.reasoning-text')?.textContent.length ?? 0) > 20;
  });
  check(await page.isVisible('#stop'), 'stop button shown while streaming');
  eq(await page.textContent(`${lastReply} details.reasoning summary`), 'Thinking', 'label while thinking');
  await page.click('#stop');
  await page.waitForSelector(`${lastReply}[data-state="stopped"]`);
  eq(await stat(page, 'finish'), 'stopped', 'marked as stopped');
  check(await page.isVisible('#send'), 'send button back');
  const m1 = await waitIdle(base, 15000);
  eq(await aborts() - a0, 1, 'the server aborted the request');
  const generated = m1['sieve:generation_tokens_total'] - m0['sieve:generation_tokens_total'];
  check(generated < 1500, 'generation stopped early', generated);
}, shot);

await section('tool calls are shown as calls and answered', async () => {
  await setSettings(page, { thinking: false, max_tokens: 120, tools: JSON.stringify(TOOLS), extra: JSON.stringify({ tool_choice: 'required' }) });
  await page.click('#new-chat');
  await page.fill('#input', 'What is the weather in Paris?');
  await page.press('#input', 'Enter');
  await page.waitForSelector(`${lastReply}[data-state="done"]`, { timeout: 60000 });
  eq(await page.locator(`${lastReply} .tool-call`).count() >= 1, true, 'a tool call card');
  eq(await page.textContent(`${lastReply} .tool-call .fn`), 'get_weather', 'function name');
  const args = JSON.parse(await page.textContent(`${lastReply} .tool-call pre`));
  check(['Paris', 'London', 'Tokyo'].includes(args.city), 'arguments as JSON', args);
  eq(await stat(page, 'finish'), 'tool calls', 'finish reason');
  await setSettings(page, { thinking: false, max_tokens: 16, tools: JSON.stringify(TOOLS) });
  await page.fill(`${lastReply} .tool-call form input`, '21 C and sunny');
  await page.click(`${lastReply} .tool-call form button`);
  await page.waitForSelector('.msg.tool');
  eq(await page.textContent('.msg.tool .bubble'), '21 C and sunny', 'the tool result is in the conversation');
  await page.waitForFunction(() => document.querySelectorAll('.msg.assistant').length === 2 &&
    [...document.querySelectorAll('.msg.assistant')].pop().dataset.state === 'done', null, { timeout: 60000 });
}, shot);

await section('markdown renders safely', async () => {
  const html = await page.evaluate(async () => {
    const { renderMarkdown } = await import('/assets/markdown.js');
    const cases = {
      script: '<script>alert(1)</script> <img src=x onerror=alert(1)> <b onclick="x()">b</b>',
      jslink: '[click](javascript:alert(1)) [data](data:text/html,x) ![img](https://example.com/a.png) [ok](https://example.com/a_(b))',
      heading: '# Title\n\nSome *em*, **strong**, ~~gone~~, `co*de*` and snake_case_name.',
      lists: '- a\n  - b\n- c\n\n1. one\n2. two\n\n- [x] done\n- [ ] todo',
      table: '| x | y |\n|:--|--:|\n| 1 | <i>2</i> |',
      fence: 'text\n```js\nconst s = "<b>"; // note\n',
      quote: '> quoted **bold**\n> more\n\n---\nend  \nline',
      auto: 'see https://example.com/x. and <https://example.org> or www.example.net',
    };
    const out = {};
    for (const [k, v] of Object.entries(cases)) {
      const d = document.createElement('div');
      d.append(renderMarkdown(v));
      out[k] = d.innerHTML;
    }
    return out;
  });
  for (const [k, h] of Object.entries(html)) {
    check(!/<(script|img|iframe|b |i>|style)/i.test(h), `no raw markup from ${k}`, h);
    check(!/\son\w+=/i.test(h.replace(/&[a-z]+;/g, '').replace(/>[^<]*</g, '><')), `no event handler attributes from ${k}`, h);
    check(!/href="(?!https?:|mailto:)/.test(h), `only web links from ${k}`, h);
  }
  check(html.script.includes('&lt;script&gt;alert(1)&lt;/script&gt;'), 'HTML shown as text', html.script);
  check(!html.jslink.includes('javascript') || !html.jslink.includes('href="javascript'), 'no javascript: link', html.jslink);
  check(html.jslink.includes('<a href="https://example.com/a_(b)"'), 'link with parentheses', html.jslink);
  check(html.jslink.includes('<a href="https://example.com/a.png"'), 'an image becomes a link', html.jslink);
  eq(html.heading, '<h3>Title</h3><p>Some <em>em</em>, <strong>strong</strong>, <del>gone</del>, <code>co*de*</code> and snake_case_name.</p>', 'inline');
  check(html.lists.startsWith('<ul><li>a<ul><li>b</li></ul></li><li>c</li></ul><ol><li>one</li><li>two</li></ol>'), 'nested lists', html.lists);
  check(html.lists.includes('<li class="task"><input type="checkbox" disabled="">'), 'task list', html.lists);
  check(html.table.includes('<th style="text-align: left;">x</th><th style="text-align: right;">y</th>'), 'table alignment', html.table);
  check(html.table.includes('<td style="text-align: right;">&lt;i&gt;2&lt;/i&gt;</td>'), 'table cell text', html.table);
  check(html.fence.includes('<span class="code-lang">js</span>') && html.fence.includes('<span class="tok-string">"&lt;b&gt;"</span>') &&
    html.fence.includes('<span class="tok-comment">// note</span>'), 'an unclosed fence (mid-stream) is code', html.fence);
  check(html.quote.startsWith('<blockquote><p>quoted <strong>bold</strong><br>more</p></blockquote><hr><p>end<br>line</p>'), 'quote, rule, break', html.quote);
  check(html.auto.includes('<a href="https://example.com/x"') && html.auto.includes('>https://example.com/x</a>.') &&
    html.auto.includes('<a href="https://example.org"') && html.auto.includes('<a href="https://www.example.net"'), 'autolinks', html.auto);
}, shot);

await section('conversations stay in the browser', async () => {
  await page.reload();
  await page.waitForSelector('#server-state.up');
  const titles = await page.locator('#conversations .title').allTextContents();
  check(titles.includes('What is 2 + 3? Answer briefly.') && titles.includes('Tell me a long story.'), 'kept after a reload', titles);
  await page.locator('#conversations li', { hasText: 'What is 2 + 3?' }).click();
  eq(await page.locator('.msg.assistant').count(), 1, 'its messages are back');
  check((await page.textContent('.msg.assistant .content')).length > 10, 'with the reply');
  const n = await page.locator('#conversations li').count();
  await page.locator('#conversations li.active .del').click();
  eq(await page.locator('#conversations li').count(), n - 1, 'deleted');
}, shot);

await section('the dashboard shows the server moving', async () => {
  await page.click('#tab-dashboard');
  eq(new URL(page.url()).pathname, '/dashboard', 'address');
  await page.waitForSelector('[data-card="generated"] .value[data-value]');
  const read = (card) => page.evaluate((c) => Number(document.querySelector(`[data-card="${c}"] .value`).dataset.value), card);
  const gen0 = await read('generated');
  const fin0 = await read('finished');
  check(gen0 > 0, 'earlier replies counted', gen0);
  // A long request: the running gauge shows it, then the counters move.
  const ctl = new AbortController();
  const req = fetch(`${base}/v1/completions`, { method: 'POST', signal: ctl.signal, headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: 'Call me Ishmael.', max_tokens: 300, ignore_eos: true, stream: true }) }).then((r) => r.text()).catch(() => '');
  await page.waitForFunction(() => document.querySelector('[data-card="running"] .value').dataset.value === '1', null, { timeout: 20000 });
  await req;
  await page.waitForFunction((g) => Number(document.querySelector('[data-card="generated"] .value').dataset.value) >= g + 300, gen0, { timeout: 20000 });
  await page.waitForFunction((f) => Number(document.querySelector('[data-card="finished"] .value').dataset.value) >= f + 1, fin0, { timeout: 20000 });
  await page.waitForFunction(() => document.querySelector('[data-card="running"] .value').dataset.value === '0', null, { timeout: 20000 });
  check(await page.locator('[data-chart="throughput"] path.line').count() >= 1, 'throughput drawn');
  check(await page.locator('[data-chart="ttft"] path.line').count() >= 1, 'TTFT drawn');
  check(/\d/.test(await page.textContent('[data-card="ttft"] .value')), 'TTFT value', await page.textContent('[data-card="ttft"] .value'));
  check(/\d/.test(await page.textContent('[data-card="tpot"] .value')), 'TPOT value');
  eq(await page.locator('[data-card="spec"]').isHidden(), true, 'no speculative card without speculative metrics');
  check((await page.textContent('#dash-info')).includes('Prefix caching'), 'server facts');
  await page.click('#tab-chat');
  eq(new URL(page.url()).pathname, '/', 'back to the chat');
}, shot);

await section('a narrow phone screen', async () => {
  const phone = await newPage(browser, { viewport: { width: 390, height: 780 }, colorScheme: 'dark' });
  const old = page;
  page = phone;
  await phone.goto(`${base}/`);
  await phone.waitForSelector('#server-state.up', { state: 'attached' });
  const box = await phone.locator('#sidebar').boundingBox();
  check(box.x + box.width <= 1, 'the conversation list is tucked away', box);
  await phone.click('#menu-toggle');
  await phone.waitForFunction(() => document.getElementById('sidebar').getBoundingClientRect().x >= 0);
  const bg = await phone.evaluate(() => getComputedStyle(document.body).backgroundColor);
  eq(bg, 'rgb(22, 23, 27)', 'dark colours follow the system');
  check((await phone.evaluate(() => document.documentElement.scrollWidth)) <= 390, 'nothing wider than the screen');
  eq(phone.problems, [], 'no errors on the phone page');
  await phone.context().close();
  page = old;
}, shot);

eq(page.problems, [], 'no script errors on the page');
await browser.close();

// The page asks for the API key the server needs.
await section('API key', async () => {
  const keyed = await startServer(sieve, ['--api-key', 'sk-web', '--kv-cache-memory', '64MiB']);
  const b2 = await launch(chromiumPath);
  page = await newPage(b2);
  try {
    await page.goto(`${keyed.base}/`);
    await page.waitForSelector('#key-banner:not([hidden])');
    eq(await page.locator('#key-required').evaluate((e) => e.hidden), false, 'settings mark the key as required');
    await page.fill('#key-banner-input', 'wrong');
    await page.click('#key-banner-save');
    await page.waitForFunction(() => document.querySelector('#key-banner span').textContent.includes('refused'));
    await page.fill('#key-banner-input', 'sk-web');
    await page.click('#key-banner-save');
    await page.waitForSelector('#key-banner', { state: 'hidden' });
    await setSettings(page, { thinking: false, max_tokens: 8 });
    await page.fill('#input', 'Hello');
    await page.press('#input', 'Enter');
    await page.waitForSelector(`${lastReply}[data-state="done"]`, { timeout: 60000 });
    eq(await stat(page, 'finish'), 'length limit', 'the keyed request ran');
  } finally {
    await b2.close();
    await stopServer(keyed);
  }
}, shot);

const r = await stopServer(srv);
eq(r.code, 0, 'server exit code');
process.exit(summary());
