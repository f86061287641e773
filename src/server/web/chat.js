// The chat view: conversations kept in this browser, streamed replies with their reasoning
// folded apart, tool calls shown as calls, per-reply token counts and speed.
import { ApiError, apiKey, getJson, setApiKey, streamJson } from './api.js';
import { renderMarkdown } from './markdown.js';

const STORE = 'sieve.conversations';
const CURRENT = 'sieve.current';
const SETTINGS = 'sieve.settings';
const SAMPLING = ['temperature', 'top_p', 'top_k', 'min_p', 'repetition_penalty', 'max_tokens', 'seed'];

const $ = (id) => document.getElementById(id);

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function uid() {
  return Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
}

function load(key, fallback) {
  try {
    const v = JSON.parse(localStorage.getItem(key));
    return v ?? fallback;
  } catch {
    return fallback;
  }
}

function save(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
  } catch {
    // storage full or disabled: the conversation still lives in this tab
  }
}

// Clipboard access needs a secure context (https or localhost); elsewhere a hidden text area.
export async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    try {
      await navigator.clipboard.writeText(text);
      return true;
    } catch {
      // fall through
    }
  }
  const ta = el('textarea');
  ta.value = text;
  ta.setAttribute('readonly', '');
  ta.style.position = 'fixed';
  ta.style.opacity = '0';
  document.body.append(ta);
  ta.select();
  let ok = false;
  try {
    ok = document.execCommand('copy');
  } catch {
    ok = false;
  }
  ta.remove();
  return ok;
}

function flash(button, text) {
  const old = button.textContent;
  button.textContent = text;
  setTimeout(() => { button.textContent = old; }, 1200);
}

function fmt(n, digits = 1) {
  if (n === undefined || n === null || !isFinite(n)) return '–';
  return n.toFixed(digits);
}

function prettyArgs(args) {
  try {
    return JSON.stringify(JSON.parse(args), null, 2);
  } catch {
    return args;
  }
}

export class Chat {
  constructor() {
    this.conversations = load(STORE, []);
    this.currentId = load(CURRENT, null);
    this.settings = load(SETTINGS, { thinking: true });
    this.info = null;
    this.models = [];
    this.controller = null;  // the running request's AbortController
    this.streaming = null;   // {conv, msg, node}
    this.renderQueued = false;
    if (!this.current()) this.newConversation(false);
    this.bind();
    this.renderSidebar();
    this.renderMessages();
    this.loadSettingsForm();
  }

  // --- state --------------------------------------------------------------------------------

  current() {
    return this.conversations.find((c) => c.id === this.currentId) || null;
  }

  persist() {
    // Drop empty conversations other than the current one.
    this.conversations = this.conversations.filter((c) => c.messages.length || c.id === this.currentId);
    save(STORE, this.conversations);
    save(CURRENT, this.currentId);
  }

  newConversation(render = true) {
    const cur = this.current();
    if (cur && !cur.messages.length) {
      if (render) $('input').focus();
      return;
    }
    const c = { id: uid(), title: 'New chat', created: Date.now(), messages: [] };
    this.conversations.unshift(c);
    this.currentId = c.id;
    this.persist();
    if (render) {
      this.renderSidebar();
      this.renderMessages();
      $('input').focus();
    }
  }

  select(id) {
    if (this.streaming) this.stop();
    this.currentId = id;
    this.persist();
    this.renderSidebar();
    this.renderMessages();
    document.body.classList.remove('show-sidebar');
  }

  remove(id) {
    if (this.streaming && this.streaming.conv.id === id) this.stop();
    this.conversations = this.conversations.filter((c) => c.id !== id);
    if (this.currentId === id) this.currentId = this.conversations[0]?.id ?? null;
    if (!this.current()) this.newConversation(false);
    this.persist();
    this.renderSidebar();
    this.renderMessages();
  }

  // --- server -------------------------------------------------------------------------------

