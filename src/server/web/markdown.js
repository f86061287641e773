// A small markdown renderer for model output. It builds DOM nodes with createElement and
// textContent only, never HTML strings, so nothing a model writes can become markup: raw HTML
// shows as text and links other than http(s) and mailto stay plain text. It covers what chat
// replies use: paragraphs, headings, emphasis, code spans and fenced code (highlighted), lists,
// block quotes, tables, rules and links. Half-written input (a stream) renders as far as it goes.

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)[^`]*$/;
const HEADING = /^ {0,3}(#{1,6})(?:\s+(.*?))?\s*#*\s*$/;
const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
const QUOTE = /^ {0,3}> ?(.*)$/;
const ITEM = /^( {0,3})([-*+]|\d{1,9}[.)])(\s+|$)(.*)$/;
const TABLE_SEP = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

// --- inline ----------------------------------------------------------------------------------

const SAFE_URL = /^(https?:\/\/|mailto:)[^\s<>"]+$/i;

function safeUrl(url) {
  url = url.trim().replace(/^<|>$/g, '');
  return SAFE_URL.test(url) ? url : null;
}

function link(url, children) {
  const a = el('a');
  a.href = url;
  a.target = '_blank';
  a.rel = 'noopener noreferrer nofollow';
  for (const c of children) a.append(c);
  return a;
}

// The index of the closing delimiter `d` for an opening at `from` (its first inner character):
// not escaped, preceded by a non-space, and for single * or _ not part of a double one.
function findClose(s, d, from) {
  for (let i = from; i < s.length; ++i) {
    if (s[i] === '\\') { ++i; continue; }
    if (s[i] === '`') {  // code spans bind tighter than emphasis
      const run = /^`+/.exec(s.slice(i))[0];
      const end = s.indexOf(run, i + run.length);
      if (end > 0) { i = end + run.length - 1; continue; }
    }
    if (s.startsWith(d, i) && i > from && !/\s/.test(s[i - 1])) {
      if (d.length === 1 && (s[i + 1] === d || s[i - 1] === d)) continue;
      if (d === '_' && /\w/.test(s[i + 1] || '')) continue;
      return i;
    }
  }
  return -1;
}

// Brackets balanced from `open` (a '['): the index of the matching ']', or -1.
function matchBracket(s, open) {
  let depth = 0;
  for (let i = open; i < s.length; ++i) {
    if (s[i] === '\\') { ++i; continue; }
    if (s[i] === '[') ++depth;
    else if (s[i] === ']' && --depth === 0) return i;
  }
  return -1;
}

export function renderInline(s) {
  const out = [];
  let text = '';
  const flush = () => { if (text) out.push(document.createTextNode(text)), text = ''; };
  for (let i = 0; i < s.length;) {
    const c = s[i];
    const rest = s.slice(i);
    if (c === '\\' && i + 1 < s.length && /[!-/:-@[-`{-~]/.test(s[i + 1])) {
      text += s[i + 1];
      i += 2;
      continue;
    }
    if (c === '\\' && s[i + 1] === '\n') {
      flush();
      out.push(el('br'));
      i += 2;
      continue;
    }
    if (c === '\n') {
      flush();
      out.push(el('br'));
      ++i;
      continue;
    }
    if (c === '`') {
      const run = /^`+/.exec(rest)[0];
      const end = s.indexOf(run, i + run.length);
      if (end >= 0) {
        flush();
        let code = s.slice(i + run.length, end).replace(/\n/g, ' ');
        if (/^ .*[^ ] $/.test(code)) code = code.slice(1, -1);
        out.push(el('code', null, code));
        i = end + run.length;
        continue;
      }
      text += run;
      i += run.length;
      continue;
    }
    if ((c === '[' || (c === '!' && s[i + 1] === '[')) ) {
      const open = c === '!' ? i + 1 : i;
      const close = matchBracket(s, open);
      const m = close > 0 ? /^\(\s*(<[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)(?:\s+"[^"]*")?\s*\)/.exec(s.slice(close + 1)) : null;
      if (m) {
        const label = s.slice(open + 1, close);
        const url = safeUrl(m[1]);
        flush();
        const inner = renderInline(c === '!' ? (label || m[1]) : label);
        // Images are shown as links: the page loads nothing from elsewhere.
        out.push(...(url ? [link(url, inner)] : inner));
        i = close + 1 + m[0].length;
        continue;
      }
    }
    if (c === '<') {
      const m = /^<((?:https?:\/\/|mailto:)[^\s<>]+)>/i.exec(rest);
      if (m) {
        flush();
        out.push(link(m[1], [document.createTextNode(m[1])]));
        i += m[0].length;
        continue;
      }
    }
    if ((c === 'h' || c === 'w') && (i === 0 || /[\s(]/.test(s[i - 1]))) {
      const m = /^(?:https?:\/\/|www\.)[^\s<>"]*[^\s<>".,;:!?)\]'*_~]/.exec(rest);
      if (m) {
        flush();
        const url = m[0].startsWith('www.') ? 'https://' + m[0] : m[0];
        if (safeUrl(url)) {
          out.push(link(url, [document.createTextNode(m[0])]));
          i += m[0].length;
          continue;
        }
      }
    }
    if (c === '*' || c === '_' || c === '~') {
      const double = s[i + 1] === c;
      const d = double ? c + c : c;
      // An opening delimiter is followed by a non-space; `_` does not open inside a word.
      const next = s[i + d.length];
      const leftOk = !(c === '_' && i > 0 && /\w/.test(s[i - 1]));
      if (next && !/\s/.test(next) && leftOk && (c !== '~' || double)) {
        const end = findClose(s, d, i + d.length);
        if (end > 0) {
          flush();
          const tag = c === '~' ? 'del' : double ? 'strong' : 'em';
          const e = el(tag);
          e.append(...renderInline(s.slice(i + d.length, end)));
          out.push(e);
          i = end + d.length;
          continue;
        }
      }
      text += d;
      i += d.length;
      continue;
    }
    text += c;
    ++i;
  }
  flush();
  return out;
}

// --- code highlighting -----------------------------------------------------------------------

const KEYWORDS = new Set((
  'abstract and as assert async auto await bool boolean break case catch char class const constexpr ' +
  'continue def default del delete do double elif else enum except export extends extern false ' +
  'final finally float fn for from func function go if impl import in include inline instanceof ' +
  'int interface is lambda let long loop match mod module mut namespace new nil none None not ' +
  'null nullptr or override package pass private protected pub public raise return self Self ' +
  'short signed static std struct super switch template this throw throws trait true True False ' +
  'try type typedef typename typeof union unsigned use using var virtual void volatile where while ' +
  'with yield fi then done esac echo local function'
).split(' '));

const HASH_COMMENT = new Set(['py', 'python', 'sh', 'bash', 'shell', 'zsh', 'rb', 'ruby', 'yaml', 'yml', 'toml',
  'r', 'perl', 'pl', 'cmake', 'makefile', 'make', 'dockerfile', 'ini', 'conf']);

// Tokens of a code block: [class or null, text] pairs. Strings, comments, numbers and keywords;
// everything else is left plain. Good enough to read, not a parser.
export function highlight(code, lang) {
  lang = (lang || '').toLowerCase();
  const hash = HASH_COMMENT.has(lang);
  const slash = !hash || lang === 'cmake';
  const dash = lang === 'sql' || lang === 'lua' || lang === 'haskell';
  const out = [];
  let plain = '';
  const push = (cls, t) => {
    if (plain) out.push([null, plain]), plain = '';
    out.push([cls, t]);
  };
  for (let i = 0; i < code.length;) {
    const rest = code.slice(i);
    let m;
    if ((hash && code[i] === '#') || (slash && rest.startsWith('//')) || (dash && rest.startsWith('--'))) {
      const end = code.indexOf('\n', i);
      const stop = end < 0 ? code.length : end;
      push('tok-comment', code.slice(i, stop));
      i = stop;
    } else if (slash && rest.startsWith('/*')) {
      const end = code.indexOf('*/', i + 2);
      const stop = end < 0 ? code.length : end + 2;
      push('tok-comment', code.slice(i, stop));
      i = stop;
    } else if ((m = /^("""[\s\S]*?(?:"""|$)|'''[\s\S]*?(?:'''|$)|"(?:[^"\\\n]|\\.)*"?|'(?:[^'\\\n]|\\.)*'?|`(?:[^`\\]|\\.)*`?)/.exec(rest))) {
      // A lone apostrophe in prose-like code (Rust lifetimes, "don't") stays plain.
      if (m[0].length === 1 || (m[0][0] === "'" && !/'$/.test(m[0]) && m[0].length > 1 && !/\n/.test(m[0]))) {
        plain += code[i];
        ++i;
      } else {
        push('tok-string', m[0]);
        i += m[0].length;
      }
    } else if ((m = /^(?:0x[0-9a-fA-F_]+|\d[\d_]*(?:\.\d+)?(?:[eE][+-]?\d+)?)\b/.exec(rest)) && !/\w/.test(code[i - 1] || '')) {
      push('tok-number', m[0]);
      i += m[0].length;
    } else if ((m = /^[A-Za-z_][A-Za-z0-9_]*/.exec(rest))) {
      if (KEYWORDS.has(m[0])) push('tok-keyword', m[0]);
      else plain += m[0];
      i += m[0].length;
    } else {
      plain += code[i];
      ++i;
    }
  }
  if (plain) out.push([null, plain]);
  return out;
}

