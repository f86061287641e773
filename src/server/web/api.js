// Talking to the server: the API key, JSON requests, and the server-sent events of a stream.

const KEY_STORE = 'sieve.apiKey';

export function apiKey() {
  return localStorage.getItem(KEY_STORE) || '';
}

export function setApiKey(key) {
  if (key) localStorage.setItem(KEY_STORE, key);
  else localStorage.removeItem(KEY_STORE);
}

export class ApiError extends Error {
  constructor(status, message, body) {
    super(message);
    this.status = status;
    this.body = body;
  }
}

function headers(extra = {}) {
  const h = { ...extra };
  const key = apiKey();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

async function errorOf(res) {
  let msg = `HTTP ${res.status}`;
  let body = null;
  try {
    body = await res.json();
    if (body && body.error && body.error.message) msg = body.error.message;
  } catch {
    // not JSON: keep the status line
  }
  return new ApiError(res.status, msg, body);
}

export async function getJson(path, { signal } = {}) {
  const res = await fetch(path, { headers: headers(), signal, cache: 'no-store' });
  if (!res.ok) throw await errorOf(res);
  return res.json();
}

// POSTs `body` with stream: true and yields each event's parsed JSON until [DONE]. Aborting
// `signal` ends the stream (the server then aborts the request).
export async function* streamJson(path, body, { signal } = {}) {
  const res = await fetch(path, {
    method: 'POST',
    headers: headers({ 'Content-Type': 'application/json', Accept: 'text/event-stream' }),
    body: JSON.stringify(body),
    signal,
  });
  if (!res.ok) throw await errorOf(res);
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      // Events end with a blank line; a line of the event starting with "data:" carries JSON.
      let end;
      while ((end = buf.search(/\r?\n\r?\n/)) >= 0) {
        const event = buf.slice(0, end);
        buf = buf.slice(end).replace(/^\r?\n\r?\n/, '');
        const data = event.split(/\r?\n/).filter((l) => l.startsWith('data:')).map((l) => l.slice(5).trimStart()).join('\n');
        if (!data) continue;
        if (data === '[DONE]') return;
        let obj;
        try {
          obj = JSON.parse(data);
        } catch {
          throw new ApiError(0, `the server sent an event that is not JSON: ${data.slice(0, 120)}`);
        }
        if (obj.error) throw new ApiError(obj.error.code || 500, obj.error.message || 'error in stream', obj);
        yield obj;
      }
    }
  } finally {
    // Leaving early (stop, an error) closes the connection, which aborts the request.
    reader.cancel().catch(() => {});
  }
}