  async connect() {
    const state = $('server-state');
    try {
      this.info = await getJson('/ui/info');
      state.className = 'server-state up';
      state.textContent = this.info.model;
      state.title = `${this.info.model} on ${this.info.device || 'the server'}`;
    } catch (e) {
      state.className = 'server-state down';
      state.textContent = 'server unreachable';
      return;
    }
    $('key-required').hidden = !this.info.api_key_required;
    if (this.info.api_key_required && !apiKey()) this.showKeyBanner();
    this.showDefaults();
    await this.loadModels();
    this.renderMessages();
  }

  async loadModels() {
    try {
      const r = await getJson('/v1/models');
      this.models = (r.data || []).map((m) => m.id);
      $('key-banner').hidden = true;
    } catch (e) {
      if (e instanceof ApiError && e.status === 401) this.showKeyBanner(apiKey() ? 'The API key was refused.' : null);
      this.models = this.info ? [this.info.model] : [];
    }
    const sel = $('set-model');
    sel.replaceChildren(...this.models.map((m) => {
      const o = el('option', null, m);
      o.value = m;
      return o;
    }));
    if (this.settings.model && this.models.includes(this.settings.model)) sel.value = this.settings.model;
  }

  showKeyBanner(note) {
    const b = $('key-banner');
    b.hidden = false;
    b.querySelector('span').textContent = note || 'This server needs an API key.';
  }

  showDefaults() {
    const d = this.info?.defaults || {};
    const ph = {
      temperature: d.temperature, top_p: d.top_p, top_k: d.top_k || 'off', min_p: d.min_p,
      repetition_penalty: d.repetition_penalty, max_tokens: d.max_tokens || 'to the end',
    };
    for (const [k, v] of Object.entries(ph)) if (v !== undefined) $('set-' + k).placeholder = `server: ${v}`;
    const i = this.info;
    if (i) {
      const facts = [`${i.model}`, `context ${i.max_model_len} tokens`,
        i.reasoning_parser ? `reasoning parser ${i.reasoning_parser}` : 'no reasoning parser',
        i.tool_parser ? `tool parser ${i.tool_parser}` : 'no tool parser'];
      $('server-facts').textContent = facts.join(' · ');
    }
  }

  // --- settings -----------------------------------------------------------------------------

  loadSettingsForm() {
    const s = this.settings;
    $('set-api-key').value = apiKey();
    $('set-system').value = s.system || '';
    $('set-thinking').checked = s.thinking !== false;
    for (const k of SAMPLING) $('set-' + k).value = s[k] ?? '';
    $('set-stop').value = s.stop || '';
    $('set-tools').value = s.tools || '';
    $('set-extra').value = s.extra || '';
  }

  readSettingsForm() {
    const s = { model: $('set-model').value || this.settings.model };
    s.system = $('set-system').value;
    s.thinking = $('set-thinking').checked;
    for (const k of SAMPLING) {
      const v = $('set-' + k).value.trim();
      if (v !== '' && isFinite(Number(v))) s[k] = Number(v);
    }
    s.stop = $('set-stop').value;
    s.tools = $('set-tools').value;
    s.extra = $('set-extra').value;
    this.settings = s;
    save(SETTINGS, s);
    const key = $('set-api-key').value.trim();
    if (key !== apiKey()) {
      setApiKey(key);
      this.loadModels();
    }
    this.toolsError();
  }

  // More request fields from the settings (an object), or throws with what is wrong.
  extra() {
    const t = (this.settings.extra || '').trim();
    if (!t) return {};
    let v;
    try {
      v = JSON.parse(t);
    } catch (e) {
      throw new Error(`More request fields: not JSON (${e.message})`);
    }
    if (!v || typeof v !== 'object' || Array.isArray(v)) throw new Error('More request fields: expected a JSON object');
    return v;
  }

  // The tools the settings give, or throws with what is wrong.
  tools() {
    const t = (this.settings.tools || '').trim();
    if (!t) return null;
    let v;
    try {
      v = JSON.parse(t);
    } catch (e) {
      throw new Error(`Tools: not JSON (${e.message})`);
    }
    if (!Array.isArray(v)) v = [v];
    for (const tool of v) {
      if (!tool || typeof tool !== 'object') throw new Error('Tools: each tool must be an object');
      if (!tool.type && tool.name) return v.map((x) => ({ type: 'function', function: x }));
    }
    return v;
  }

