// api.mjs - dflash serve through the official openai client: chat and
// completions, streaming and not, stop strings, usage, logprobs, concurrency,
// the prefix cache, client disconnects, and every documented 4xx error.
//
// env: SERVER_URL, SERVER_API_KEY (when the server has one), EXPECT (JSON of
// `dflash generate` outputs for the same prompts; see test_server.sh),
// MAX_BODY (the server's --max-body).
import fs from 'node:fs';
import {APIError} from 'openai';
import {base, client, check, summary, post, get, metric, authHeaders, waitIdle, collect, sleep}
  from './common.mjs';

const expect = JSON.parse(fs.readFileSync(process.env.EXPECT, 'utf8'));
const maxBody = Number(process.env.MAX_BODY || 1048576);
const models = await client.models.list();
const model = models.data[0].id;
const chatReq = (extra = {}) => ({
  model, max_tokens: expect.max_tokens, temperature: 0,
  messages: [{role: 'user', content: expect.chat_prompt}],
  chat_template_kwargs: {enable_thinking: false}, ...extra,
});
const complReq = (extra = {}) => ({
  model, max_tokens: expect.max_tokens, temperature: 0, prompt: expect.completion_prompt, ...extra,
});

function usageOk(u, what) {
  check(u && u.prompt_tokens > 0 && u.completion_tokens > 0 &&
        u.total_tokens === u.prompt_tokens + u.completion_tokens, `${what}: usage`, u);
}

// ---- health, models ------------------------------------------------------------
{
  const h = await fetch(base + '/health');   // no key needed
  check(h.status === 200, '/health is 200 once loaded', h.status);
  check(models.data.length === 1 && models.data[0].object === 'model', '/v1/models lists the model');
}

// ---- greedy output equals `dflash generate` --------------------------------------
let chatText;
{
  const r = await client.chat.completions.create(chatReq());
  chatText = r.choices[0].message.content;
  check(chatText === expect.chat_text, 'chat (non-stream) equals dflash generate --chat',
        {server: chatText, generate: expect.chat_text});
  check(r.object === 'chat.completion' && r.choices[0].message.role === 'assistant', 'chat shape');
  check(['stop', 'length'].includes(r.choices[0].finish_reason), 'chat finish_reason');
  usageOk(r.usage, 'chat');
  check(r.timings && r.timings.predicted_n === r.usage.completion_tokens, 'chat: timings field', r.timings);
  check(r.dflash && typeof r.dflash.rounds === 'number' && typeof r.dflash.tau === 'number',
        'chat: dflash stats field', r.dflash);
  if (expect.with_draft)
    check(r.dflash.rounds > 0 && r.dflash.proposed > 0, 'with a drafter, greedy requests speculate', r.dflash);
  else
    check(r.dflash.rounds === 0, 'without a drafter, no speculative rounds', r.dflash);

  const s = await collect(await client.chat.completions.create(
    chatReq({stream: true, stream_options: {include_usage: true}})));
  check(s.text === expect.chat_text, 'chat (stream) equals dflash generate --chat', {server: s.text});
  check(s.role === 'assistant', 'stream: first chunk names the role');
  check(s.finish === r.choices[0].finish_reason, 'stream: finish_reason', s.finish);
  check(s.usage && s.usage.completion_tokens === r.usage.completion_tokens &&
        s.usage.prompt_tokens === r.usage.prompt_tokens, 'stream: include_usage chunk', s.usage);
  check(s.extra && s.extra.dflash && s.extra.timings, 'stream: timings and dflash in the last chunk');

  const s2 = await collect(await client.chat.completions.create(chatReq({stream: true})));
  check(s2.usage === null, 'stream without include_usage has no usage', s2.usage);
}
{
  const r = await client.completions.create(complReq());
  check(r.choices[0].text === expect.completion_text, 'completion (non-stream) equals dflash generate',
        {server: r.choices[0].text, generate: expect.completion_text});
  check(r.object === 'text_completion', 'completion shape');
  usageOk(r.usage, 'completion');
  const s = await collect(await client.completions.create(
    complReq({stream: true, stream_options: {include_usage: true}})), 'completion');
  check(s.text === expect.completion_text, 'completion (stream) equals dflash generate', s.text);
  check(s.usage && s.usage.completion_tokens === r.usage.completion_tokens, 'completion stream usage');
  // A prompt given as token ids is the same prompt.
  const ids = (await post('/tokenize', JSON.stringify({content: expect.completion_prompt, add_special: true}))).json.tokens;
  const r2 = await client.completions.create(complReq({prompt: ids}));
  check(r2.choices[0].text === expect.completion_text, 'completion from token ids', r2.choices[0].text);
}

