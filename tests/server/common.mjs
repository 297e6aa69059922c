// common.mjs - what the server tests share: config from the environment, a
// tiny check harness, raw HTTP helpers for what the openai client hides.
import OpenAI from 'openai';

export const base = process.env.SERVER_URL;          // http://127.0.0.1:PORT
export const apiKey = process.env.SERVER_API_KEY || 'none';
export const client = new OpenAI({baseURL: `${base}/v1`, apiKey, maxRetries: 0, timeout: 120000});

let passed = 0, failed = 0;
export function check(cond, what, detail) {
  if (cond) { passed++; return true; }
  failed++;
  console.error(`FAIL: ${what}${detail !== undefined ? ': ' + JSON.stringify(detail) : ''}`);
  return false;
}
export function summary(name) {
  console.log(`${name}: ${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}

export function authHeaders(key = apiKey) {
  return {'content-type': 'application/json', authorization: `Bearer ${key}`};
}

// POST a raw body; returns {status, json, text}.
export async function post(path, body, headers = authHeaders()) {
  const r = await fetch(base + path, {method: 'POST', headers, body});
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return {status: r.status, json, text, headers: r.headers};
}

export async function get(path, headers = authHeaders()) {
  const r = await fetch(base + path, {headers});
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return {status: r.status, json, text};
}

// One Prometheus sample value by metric name and optional label text.
export function metric(text, name, labels = '') {
  for (const line of text.split('\n')) {
    if (line.startsWith('#')) continue;
    const key = labels ? `${name}{${labels}}` : name;
    if (line.startsWith(key + ' ')) return Number(line.slice(key.length + 1));
  }
  return NaN;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Waits (bounded) until no slot is busy and nothing is queued.
export async function waitIdle(limitMs = 20000) {
  const t0 = Date.now();
  while (Date.now() - t0 < limitMs) {
    const m = await get('/metrics');
    if (metric(m.text, 'dflash_slots_busy') === 0 && metric(m.text, 'dflash_queue_depth') === 0)
      return Date.now() - t0;
    await sleep(20);
  }
  return -1;
}

// Collects a streamed completion from the openai client.
export async function collect(stream, kind = 'chat') {
  let text = '', finish = null, usage = null, chunks = 0, role = null, extra = null, lps = [];
  for await (const ch of stream) {
    chunks++;
    if (ch.usage) usage = ch.usage;
    if (ch.timings) extra = {timings: ch.timings, dflash: ch.dflash};
    for (const c of ch.choices) {
      if (kind === 'chat') {
        if (c.delta?.role) role = c.delta.role;
        if (c.delta?.content) text += c.delta.content;
        if (c.logprobs?.content) lps.push(...c.logprobs.content);
      } else {
        text += c.text ?? '';
        if (c.logprobs?.tokens) lps.push(...c.logprobs.tokens);
      }
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return {text, finish, usage, chunks, role, extra, lps};
}