  // Shows what is wrong with the tools or the extra fields; returns the first message or null.
  toolsError() {
    let first = null;
    for (const [id, f] of [['set-tools-error', () => this.tools()], ['set-extra-error', () => this.extra()]]) {
      const p = $(id);
      try {
        f();
        p.hidden = true;
      } catch (e) {
        p.hidden = false;
        p.textContent = e.message;
        first = first || e.message;
      }
    }
    return first;
  }

  // --- requests -----------------------------------------------------------------------------

  requestBody(conv) {
    const s = this.settings;
    const messages = [];
    if (s.system && s.system.trim()) messages.push({ role: 'system', content: s.system });
    for (const m of conv.messages) {
      if (m.role === 'user') messages.push({ role: 'user', content: m.content });
      else if (m.role === 'tool') messages.push({ role: 'tool', tool_call_id: m.toolCallId, content: m.content });
      else if (m.role === 'assistant' && !m.error) {
        const a = { role: 'assistant', content: m.content || (m.toolCalls?.length ? null : '') };
        if (m.reasoning) a.reasoning = m.reasoning;
        if (m.toolCalls?.length) {
          a.tool_calls = m.toolCalls.map((c) => ({ id: c.id, type: 'function', function: { name: c.name, arguments: c.arguments } }));
        }
        messages.push(a);
      }
    }
    const body = {
      model: s.model || this.models[0] || this.info?.model,
      messages,
      stream: true,
      stream_options: { include_usage: true, continuous_usage_stats: true },
      chat_template_kwargs: { enable_thinking: s.thinking !== false },
    };
    for (const k of SAMPLING) if (s[k] !== undefined && s[k] !== null && s[k] !== '') body[k] = s[k];
    const stop = (s.stop || '').split(',').map((x) => x.trim()).filter(Boolean);
    if (stop.length) body.stop = stop;
    const tools = this.tools();
    if (tools) body.tools = tools;
    return Object.assign(body, this.extra());
  }

  async send(text) {
    text = text.trim();
    if (!text || this.streaming) return;
    if (this.toolsError()) {
      $('settings').hidden = false;
      return;
    }
    const conv = this.current();
    conv.messages.push({ id: uid(), role: 'user', content: text, time: Date.now() });
    if (conv.title === 'New chat') conv.title = text.replace(/\s+/g, ' ').slice(0, 48);
    this.persist();
    this.renderSidebar();
    this.renderMessages();
    await this.generate(conv);
  }

  async generate(conv) {
    let body;
    try {
      body = this.requestBody(conv);
    } catch (e) {
      conv.messages.push({ id: uid(), role: 'assistant', content: '', error: e.message });
      this.renderMessages();
      return;
    }
    const msg = { id: uid(), role: 'assistant', content: '', reasoning: '', toolCalls: [], model: body.model, stats: {}, time: Date.now() };
    conv.messages.push(msg);
    this.controller = new AbortController();
    this.streaming = { conv, msg };
    this.setBusy(true);
    this.renderMessages();
    const st = msg.stats;
    const t0 = performance.now();
    let tFirst = null, tContent = null, tLast = null;
    try {
      for await (const chunk of streamJson('/v1/chat/completions', body, { signal: this.controller.signal })) {
        const now = performance.now();
        if (chunk.usage) {
          st.promptTokens = chunk.usage.prompt_tokens;
          st.completionTokens = chunk.usage.completion_tokens;
        }
        for (const ch of chunk.choices || []) {
          const d = ch.delta || {};
          const r = d.reasoning ?? d.reasoning_content;
          const got = !!(r || d.content || d.tool_calls?.length);
          if (got && tFirst === null) tFirst = now;
          if (got) tLast = now;
          if (r) msg.reasoning += r;
          if (d.content) {
            if (tContent === null) tContent = now;
            msg.content += d.content;
          }
          for (const tc of d.tool_calls || []) {
            const i = tc.index ?? msg.toolCalls.length;
            const call = msg.toolCalls[i] || (msg.toolCalls[i] = { id: '', name: '', arguments: '' });
            if (tc.id) call.id = tc.id;
            if (tc.function?.name) call.name += tc.function.name;
            if (tc.function?.arguments) call.arguments += tc.function.arguments;
          }
          if (ch.finish_reason) st.finish = ch.finish_reason;
        }
        st.ttftMs = tFirst !== null ? tFirst - t0 : undefined;
        if (tFirst !== null && tLast > tFirst && st.completionTokens > 1) {
          st.tokPerS = (st.completionTokens - 1) / ((tLast - tFirst) / 1000);
        }
        st.reasoningMs = tFirst !== null && msg.reasoning ? (tContent ?? tLast) - tFirst : undefined;
        this.queueRender();
      }
    } catch (e) {
      if (e.name === 'AbortError') {
        st.finish = 'abort';
      } else {
        msg.error = e.message || String(e);
        if (e instanceof ApiError && e.status === 401) this.showKeyBanner(apiKey() ? 'The API key was refused.' : null);
      }
    }
    st.totalMs = performance.now() - t0;
    msg.toolCalls = msg.toolCalls.filter(Boolean);
    this.controller = null;
    this.streaming = null;
    this.setBusy(false);
    this.persist();
    this.renderMessages();
  }

