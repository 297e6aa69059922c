// load.mjs - a bounded load test on loopback: CLIENTS concurrent streaming
// clients, REQUESTS each, a share of them hanging up at a random moment.
// Every request must either complete (finish_reason, usage, [DONE]) or be the
// one we cancelled; greedy answers to the same prompt must agree whatever ran
// beside them. Prints the figures as one JSON line (prefixed "LOAD ").
//
// env: SERVER_URL, SERVER_API_KEY, CLIENTS (8), REQUESTS (50), ABORT (0.2),
// SEED (1), MAX_TOKENS (24).
import {client, check, summary, waitIdle} from './common.mjs';

const clients = Number(process.env.CLIENTS || 8);
const perClient = Number(process.env.REQUESTS || 50);
const abortP = Number(process.env.ABORT || 0.2);
const maxTokens = Number(process.env.MAX_TOKENS || 24);
let seed = Number(process.env.SEED || 1) >>> 0;
function rand() {   // xorshift32: the same run every time
  seed ^= seed << 13; seed >>>= 0; seed ^= seed >>> 17; seed ^= seed << 5; seed >>>= 0;
  return seed / 4294967296;
}

const model = (await client.models.list()).data[0].id;
const prompts = ['Tell me about the sea.', 'Write a poem about cats.', 'What is 2 + 2?',
                 'List three colours.'];
const results = [];
const answers = new Map();   // prompt/kind -> set of greedy answers

async function one(c, k) {
  const p = Math.floor(rand() * prompts.length), chat = rand() < 0.5;
  const abortMode = rand() < abortP ? (rand() < 0.3 ? 'early' : 'mid') : null;
  const abortAfter = 1 + Math.floor(rand() * 4), abortMs = Math.floor(rand() * 30);
  const ac = new AbortController();
  const req = chat
    ? {model, messages: [{role: 'user', content: prompts[p]}], max_tokens: maxTokens, temperature: 0,
       stream: true, stream_options: {include_usage: true}, chat_template_kwargs: {enable_thinking: false}}
    : {model, prompt: prompts[p], max_tokens: maxTokens, temperature: 0, stream: true,
       stream_options: {include_usage: true}};
  const r = {chat, t0: performance.now(), ttft: null, t1: null, tokens: 0, outcome: null, error: null};
  let timer = null;
  if (abortMode === 'early') timer = setTimeout(() => ac.abort(), abortMs);
  let text = '', finish = null, usage = null, chunks = 0;
  try {
    const api = chat ? client.chat.completions : client.completions;
    const stream = await api.create(req, {signal: ac.signal});
    for await (const ch of stream) {
      if (ch.usage) usage = ch.usage;
      for (const x of ch.choices) {
        const piece = chat ? x.delta?.content : x.text;
        if (piece) {
          if (r.ttft === null) r.ttft = performance.now() - r.t0;
          text += piece;
          if (abortMode === 'mid' && ++chunks >= abortAfter) ac.abort();
        }
        if (x.finish_reason) finish = x.finish_reason;
      }
    }
    r.t1 = performance.now();
    if (finish && usage) {
      r.outcome = 'done';
      r.tokens = usage.completion_tokens;
      const key = `${chat}/${p}`;
      if (!answers.has(key)) answers.set(key, new Set());
      answers.get(key).add(text);
    } else {
      r.outcome = ac.signal.aborted ? 'aborted' : 'error';
      r.error = `stream ended without finish/usage (${finish}, ${JSON.stringify(usage)})`;
    }
  } catch (e) {
    r.t1 = performance.now();
    r.outcome = ac.signal.aborted ? 'aborted' : 'error';
    if (!ac.signal.aborted) r.error = String(e?.message || e);
  } finally {
    clearTimeout(timer);
  }
  results.push(r);
}

const t0 = performance.now();
await Promise.all(Array.from({length: clients}, async (_, c) => {
  for (let k = 0; k < perClient; k++) await one(c, k);
}));
const wall = (performance.now() - t0) / 1000;
const idle = await waitIdle(30000);

const done = results.filter((r) => r.outcome === 'done');
const errors = results.filter((r) => r.outcome === 'error');
const lat = done.map((r) => r.t1 - r.t0).sort((a, b) => a - b);
const ttft = done.filter((r) => r.ttft !== null).map((r) => r.ttft).sort((a, b) => a - b);
const pct = (a, q) => a.length ? a[Math.min(a.length - 1, Math.floor(q * a.length))] : null;
const tokens = done.reduce((s, r) => s + r.tokens, 0);
const fig = {
  requests: results.length, concurrency: clients, completed: done.length,
  cancelled_by_client: results.length - done.length - errors.length, errors: errors.length,
  latency_ms_p50: Math.round(pct(lat, 0.5)), latency_ms_p99: Math.round(pct(lat, 0.99)),
  ttft_ms_p50: Math.round(pct(ttft, 0.5)), ttft_ms_p99: Math.round(pct(ttft, 0.99)),
  completion_tokens: tokens, wall_s: Number(wall.toFixed(2)),
  tokens_per_s: Number((tokens / wall).toFixed(1)), idle_after_ms: idle,
};
console.log('LOAD ' + JSON.stringify(fig));
check(results.length === clients * perClient, 'every request finished one way or another');
check(errors.length === 0, 'no request failed', errors.slice(0, 5).map((r) => r.error));
check(done.length > 0, 'some requests completed');
check(idle >= 0, 'all slots idle and the queue empty after the load', idle);
for (const [key, set] of answers)
  check(set.size === 1, `greedy answers to one prompt agree under load (${key})`, [...set].slice(0, 3));
summary('load');
