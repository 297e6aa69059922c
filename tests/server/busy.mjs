// busy.mjs - a full server: one slot, one queue place. A running stream, a
// queued request, then a third request gets 503 with Retry-After. SIGTERM
// then answers the queued request with 503 and cancels the running stream
// after the grace period with an error event.
//
// env: SERVER_URL, SERVER_PID (this script sends the SIGTERM).
import {APIError} from 'openai';
import {client, check, summary, post, get, metric, sleep} from './common.mjs';

const model = (await client.models.list()).data[0].id;
const long = {model, messages: [{role: 'user', content: 'Go on and on.'}], temperature: 0,
              max_tokens: 100000, ignore_eos: true};

// A: running, streaming until the context is full.
const a = await client.chat.completions.create({...long, stream: true});
const it = a[Symbol.asyncIterator]();
let aText = '';
while (!aText) {
  const {value, done} = await it.next();
  if (done) break;
  aText += value.choices[0]?.delta?.content ?? '';
}
check(aText.length > 0, 'A is generating');

// B: waits in the queue.
const bDone = client.chat.completions.create(long).then(() => 'completed', (e) => e);
let m;
for (let i = 0; i < 200; i++) {
  m = await get('/metrics');
  if (metric(m.text, 'dflash_queue_depth') === 1) break;
  await sleep(10);
}
check(metric(m.text, 'dflash_queue_depth') === 1 && metric(m.text, 'dflash_slots_busy') === 1,
      'B is queued behind A');

// C: no slot, no queue place.
const c = await post('/v1/chat/completions', JSON.stringify({...long, max_tokens: 4}));
check(c.status === 503 && c.headers.get('retry-after') === '1' && c.json?.error?.code === 'server_busy',
      'C: 503 server_busy with Retry-After', {status: c.status, body: c.text});
m = await get('/metrics');
check(metric(m.text, 'dflash_requests_total', 'result="rejected"') === 1, 'the rejection is counted');

// SIGTERM: B is refused, A is cancelled after the grace period.
process.kill(Number(process.env.SERVER_PID), 'SIGTERM');
const b = await bDone;
check(b instanceof APIError && b.status === 503, 'B (queued) gets 503 at shutdown', String(b));
let aEnd = 'completed';
try {
  for (;;) {
    const {done} = await it.next();
    if (done) break;
  }
} catch (e) {
  aEnd = e;
}
check(aEnd instanceof APIError && /shutting down/.test(aEnd.message),
      'A (running) ends with an error event after the grace period', String(aEnd));
summary('busy');
