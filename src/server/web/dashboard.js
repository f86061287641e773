// The dashboard: the server's own metrics (/ui/metrics, a history the server samples every
// second) as current values and charts over the last minutes. Counters become rates and
// histograms become windowed means and percentiles here, the way Prometheus' rate() and
// histogram_quantile() would compute them.
import { getJson } from './api.js';

const $ = (id) => document.getElementById(id);
const SVGNS = 'http://www.w3.org/2000/svg';
const RATE_S = 5;      // rates are averaged over this many seconds
const LATENCY_S = 30;  // latency statistics over this many seconds (for the charts)
const KEEP_S = 900;

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function svg(tag, attrs = {}) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  return e;
}

function fmtNum(v, digits) {
  if (v === null || v === undefined || !isFinite(v)) return '–';
  const a = Math.abs(v);
  if (digits === undefined) digits = a >= 100 ? 0 : a >= 10 ? 1 : 2;
  if (a >= 1e6) return (v / 1e6).toFixed(1) + 'M';
  if (a >= 1e4) return (v / 1e3).toFixed(1) + 'k';
  return v.toFixed(digits);
}

function fmtMs(seconds) {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) return ['–', ''];
  return seconds >= 1 ? [fmtNum(seconds, 2), 's'] : [fmtNum(seconds * 1000, seconds * 1000 >= 100 ? 0 : 1), 'ms'];
}

function fmtBytes(b) {
  if (!isFinite(b)) return '–';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (b >= 1024 && i < units.length - 1) b /= 1024, ++i;
  return `${b.toFixed(b >= 100 || i === 0 ? 0 : 1)} ${units[i]}`;
}

function niceTicks(max, n = 4) {
  if (!(max > 0)) max = 1;
  const raw = max / n;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  const ticks = [];
  for (let v = 0; v <= max + step * 1e-9; v += step) ticks.push(v);
  if (ticks[ticks.length - 1] < max) ticks.push(ticks[ticks.length - 1] + step);
  return ticks;
}

// The metrics history as the page keeps it: sample times and one array per series.
export class History {
  constructor() {
    this.t = [];
    this.series = {};
  }

  merge(h) {
    const n = this.t.length;
    const add = h.t.length;
    if (!add) return;
    for (const [name, vals] of Object.entries(h.series)) {
      if (!this.series[name]) this.series[name] = new Array(n).fill(null);
      this.series[name].push(...vals);
    }
    this.t.push(...h.t);
    for (const vals of Object.values(this.series)) while (vals.length < this.t.length) vals.push(null);
    const cut = this.t.findIndex((x) => x >= this.t[this.t.length - 1] - KEEP_S);
    if (cut > 0) {
      this.t.splice(0, cut);
      for (const vals of Object.values(this.series)) vals.splice(0, cut);
    }
  }

  get last() {
    return this.t.length - 1;
  }

  v(name, i = this.last) {
    const s = this.series[name];
    return s && i >= 0 ? s[i] : null;
  }

  has(name) {
    return name in this.series;
  }

  // The first sample at or after t[i] - seconds.
  back(i, seconds) {
    const from = this.t[i] - seconds;
    let j = i;
    while (j > 0 && this.t[j - 1] >= from - 1e-6) --j;
    return j;
  }

  // Increase of a counter from sample j to i; null across a restart (the counter fell).
  delta(name, j, i) {
    const a = this.v(name, j), b = this.v(name, i);
    if (a === null || b === null || b < a) return null;
    return b - a;
  }

  rate(name, i, seconds = RATE_S) {
    const j = this.back(i, seconds);
    if (j === i) return null;
    const d = this.delta(name, j, i);
    return d === null ? null : d / (this.t[i] - this.t[j]);
  }

  // Bucket bounds of a histogram, ascending, with +Inf last.
  bounds(hist) {
    this.boundsMemo ||= {};
    const memo = this.boundsMemo[hist];
    const n = Object.keys(this.series).length;
    if (memo && memo.n === n) return memo.list;
    const list = this.computeBounds(hist);
    this.boundsMemo[hist] = { n, list };
    return list;
  }

  computeBounds(hist) {
    const key = `${hist}_bucket{le="`;
    const les = Object.keys(this.series).filter((k) => k.startsWith(key)).map((k) => k.slice(key.length, -2));
    return les.map((le) => (le === '+Inf' ? Infinity : Number(le))).sort((a, b) => a - b)
      .map((b) => ({ b, key: key + (b === Infinity ? '+Inf' : les.find((le) => Number(le) === b)) + '"}' }));
  }