// ---- max_tokens / max_completion_tokens, ignore_eos --------------------------------
{
  const r = await client.chat.completions.create(chatReq({max_completion_tokens: 3, max_tokens: undefined, ignore_eos: true}));
  check(r.usage.completion_tokens === 3 && r.choices[0].finish_reason === 'length',
        'max_completion_tokens: 3 tokens, finish length', r.usage);
  check(chatText.startsWith(r.choices[0].message.content), 'a shorter run is a prefix of the longer one');
}

// ---- logprobs ------------------------------------------------------------------------
{
  const r = await client.chat.completions.create(chatReq({logprobs: true, top_logprobs: 3}));
  const lp = r.choices[0].logprobs?.content;
  check(Array.isArray(lp) && lp.length === r.usage.completion_tokens, 'chat logprobs: one per token',
        lp?.length);
  check(lp.every((e) => typeof e.token === 'string' && e.logprob <= 0 && Array.isArray(e.bytes) &&
                        e.top_logprobs.length <= 3), 'chat logprobs: entry shape');
  // Greedy: the chosen token is the most likely one.
  check(lp.every((e) => !e.top_logprobs.length || e.top_logprobs[0].logprob <= e.logprob + 1e-5),
        'greedy picks the top logprob');
  const c = await client.completions.create(complReq({logprobs: 2}));
  const l = c.choices[0].logprobs;
  check(l && l.tokens.length === c.usage.completion_tokens && l.token_logprobs.length === l.tokens.length &&
        l.top_logprobs.length === l.tokens.length && l.text_offset.length === l.tokens.length,
        'completion logprobs: parallel arrays', l);
}

// ---- stop strings across token boundaries ----------------------------------------------
{
  // A repeat penalty makes a random model's greedy text less repetitive;
  // token texts (from logprobs) give the boundaries while they concatenate
  // to the content.
  const stopReq = (extra) => chatReq({repeat_penalty: 1.5, ...extra});
  const baseRun = await client.chat.completions.create(stopReq({logprobs: true}));
  const text = baseRun.choices[0].message.content, toks = baseRun.choices[0].logprobs.content;
  let off = 0, cut = -1;
  const bounds = [];
  for (const t of toks) {
    if (!text.startsWith(t.token, off)) break;
    off += t.token.length;
    bounds.push(off);
  }
  // A boundary with at least 2 characters on each side, not at the very start.
  for (const b of bounds) if (b >= 2 && b + 2 <= text.length && b > text.length / 4) { cut = b; break; }
  if (cut < 0) for (const b of bounds) if (b >= 2 && b + 2 <= text.length) { cut = b; break; }
  if (check(cut > 0, 'found a token boundary inside the greedy text', {bounds, text})) {
    const stop = text.slice(cut - 2, cut + 2);
    const want = text.slice(0, text.indexOf(stop));
    const r = await client.chat.completions.create(stopReq({stop}));
    check(r.choices[0].message.content === want && r.choices[0].finish_reason === 'stop',
          'stop string spanning a token boundary (non-stream)', {stop, got: r.choices[0].message.content, want});
    const s = await collect(await client.chat.completions.create(stopReq({stop: ['\u0001never', stop], stream: true})));
    check(s.text === want && s.finish === 'stop', 'stop string from a list (stream): nothing after it leaks',
          {stop, got: s.text, want});
  }
  const ct = expect.completion_text, cs = ct.slice(1, 4);
  const c = await client.completions.create(complReq({stop: cs}));
  check(c.choices[0].text === ct.slice(0, ct.indexOf(cs)) && c.choices[0].finish_reason === 'stop',
        'completion stop string', {stop: cs, got: c.choices[0].text});
  const n = await client.chat.completions.create(chatReq({stop: ['\u0001never', '\u0002no']}));
  check(n.choices[0].message.content === chatText, 'stop strings that never occur change nothing');
}