function codeBlock(code, lang, onCopy) {
  const wrap = el('div', 'code-block');
  const head = el('div', 'code-head');
  head.append(el('span', 'code-lang', lang || 'text'));
  const copy = el('button', 'code-copy', 'Copy');
  copy.type = 'button';
  copy.addEventListener('click', () => onCopy && onCopy(code, copy));
  head.append(copy);
  const pre = el('pre');
  const c = el('code');
  if (lang) c.dataset.lang = lang;
  for (const [cls, t] of highlight(code, lang)) c.append(cls ? el('span', cls, t) : document.createTextNode(t));
  pre.append(c);
  wrap.append(head, pre);
  return wrap;
}

// --- blocks ----------------------------------------------------------------------------------

function splitRow(line) {
  let s = line.trim();
  if (s.startsWith('|')) s = s.slice(1);
  if (s.endsWith('|') && !s.endsWith('\\|')) s = s.slice(0, -1);
  const cells = [];
  let cur = '';
  for (let i = 0; i < s.length; ++i) {
    if (s[i] === '\\' && s[i + 1] === '|') { cur += '|'; ++i; continue; }
    if (s[i] === '|') { cells.push(cur.trim()); cur = ''; continue; }
    cur += s[i];
  }
  cells.push(cur.trim());
  return cells;
}