  // Observations of a histogram between samples j and i: count, mean and a quantile function.
  window(hist, j, i) {
    const count = this.delta(`${hist}_count`, j, i);
    const sum = this.delta(`${hist}_sum`, j, i);
    if (!count) return { count: count ?? 0, mean: null, q: () => null };
    const bs = this.bounds(hist).map(({ b, key }) => ({ b, c: this.delta(key, j, i) ?? 0 }));
    const q = (p) => {
      const rank = p * count;
      let prevB = 0, prevC = 0;
      for (const { b, c } of bs) {
        if (c >= rank) {
          if (b === Infinity) return prevB;  // as histogram_quantile: the highest finite bound
          return prevB + (b - prevB) * (c === prevC ? 0 : (rank - prevC) / (c - prevC));
        }
        prevB = b;
        prevC = c;
      }
      return prevB;
    };
    return { count, mean: sum / count, q };
  }
}

function card(key, label) {
  const c = el('div', 'card');
  c.dataset.card = key;
  c.append(el('div', 'label', label));
  const v = el('div', 'value');
  c.append(v, el('div', 'sub'));
  return c;
}

function setCard(c, value, unit, sub, raw, fraction) {
  const v = c.querySelector('.value');
  v.textContent = value;
  v.dataset.value = raw === null || raw === undefined ? '' : String(raw);
  if (unit) v.append(el('span', 'unit', unit));
  c.querySelector('.sub').textContent = sub || '';
  let bar = c.querySelector('.bar');
  if (fraction !== undefined) {
    if (!bar) {
      bar = el('div', 'bar');
      bar.append(el('div'));
      c.append(bar);
    }
    bar.firstChild.style.width = `${Math.max(0, Math.min(1, fraction || 0)) * 100}%`;
  }
}

// A line chart of several series over the time window. `lines`: [{name, color, values}] with
// values aligned to `t` (null: no value there).
function drawChart(box, t, lines, { unit = '', window, now, percent = false }) {
  const width = Math.max(box.clientWidth - 24, 200), height = 150;
  let max = 0;
  for (const ln of lines) for (let k = 0; k < t.length; ++k) if (t[k] >= now - window && ln.values[k] !== null) max = Math.max(max, ln.values[k]);
  // Fractions are drawn on a fixed 0..100% scale, so a near-empty cache looks near empty.
  const ticks = percent ? [0, 0.25, 0.5, 0.75, 1] : niceTicks(max);
  const ymax = ticks[ticks.length - 1];
  const step = ticks[1] - ticks[0];
  const decimals = Math.max(0, Math.min(3, -Math.floor(Math.log10(step) + 1e-9)));
  // Milliseconds from a second up read as seconds.
  const seconds = unit === 'ms' && ymax >= 1000;
  const tickLabel = (v) => {
    if (percent) return `${Math.round(v * 100)}%`;
    if (seconds) return v ? `${+(v / 1000).toFixed(2)} s` : '0';
    return (v >= 1e4 ? fmtNum(v) : v.toFixed(decimals)) + (v && unit ? ' ' + unit : '');
  };
  const labels = ticks.map(tickLabel);
  const pad = { l: 12 + 6 * Math.max(...labels.map((x) => x.length)), r: 8, t: 8, b: 18 };
  const w = width - pad.l - pad.r, h = height - pad.t - pad.b;
  const root = svg('svg', { viewBox: `0 0 ${width} ${height}`, role: 'img' });
  const X = (x) => pad.l + (1 - (now - x) / window) * w;
  const Y = (y) => pad.t + h - (y / ymax) * h;
  ticks.forEach((v, k) => {
    root.append(svg('line', { class: 'grid', x1: pad.l, x2: pad.l + w, y1: Y(v), y2: Y(v) }));
    const label = svg('text', { class: 'axis', x: pad.l - 6, y: Y(v) + 3, 'text-anchor': 'end' });
    label.textContent = labels[k];
    root.append(label);
  });
  const minutes = window / 60;
  const xstep = minutes <= 1 ? 15 : minutes <= 5 ? 60 : 180;
  for (let s = 0; s <= window; s += xstep) {
    const label = svg('text', { class: 'axis', x: X(now - s), y: height - 4, 'text-anchor': s === 0 ? 'end' : s === window ? 'start' : 'middle' });
    label.textContent = s === 0 ? 'now' : s < 60 ? `−${s}s` : `−${s / 60}m`;
    root.append(label);
  }
  let any = false;
  for (const ln of lines) {
    let d = '';
    let pen = false;
    for (let k = 0; k < t.length; ++k) {
      const v = ln.values[k];
      if (t[k] < now - window - 2 || v === null || v === undefined) {
        pen = false;
        continue;
      }
      d += `${pen ? 'L' : 'M'}${X(t[k]).toFixed(1)},${Y(v).toFixed(1)}`;
      pen = true;
      any = true;
    }
    if (d) {
      const path = svg('path', { class: 'line', d });
      path.style.stroke = ln.color;
      root.append(path);
    }
  }
  if (!any) {
    const e = svg('text', { class: 'empty-chart', x: pad.l + w / 2, y: pad.t + h / 2, 'text-anchor': 'middle' });
    e.textContent = 'no data in this window';
    root.append(e);
  }
  return root;
}