// ---- sampling: every sampling field reaches the engine ---------------------------------
{
  const req = chatReq({temperature: 0.9, top_p: 0.95, top_k: 40, min_p: 0.01, seed: 1234});
  const a = await client.chat.completions.create(req);
  check(a.choices[0].message.content === expect.sampled_text,
        'sampled request equals dflash generate --temp 0.9 --top-p 0.95 --top-k 40 --min-p 0.01 --seed 1234',
        {server: a.choices[0].message.content, generate: expect.sampled_text});
  const b = await collect(await client.chat.completions.create({...req, stream: true}));
  check(b.text === expect.sampled_text, 'same seed, same sample (stream)', b.text);
  const c = await client.chat.completions.create({...req, seed: 99});
  usageOk(c.usage, 'sampled');
  // The exact rule (default) above speculates and still equals classic decode; the
  // other rules run, and are reproducible per seed at a pinned block size (the
  // adaptive size follows measured timings, and rejection's text depends on the
  // blocks), and show in /metrics by rule.
  const rj = {...req, spec_accept: 'rejection', block_size: 4};
  const r1 = await client.chat.completions.create(rj);
  const r2 = await client.chat.completions.create(rj);
  check(r1.choices[0].message.content === r2.choices[0].message.content,
        'rejection rule: same seed, same text', [r1.choices[0].message.content, r2.choices[0].message.content]);
  const ty = await client.chat.completions.create({...req, spec_accept: 'typical', typical: 0.3});
  usageOk(ty.usage, 'typical');
  isErr(await post('/v1/chat/completions', JSON.stringify({...chatReq(), spec_accept: 'maybe'})), 400,
        'unknown spec_accept -> 400', 'spec_accept');
  const m = await get('/metrics');
  check(/dflash_rule_tau\{rule="exact"\} /.test(m.text) && /dflash_rule_acceptance_rate\{rule="rejection"\} /.test(m.text),
        '/metrics reports acceptance and tau per rule');
}

// ---- several at once: each equals the greedy answer ---------------------------------
{
  const runs = await Promise.all([0, 1, 2, 3].map(async (k) => k % 2
    ? (await client.chat.completions.create(chatReq())).choices[0].message.content
    : (await collect(await client.chat.completions.create(chatReq({stream: true})))).text));
  check(runs.every((t) => t === expect.chat_text), '4 concurrent requests each equal dflash generate', runs);
}

// ---- prefix cache: a follow-up turn reuses the first turn -------------------------------
{
  const first = await client.chat.completions.create(chatReq());
  const follow = await client.chat.completions.create(chatReq({messages: [
    {role: 'user', content: expect.chat_prompt},
    {role: 'assistant', content: first.choices[0].message.content},
    {role: 'user', content: 'And then?'}]}));
  const cached = follow.usage.prompt_tokens_details?.cached_tokens ?? 0;
  // The template renders the earlier assistant turn without the generation
  // prompt's extras, so the shared prefix ends a little before the first prompt does.
  check(cached > first.usage.prompt_tokens / 2, 'follow-up turn: the shared prefix is not prefilled again',
        {cached, first_prompt: first.usage.prompt_tokens});
}