function startsBlock(line, next) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) ||
    (ITEM.test(line) && ITEM.exec(line)[4].trim() !== '') ||
    (line.includes('|') && next !== undefined && TABLE_SEP.test(next) && next.includes('-'));
}

function renderBlocks(lines, parent, opts, depth) {
  if (depth > 12) {  // pathological nesting: the rest as text
    parent.append(el('p', null, lines.join('\n')));
    return;
  }
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (!line.trim()) { ++i; continue; }
    let m;
    if ((m = FENCE.exec(line))) {
      const fence = m[1];
      const body = [];
      ++i;
      while (i < lines.length) {
        const close = /^ {0,3}(`{3,}|~{3,})\s*$/.exec(lines[i]);
        if (close && close[1][0] === fence[0] && close[1].length >= fence.length) { ++i; break; }
        body.push(lines[i]);
        ++i;
      }
      parent.append(codeBlock(body.join('\n'), m[2], opts.onCopy));
      continue;
    }
    if ((m = HEADING.exec(line))) {
      const h = el('h' + Math.min(m[1].length + 2, 6));  // a reply's headings sit below the page's
      h.append(...renderInline(m[2] || ''));
      parent.append(h);
      ++i;
      continue;
    }
    if (RULE.test(line)) {
      parent.append(el('hr'));
      ++i;
      continue;
    }
    if (QUOTE.test(line)) {
      const body = [];
      while (i < lines.length && lines[i].trim() && (m = QUOTE.exec(lines[i]))) {
        body.push(m[1]);
        ++i;
      }
      const q = el('blockquote');
      renderBlocks(body, q, opts, depth + 1);
      parent.append(q);
      continue;
    }
    if (line.includes('|') && i + 1 < lines.length && TABLE_SEP.test(lines[i + 1]) && lines[i + 1].includes('-')) {
      const head = splitRow(line);
      const align = splitRow(lines[i + 1]).map((c) => c.startsWith(':') && c.endsWith(':') ? 'center'
        : c.endsWith(':') ? 'right' : c.startsWith(':') ? 'left' : '');
      const wrap = el('div', 'table-wrap');
      const table = el('table');
      const thead = el('thead');
      const tr = el('tr');
      head.forEach((c, k) => {
        const th = el('th');
        if (align[k]) th.style.textAlign = align[k];
        th.append(...renderInline(c));
        tr.append(th);
      });
      thead.append(tr);
      table.append(thead);
      const tbody = el('tbody');
      i += 2;
      while (i < lines.length && lines[i].trim() && lines[i].includes('|')) {
        const row = el('tr');
        splitRow(lines[i]).slice(0, head.length).forEach((c, k) => {
          const td = el('td');
          if (align[k]) td.style.textAlign = align[k];
          td.append(...renderInline(c));
          row.append(td);
        });
        tbody.append(row);
        ++i;
      }
      table.append(tbody);
      wrap.append(table);
      parent.append(wrap);
      continue;
    }
    if ((m = ITEM.exec(line))) {
      const ordered = /\d/.test(m[2]);
      const list = el(ordered ? 'ol' : 'ul');
      if (ordered && parseInt(m[2], 10) !== 1) list.start = parseInt(m[2], 10);
      const baseIndent = m[1].length;
      let loose = false;
      while (i < lines.length) {
        const im = ITEM.exec(lines[i]);
        if (!im || im[1].length !== baseIndent || /\d/.test(im[2]) !== ordered) break;
        // The item's text starts at this column; lines indented that far (or more) continue it.
        const contentCol = im[1].length + im[2].length + Math.min(Math.max(im[3].length, 1), 4);
        const body = [im[4]];
        ++i;
        while (i < lines.length) {
          const l = lines[i];
          if (!l.trim()) {
            // After a blank line, only lines indented into the item continue it.
            let k = i;
            while (k < lines.length && !lines[k].trim()) ++k;
            const nxt = lines[k];
            if (nxt !== undefined && /^\s*/.exec(nxt)[0].length >= contentCol) {
              for (; i < k; ++i) body.push('');
              continue;
            }
            const nm = nxt !== undefined && ITEM.exec(nxt);
            if (nm && nm[1].length === baseIndent && /\d/.test(nm[2]) === ordered) loose = true;
            break;
          }
          const indent = /^\s*/.exec(l)[0].length;
          if (indent >= Math.min(contentCol, baseIndent + 2)) {
            body.push(l.slice(Math.min(indent, contentCol)));
            ++i;
            continue;
          }
          if (ITEM.test(l) || startsBlock(l, lines[i + 1])) break;
          body.push(l.trim());  // a lazy continuation of the item's paragraph
          ++i;
        }
        if (loose) while (i < lines.length && !lines[i].trim()) ++i;
        const li = el('li');
        const task = /^\[([ xX])\]\s+/.exec(body[0]);
        if (task) {
          const box = el('input');
          box.type = 'checkbox';
          box.disabled = true;
          box.checked = task[1] !== ' ';
          li.append(box, ' ');
          body[0] = body[0].slice(task[0].length);
          li.className = 'task';
        }
        const hasBlocks = body.slice(1).some((l) => l.trim() && startsBlock(l)) || body.includes('');
        if (!hasBlocks && !loose) {
          li.append(...renderInline(body.join('\n')));
        } else {
          renderBlocks(body, li, opts, depth + 1);
          // A tight list's paragraphs are bare text, beside its nested lists.
          if (!loose) for (const p of [...li.children]) if (p.tagName === 'P') p.replaceWith(...p.childNodes);
        }
        list.append(li);
      }
      parent.append(list);
      continue;
    }
    // A paragraph: up to a blank line or the start of another block.
    const para = [line.replace(/^\s+/, '')];
    ++i;
    while (i < lines.length && lines[i].trim() && !startsBlock(lines[i], lines[i + 1])) {
      para.push(lines[i].replace(/^\s+/, ''));
      ++i;
    }
    const p = el('p');
    p.append(...renderInline(para.join('\n').replace(/ {2,}\n/g, '\n')));
    parent.append(p);
  }
}

// Renders `text` into a new DocumentFragment. opts.onCopy(code, button) is called by the copy
// button of a code block.
export function renderMarkdown(text, opts = {}) {
  const frag = document.createDocumentFragment();
  const lines = String(text ?? '').replace(/\r\n?/g, '\n').replace(/\t/g, '    ').split('\n');
  renderBlocks(lines, frag, opts, 0);
  return frag;
}