export class Dashboard {
  constructor() {
    this.history = new History();
    this.info = null;
    this.timer = null;
    this.window = Number($('dash-window').value);
    this.cards = {};
    this.charts = {};
    $('dash-window').addEventListener('change', () => {
      this.window = Number($('dash-window').value);
      this.render();
    });
    window.addEventListener('resize', () => { if (this.timer) this.render(); });
    this.build();
  }

  build() {
    const cards = [
      ['running', 'Requests running'], ['waiting', 'Requests waiting'], ['kv', 'KV + index cache'],
      ['prefix', 'Prefix cache hit rate'], ['throughput', 'Generation throughput'], ['ttft', 'Time to first token'],
      ['tpot', 'Time per output token'], ['preemptions', 'Preemptions'], ['finished', 'Requests finished'],
      ['generated', 'Tokens generated'], ['prompt', 'Prompt tokens'], ['spec', 'Speculative acceptance'],
    ];
    const box = $('dash-cards');
    for (const [k, label] of cards) box.append(this.cards[k] = card(k, label));
    const charts = [
      ['requests', 'Requests'], ['cache', 'Cache'], ['throughput', 'Throughput (tokens/s)'],
      ['ttft', 'Time to first token'], ['tpot', 'Time per output token'], ['events', 'Finished and preempted (per minute)'],
      ['spec', 'Speculative acceptance'],
    ];
    const cbox = $('dash-charts');
    for (const [k, title] of charts) {
      const c = el('div', 'chart');
      c.dataset.chart = k;
      c.append(el('h3', null, title), el('div', 'legend'), el('div', 'plot'));
      cbox.append(c);
      this.charts[k] = c;
    }
  }

  async start() {
    if (this.timer) return;
    if (!this.info) {
      try {
        this.info = await getJson('/ui/info');
      } catch {
        this.info = null;
      }
    }
    const tick = async () => {
      try {
        const since = this.history.t.length ? this.history.t[this.history.last] : 0;
        this.history.merge(await getJson(`/ui/metrics?since=${since}`));
        $('dash-updated').textContent = `updated ${new Date().toLocaleTimeString()}`;
      } catch (e) {
        $('dash-updated').textContent = `cannot reach the server (${e.message})`;
      }
      this.render();
    };
    this.timer = setInterval(tick, 1000);
    await tick();
  }

  stop() {
    clearInterval(this.timer);
    this.timer = null;
  }