  stop() {
    if (this.controller) this.controller.abort();
  }

  regenerate() {
    const conv = this.current();
    if (this.streaming || !conv) return;
    while (conv.messages.length && conv.messages[conv.messages.length - 1].role === 'assistant') conv.messages.pop();
    if (!conv.messages.length) return;
    this.generate(conv);
  }

  sendToolResult(msg, call, text) {
    const conv = this.current();
    conv.messages.push({ id: uid(), role: 'tool', toolCallId: call.id, toolName: call.name, content: text });
    this.persist();
    const answered = new Set(conv.messages.filter((m) => m.role === 'tool').map((m) => m.toolCallId));
    if (msg.toolCalls.every((c) => answered.has(c.id))) this.generate(conv);
    else this.renderMessages();
  }

  setBusy(busy) {
    $('send').hidden = busy;
    $('stop').hidden = !busy;
  }

  // --- rendering ----------------------------------------------------------------------------

  renderSidebar() {
    const ul = $('conversations');
    ul.replaceChildren(...this.conversations.filter((c) => c.messages.length || c.id === this.currentId).map((c) => {
      const li = el('li', c.id === this.currentId ? 'active' : '');
      li.dataset.id = c.id;
      li.append(el('span', 'title', c.title));
      const del = el('button', 'del', '×');
      del.type = 'button';
      del.title = 'Delete conversation';
      del.setAttribute('aria-label', 'Delete conversation');
      del.addEventListener('click', (ev) => {
        ev.stopPropagation();
        this.remove(c.id);
      });
      li.append(del);
      li.addEventListener('click', () => this.select(c.id));
      return li;
    }));
  }

  renderMessages() {
    const box = $('messages');
    const conv = this.current();
    if (!conv || !conv.messages.length) {
      box.replaceChildren(this.emptyState());
      return;
    }
    const stick = this.nearBottom();
    const lastAssistant = [...conv.messages].reverse().find((m) => m.role === 'assistant');
    box.replaceChildren(...conv.messages.map((m) => this.messageNode(m, m === lastAssistant)));
    if (stick || this.streaming) box.scrollTop = box.scrollHeight;
  }

  nearBottom() {
    const box = $('messages');
    return box.scrollHeight - box.scrollTop - box.clientHeight < 80;
  }

  // Coalesces a stream's updates to one repaint per frame.
  queueRender() {
    if (this.renderQueued) return;
    this.renderQueued = true;
    requestAnimationFrame(() => {
      this.renderQueued = false;
      if (!this.streaming) return;
      const node = document.querySelector(`.msg[data-id="${this.streaming.msg.id}"]`);
      if (!node) return;
      const stick = this.nearBottom();
      node.replaceWith(this.messageNode(this.streaming.msg, true, node));
      if (stick) $('messages').scrollTop = $('messages').scrollHeight;
    });
  }