// ---- a client that leaves mid-stream frees its slot ------------------------------------
{
  await waitIdle();
  const ac = new AbortController();
  const st = await client.chat.completions.create(
    chatReq({stream: true, max_tokens: 100000, ignore_eos: true}), {signal: ac.signal});
  let got = 0;
  try {
    for await (const ch of st) { if (ch.choices[0]?.delta?.content && ++got >= 2) ac.abort(); }
  } catch { /* aborted */ }
  const waited = await waitIdle(10000);
  check(waited >= 0, 'a disconnected stream frees its slot', waited);
  const m = await get('/metrics');
  check(metric(m.text, 'dflash_requests_total', 'result="cancelled"') >= 1, 'the cancel is counted');
}

// ---- tokenize / detokenize -------------------------------------------------------------
{
  const text = 'Hello, world! héllo 日本 🙂';
  const t = await post('/tokenize', JSON.stringify({content: text}));
  check(t.status === 200 && Array.isArray(t.json.tokens) && t.json.tokens.length > 0, '/tokenize', t.json);
  const d = await post('/detokenize', JSON.stringify({tokens: t.json.tokens}));
  check(d.status === 200 && d.json.content === text, '/detokenize round trip', d.json);
  const p = await post('/tokenize', JSON.stringify({content: 'Hello', with_pieces: true}));
  check(p.json.tokens.map((x) => x.piece).join('') === 'Hello', '/tokenize with_pieces', p.json);
  const b = await post('/detokenize', JSON.stringify({tokens: [-1]}));
  check(b.status === 400 && b.json?.error, '/detokenize refuses a bad id', b.status);
}