  render() {
    const H = this.history;
    const i = H.last;
    if (i < 0) return;
    const W = this.window;
    const j = H.back(i, W);
    const info = this.info || {};
    $('dash-model').textContent = info.model ? `${info.model} · ${info.device || ''}` : '';

    const running = H.v('sieve:num_requests_running'), waiting = H.v('sieve:num_requests_waiting');
    setCard(this.cards.running, fmtNum(running, 0), '', `max ${info.max_num_seqs ?? '–'} in a step`, running);
    setCard(this.cards.waiting, fmtNum(waiting, 0), '', 'queued or preempted', waiting);
    const usage = H.v('sieve:kv_cache_usage_perc');
    const total = H.v('sieve:kv_cache_blocks_total'), used = H.v('sieve:kv_cache_blocks_used');
    const bpb = info.cache_bytes_per_block;
    setCard(this.cards.kv, fmtNum(usage * 100, 1), '%',
      `${fmtNum(used, 0)} / ${fmtNum(total, 0)} blocks` + (bpb ? ` · ${fmtBytes(used * bpb)} of ${fmtBytes(total * bpb)}` : ''), usage, usage);
    const q = H.delta('sieve:prefix_cache_queries_total', j, i), hit = H.delta('sieve:prefix_cache_hits_total', j, i);
    const qa = H.v('sieve:prefix_cache_queries_total'), ha = H.v('sieve:prefix_cache_hits_total');
    const hr = q ? hit / q : null;
    setCard(this.cards.prefix, hr === null ? '–' : fmtNum(hr * 100, 1), hr === null ? '' : '%',
      info.prefix_caching === false ? 'prefix caching is off' : `since start ${qa ? fmtNum((ha / qa) * 100, 1) + '%' : '–'} of ${fmtNum(qa, 0)} tokens`, hr, hr ?? 0);
    const gen = H.rate('sieve:generation_tokens_total', i), pr = H.rate('sieve:prompt_tokens_total', i);
    setCard(this.cards.throughput, fmtNum(gen), 'tok/s', `prompt ${fmtNum(pr)} tok/s (last ${RATE_S} s)`, gen);
    const ttft = H.window('sieve:time_to_first_token_seconds', j, i);
    const [t50, t50u] = fmtMs(ttft.q(0.5));
    setCard(this.cards.ttft, t50, t50u, ttft.count ? `median · mean ${fmtMs(ttft.mean).join(' ')} · p90 ${fmtMs(ttft.q(0.9)).join(' ')}` : 'no requests in the window', ttft.q(0.5));
    const itl = H.window('sieve:inter_token_latency_seconds', j, i);
    const [tp, tpu] = fmtMs(itl.mean);
    setCard(this.cards.tpot, tp, tpu, itl.count ? `mean · p90 ${fmtMs(itl.q(0.9)).join(' ')}` : 'no tokens in the window', itl.mean);
    const pre = H.v('sieve:num_preemptions_total');
    setCard(this.cards.preemptions, fmtNum(pre, 0), '', `${fmtNum(H.delta('sieve:num_preemptions_total', j, i) ?? 0, 0)} in the window`, pre);
    const reasons = ['stop', 'length', 'abort', 'error'];
    const fin = reasons.map((r) => H.v(`sieve:request_success_total{finished_reason="${r}"}`) ?? 0);
    const finTotal = fin.reduce((a, b) => a + b, 0);
    setCard(this.cards.finished, fmtNum(finTotal, 0), '', reasons.map((r, k) => `${r} ${fin[k]}`).join(' · '), finTotal);
    const gtot = H.v('sieve:generation_tokens_total'), ptot = H.v('sieve:prompt_tokens_total');
    setCard(this.cards.generated, fmtNum(gtot, 0), '', `${fmtNum(H.delta('sieve:generation_tokens_total', j, i) ?? 0, 0)} in the window`, gtot);
    setCard(this.cards.prompt, fmtNum(ptot, 0), '', `${fmtNum(H.delta('sieve:prompt_tokens_total', j, i) ?? 0, 0)} in the window`, ptot);
    // Speculative decoding, when the server exports its counters (vLLM's names).
    const draftName = 'vllm:spec_decode_num_draft_tokens_total', accName = 'vllm:spec_decode_num_accepted_tokens_total';
    const spec = H.has(draftName) && H.has(accName);
    this.cards.spec.hidden = !spec;
    this.charts.spec.hidden = !spec;
    if (spec) {
      const d = H.delta(draftName, j, i), a = H.delta(accName, j, i);
      const rate = d ? a / d : null;
      setCard(this.cards.spec, rate === null ? '–' : fmtNum(rate * 100, 1), rate === null ? '' : '%', `${fmtNum(a ?? 0, 0)} of ${fmtNum(d ?? 0, 0)} draft tokens`, rate, rate ?? 0);
    }
    this.renderCharts(spec);
    this.renderInfo();
  }