  emptyState() {
    const d = el('div', 'empty');
    d.append(el('h1', null, this.info ? `Chat with ${this.info.model}` : 'Sieve'));
    d.append(el('p', null, this.info
      ? `Replies stream from this server${this.info.reasoning_parser ? '; the model\'s reasoning is folded above each answer' : ''}.`
      : 'Connecting to the server…'));
    const sug = el('div', 'suggestions');
    for (const s of ['Explain prefix caching in two sentences.', 'Write a Python function that merges two sorted lists.',
      'What is 17 × 23? Think step by step.']) {
      const b = el('button', null, s);
      b.type = 'button';
      b.addEventListener('click', () => this.send(s));
      sug.append(b);
    }
    d.append(sug);
    return d;
  }

  messageNode(m, isLastAssistant, old) {
    const streaming = this.streaming && this.streaming.msg === m;
    const node = el('div', `msg ${m.role}${m.error ? ' error' : ''}${streaming ? ' streaming' : ''}`);
    node.dataset.id = m.id;
    node.dataset.state = streaming ? 'streaming' : m.error ? 'error' : m.stats?.finish === 'abort' ? 'stopped' : 'done';
    if (m.role === 'assistant') node.append(el('div', 'role', m.model || 'assistant'));
    if (m.role === 'tool') node.append(el('div', 'role', `tool result${m.toolName ? ' · ' + m.toolName : ''}`));
    const bubble = el('div', 'bubble');
    node.append(bubble);
    if (m.role === 'user') {
      bubble.textContent = m.content;
    } else if (m.role === 'tool') {
      const pre = el('pre', null, m.content);
      pre.className = 'tool-result';
      bubble.append(pre);
    } else {
      if (m.reasoning) bubble.append(this.reasoningNode(m, streaming, old));
      const content = el('div', 'content');
      content.append(renderMarkdown(m.content, { onCopy: (code, btn) => copyText(code).then((ok) => flash(btn, ok ? 'Copied' : 'Copy failed')) }));
      if (streaming && !m.toolCalls.length) {
        const last = content.lastElementChild;
        const cursor = el('span', 'cursor');
        if (last && /^(P|LI)$/.test(last.tagName)) last.append(cursor);
        else if (last && /^(UL|OL)$/.test(last.tagName) && last.lastElementChild) last.lastElementChild.append(cursor);
        else content.append(cursor);
      }
      bubble.append(content);
      for (const call of m.toolCalls || []) bubble.append(this.toolCallNode(m, call, isLastAssistant && !streaming));
      if (m.error) bubble.append(el('p', 'error-text', m.error));
    }
    node.append(this.metaNode(m, isLastAssistant, streaming));
    return node;
  }

  reasoningNode(m, streaming, old) {
    const det = el('details', 'reasoning');
    // The fold keeps whatever the reader chose while the reply streams.
    const was = old?.querySelector('details.reasoning');
    if (was) det.open = was.open;
    const sum = el('summary');
    const label = el('span', 'label');
    const answering = !!(m.content || m.toolCalls?.length);
    label.textContent = streaming && !answering ? 'Thinking'
      : m.stats?.reasoningMs !== undefined ? `Thought for ${fmt(m.stats.reasoningMs / 1000)} s` : 'Reasoning';
    sum.append(label);
    det.append(sum, el('div', 'reasoning-text', m.reasoning));
    return det;
  }

  toolCallNode(m, call, canAnswer) {
    const box = el('div', 'tool-call');
    const head = el('div', 'tool-head');
    head.append(el('span', null, 'Tool call'), el('span', 'fn', call.name || '…'));
    if (call.id) head.append(el('span', 'muted small', call.id));
    box.append(head, el('pre', null, prettyArgs(call.arguments)));
    const conv = this.current();
    const answered = conv && conv.messages.some((x) => x.role === 'tool' && x.toolCallId === call.id);
    if (canAnswer && !answered) {
      const f = el('form');
      const input = el('input');
      input.placeholder = `Result of ${call.name} (sent back as a tool message)`;
      const b = el('button', 'btn', 'Send result');
      b.type = 'submit';
      f.append(input, b);
      f.addEventListener('submit', (ev) => {
        ev.preventDefault();
        if (input.value.trim()) this.sendToolResult(m, call, input.value.trim());
      });
      box.append(f);
    }
    return box;
  }