// ---- bad requests: the documented 4xx, OpenAI's error shape ------------------------------
function isErr(r, status, what, param) {
  const e = r.json?.error;
  const ok = r.status === status && e && typeof e.message === 'string' && typeof e.type === 'string' &&
             'param' in e && 'code' in e && (param === undefined || e.param === param);
  return check(ok, what, {status: r.status, body: r.text.slice(0, 300)});
}
const chatBody = (o) => JSON.stringify({...chatReq(), ...o});
{
  isErr(await post('/v1/chat/completions', '{"messages": [ '), 400, 'invalid JSON -> 400');
  isErr(await post('/v1/chat/completions', '[1, 2]'), 400, 'a JSON array body -> 400');
  isErr(await post('/v1/chat/completions', JSON.stringify({model})), 400, 'missing messages -> 400', 'messages');
  isErr(await post('/v1/chat/completions', chatBody({messages: 'hi'})), 400, 'messages not an array -> 400', 'messages');
  isErr(await post('/v1/chat/completions', chatBody({messages: []})), 400, 'empty messages -> 400', 'messages');
  isErr(await post('/v1/chat/completions', chatBody({messages: [{role: 'wizard', content: 'x'}]})), 400, 'bad role -> 400');
  isErr(await post('/v1/chat/completions', chatBody({messages: [{role: 'user', content: 5}]})), 400, 'content a number -> 400');
  isErr(await post('/v1/chat/completions', chatBody({temperature: 'hot'})), 400, 'temperature a string -> 400', 'temperature');
  isErr(await post('/v1/chat/completions', chatBody({temperature: 7})), 400, 'temperature out of range -> 400', 'temperature');
  isErr(await post('/v1/chat/completions', chatBody({max_tokens: -5})), 400, 'negative max_tokens -> 400', 'max_tokens');
  isErr(await post('/v1/chat/completions', chatBody({max_tokens: 1.5})), 400, 'fractional max_tokens -> 400', 'max_tokens');
  isErr(await post('/v1/chat/completions', chatBody({max_tokens: '10'})), 400, 'max_tokens a string -> 400', 'max_tokens');
  isErr(await post('/v1/chat/completions', chatBody({stream: 'yes'})), 400, 'stream a string -> 400', 'stream');
  isErr(await post('/v1/chat/completions', chatBody({stop: 5})), 400, 'stop a number -> 400', 'stop');
  isErr(await post('/v1/chat/completions', chatBody({stop: ['a', 7]})), 400, 'stop list with a number -> 400', 'stop');
  isErr(await post('/v1/chat/completions', chatBody({n: 2})), 400, 'n = 2 -> 400', 'n');
  isErr(await post('/v1/chat/completions', chatBody({seed: 'x'})), 400, 'seed a string -> 400', 'seed');
  isErr(await post('/v1/chat/completions', chatBody({top_logprobs: 50, logprobs: true})), 400, 'top_logprobs > 20 -> 400');
  isErr(await post('/v1/chat/completions', chatBody({chat_template_kwargs: {enable_thinking: 'no'}})), 400,
        'enable_thinking a string -> 400');
  isErr(await post('/v1/chat/completions', chatBody({logit_bias: {abc: 1}})), 400, 'logit_bias bad key -> 400');
  const unknownModel = await post('/v1/chat/completions', chatBody({model: 'no-such-model'}));
  isErr(unknownModel, 404, 'unknown model -> 404');
  check(unknownModel.json?.error?.code === 'model_not_found', 'unknown model: code model_not_found');
  isErr(await post('/v1/completions', JSON.stringify({model})), 400, 'missing prompt -> 400', 'prompt');
  isErr(await post('/v1/completions', JSON.stringify({model, prompt: {a: 1}})), 400, 'prompt an object -> 400', 'prompt');
  isErr(await post('/v1/completions', JSON.stringify({model, prompt: [1e9]})), 400, 'prompt token id out of range -> 400');
  isErr(await post('/v1/chat/completions', '['.repeat(5000) + ']'.repeat(5000)), 400, 'deep JSON nesting -> 400');
  isErr(await post('/v1/chat/completions', Buffer.from([0x7b, 0xff, 0xfe, 0x7d])), 400, 'invalid UTF-8 -> 400');
  const ctx = await post('/v1/chat/completions', chatBody({messages: [{role: 'user', content: 'word '.repeat(expect.ctx_size + 10)}]}));
  isErr(ctx, 400, 'prompt longer than the context -> 400');
  const huge = await post('/v1/chat/completions', chatBody({messages: [{role: 'user', content: 'x'.repeat(maxBody + 10)}]}));
  isErr(huge, 413, 'body over --max-body -> 413');
  isErr(await get('/v1/no-such-endpoint'), 404, 'unknown endpoint -> 404');
  isErr(await get('/v1/chat/completions'), 405, 'GET on a POST endpoint -> 405');
  // Through the client, errors arrive as its APIError classes.
  try {
    await client.chat.completions.create(chatReq({model: 'no-such-model'}));
    check(false, 'client: unknown model throws');
  } catch (e) {
    check(e instanceof APIError && e.status === 404, 'client: unknown model is a 404 APIError', e.status);
  }
  try {
    await client.chat.completions.create(chatReq({max_tokens: -1}));
    check(false, 'client: negative max_tokens throws');
  } catch (e) {
    check(e instanceof APIError && e.status === 400 && /max_tokens/.test(e.message), 'client: 400 names the field', e.message);
  }
}

// ---- API key ------------------------------------------------------------------------------
if (process.env.SERVER_API_KEY) {
  isErr(await post('/v1/chat/completions', chatBody({}), authHeaders('wrong-key')), 401, 'bad API key -> 401');
  isErr(await post('/v1/chat/completions', chatBody({}), {'content-type': 'application/json'}), 401, 'no API key -> 401');
  isErr(await get('/v1/models', {}), 401, '/v1/models needs the key');
  isErr(await get('/metrics', {authorization: 'Bearer ' + process.env.SERVER_API_KEY + 'x'}), 401, '/metrics needs the key');
  const h = await fetch(base + '/health');
  check(h.status === 200, '/health needs no key');
}

// ---- and it still serves --------------------------------------------------------------------
{
  const r = await client.chat.completions.create(chatReq());
  check(r.choices[0].message.content === expect.chat_text, 'after all the bad requests, still serving correctly');
  const m = await get('/metrics');
  check(m.status === 200 && /dflash_spec_rounds_total \d/.test(m.text) && /dflash_queue_depth \d/.test(m.text),
        '/metrics has the speculative counters and queue depth');
  check(metric(m.text, 'dflash_http_responses_total', 'class="4xx"') > 20, '/metrics counts the 4xx answers');
}
summary('api');