  renderCharts(spec) {
    const H = this.history;
    const t = H.t;
    const now = t[H.last];
    // Only the samples the window shows (and the one before it) are computed.
    const first = Math.max(0, H.back(H.last, this.window) - 1);
    const idx = t.map((_, k) => k);
    const inWindow = (f) => idx.map((k) => (k < first ? null : f(k)));
    const colors = ['var(--series-1)', 'var(--series-2)', 'var(--series-3)', 'var(--series-4)'];
    const opts = { window: this.window, now };
    const latency = (hist, stat) => inWindow((k) => {
      const w = H.window(hist, H.back(k, LATENCY_S), k);
      const v = stat === 'mean' ? w.mean : w.q(stat);
      return v === null ? null : v * 1000;
    });
    const ratio = (num, den, seconds) => inWindow((k) => {
      const j = H.back(k, seconds);
      const d = H.delta(den, j, k);
      return d ? H.delta(num, j, k) / d : null;
    });
    const perMinute = (name) => inWindow((k) => {
      const r = H.rate(name, k, LATENCY_S);
      return r === null ? null : r * 60;
    });
    const finished = inWindow((k) => {
      let s = 0, any = false;
      for (const r of ['stop', 'length', 'abort', 'error']) {
        const v = H.rate(`sieve:request_success_total{finished_reason="${r}"}`, k, LATENCY_S);
        if (v !== null) s += v, any = true;
      }
      return any ? s * 60 : null;
    });
    const sets = {
      requests: [[{ name: 'running', values: H.series['sieve:num_requests_running'] || [] },
        { name: 'waiting', values: H.series['sieve:num_requests_waiting'] || [] }], {}],
      cache: [[{ name: 'KV + index blocks in use', values: H.series['sieve:kv_cache_usage_perc'] || [] },
        { name: `prefix hit rate (${LATENCY_S} s)`, values: ratio('sieve:prefix_cache_hits_total', 'sieve:prefix_cache_queries_total', LATENCY_S) }], { percent: true }],
      throughput: [[{ name: 'generation', values: inWindow((k) => H.rate('sieve:generation_tokens_total', k)) },
        { name: 'prompt', values: inWindow((k) => H.rate('sieve:prompt_tokens_total', k)) }], {}],
      ttft: [[{ name: 'mean', values: latency('sieve:time_to_first_token_seconds', 'mean') },
        { name: 'p90', values: latency('sieve:time_to_first_token_seconds', 0.9) }], { unit: 'ms' }],
      tpot: [[{ name: 'mean', values: latency('sieve:inter_token_latency_seconds', 'mean') },
        { name: 'p90', values: latency('sieve:inter_token_latency_seconds', 0.9) }], { unit: 'ms' }],
      events: [[{ name: 'finished', values: finished }, { name: 'preempted', values: perMinute('sieve:num_preemptions_total') }], {}],
    };
    if (spec) {
      sets.spec = [[{ name: `accepted / drafted (${LATENCY_S} s)`, values: ratio('vllm:spec_decode_num_accepted_tokens_total', 'vllm:spec_decode_num_draft_tokens_total', LATENCY_S) }], { percent: true }];
    }
    for (const [key, [lines, o]] of Object.entries(sets)) {
      const box = this.charts[key];
      lines.forEach((ln, k) => { ln.color = colors[k]; });
      box.querySelector('.legend').replaceChildren(...lines.map((ln) => {
        const s = el('span');
        const sw = el('i');
        sw.style.background = ln.color;
        s.append(sw, ln.name);
        return s;
      }));
      const plot = box.querySelector('.plot');
      plot.replaceChildren(drawChart(box, t, lines, { ...opts, ...o }));
    }
  }

  renderInfo() {
    const i = this.info;
    if (!i) return;
    const rows = [
      ['Model', i.model], ['Device', i.device],
      ['KV cache / index cache dtype', `${i.kv_cache_dtype ?? '–'} / ${i.index_cache_dtype ?? '–'}`],
      ['Cache blocks', `${i.num_blocks} × ${i.block_size} tokens` + (i.cache_bytes_per_block ? ` (${fmtBytes(i.num_blocks * i.cache_bytes_per_block)})` : '')],
      ['Prefix caching', i.prefix_caching ? 'on' : 'off'],
      ['Max model length', i.max_model_len], ['Max sequences per step', i.max_num_seqs],
      ['Max batched tokens', i.max_num_batched_tokens],
      ['Reasoning parser', i.reasoning_parser || 'off'], ['Tool-call parser', i.tool_parser || 'off'],
      ['API key', i.api_key_required ? 'required' : 'not required'],
    ];
    const table = el('table');
    for (const [k, v] of rows) {
      const tr = el('tr');
      tr.append(el('td', null, k), el('td', null, String(v ?? '–')));
      table.append(tr);
    }
    $('dash-info').replaceChildren(table);
  }
}