  metaNode(m, isLastAssistant, streaming) {
    const meta = el('div', 'meta');
    const st = m.stats || {};
    const stat = (name, value, label) => {
      const s = el('span', 'stat');
      s.dataset.stat = name;
      const b = el('b', null, value);
      s.append(b, ' ' + label);
      meta.append(s);
    };
    if (m.role === 'assistant') {
      if (st.promptTokens !== undefined) stat('prompt_tokens', String(st.promptTokens), 'prompt');
      if (st.completionTokens !== undefined) stat('completion_tokens', String(st.completionTokens), 'tokens');
      if (st.tokPerS !== undefined) stat('tokens_per_second', fmt(st.tokPerS), 'tok/s');
      if (st.ttftMs !== undefined) stat('ttft_ms', String(Math.round(st.ttftMs)), 'ms to first token');
      if (!streaming && st.finish) {
        const names = { stop: 'finished', length: 'length limit', abort: 'stopped', tool_calls: 'tool calls' };
        const f = el('span', `finish finish-${st.finish}`, names[st.finish] || st.finish);
        f.dataset.stat = 'finish';
        meta.append(f);
      }
    }
    const actions = el('div', 'actions');
    if (!streaming && (m.content || m.role === 'user' || m.reasoning)) {
      const copy = el('button', null, 'Copy');
      copy.type = 'button';
      copy.dataset.action = 'copy';
      copy.addEventListener('click', () => copyText(m.content || m.reasoning).then((ok) => flash(copy, ok ? 'Copied' : 'Copy failed')));
      actions.append(copy);
    }
    if (m.role === 'assistant' && isLastAssistant && !streaming && !this.streaming) {
      const regen = el('button', null, 'Regenerate');
      regen.type = 'button';
      regen.dataset.action = 'regenerate';
      regen.addEventListener('click', () => this.regenerate());
      actions.append(regen);
    }
    meta.append(actions);
    return meta;
  }

  // --- events -------------------------------------------------------------------------------

  bind() {
    const input = $('input');
    const grow = () => {
      input.style.height = 'auto';
      input.style.height = Math.min(input.scrollHeight, window.innerHeight * 0.4) + 'px';
    };
    input.addEventListener('input', grow);
    input.addEventListener('keydown', (ev) => {
      if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) {
        ev.preventDefault();
        $('composer').requestSubmit();
      } else if (ev.key === 'Escape' && this.streaming) {
        this.stop();
      }
    });
    $('composer').addEventListener('submit', (ev) => {
      ev.preventDefault();
      const text = input.value;
      if (!text.trim() || this.streaming) return;
      input.value = '';
      grow();
      this.send(text);
    });
    $('stop').addEventListener('click', () => this.stop());
    $('new-chat').addEventListener('click', () => {
      this.newConversation();
      document.body.classList.remove('show-sidebar');
    });
    $('menu-toggle').addEventListener('click', () => document.body.classList.toggle('show-sidebar'));
    $('settings-toggle').addEventListener('click', () => {
      const s = $('settings');
      s.hidden = !s.hidden;
      $('settings-toggle').setAttribute('aria-expanded', String(!s.hidden));
    });
    $('set-close').addEventListener('click', () => {
      this.readSettingsForm();
      if (!this.toolsError()) $('settings').hidden = true;
    });
    $('set-reset').addEventListener('click', () => {
      for (const k of SAMPLING) $('set-' + k).value = '';
      $('set-stop').value = '';
      this.readSettingsForm();
    });
    for (const id of ['set-system', 'set-thinking', 'set-model', 'set-stop', 'set-tools', 'set-extra', 'set-api-key', ...SAMPLING.map((k) => 'set-' + k)]) {
      $(id).addEventListener('change', () => this.readSettingsForm());
    }
    $('key-banner').addEventListener('submit', (ev) => {
      ev.preventDefault();
      const key = $('key-banner-input').value.trim();
      if (!key) return;
      setApiKey(key);
      $('set-api-key').value = key;
      $('key-banner-input').value = '';
      this.loadModels();
    });
  }
}
