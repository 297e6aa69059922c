// bench_tokenizer_hf.js - Hugging Face's Rust tokenizers (npm `tokenizers`)
// on the same files as bench_tokenizer, one thread, for a side-by-side; with
// --ids OURS.json (written by bench_tokenizer --ids) it also checks that
// both produce the same ids.
//
//   npm install tokenizers@0.23.2     (in any folder; run node from there)
//   RAYON_NUM_THREADS=1 node bench/bench_tokenizer_hf.js TOKENIZER_DIR [--ids F] [--lines] FILE...
//
// --lines also times encodeBatch over the file's lines (one rayon thread), in
// case one long string is a slow path for Hugging Face.
//
// Times are best of 5, as thread CPU time is not available from node:
// process.cpuUsage() (user + system of the process) and wall time are both
// printed. Text is cut to 1 MiB on a character boundary, as bench_tokenizer.
const fs = require('fs');
const path = require('path');
const { Tokenizer } = require(require.resolve('tokenizers', { paths: [process.cwd()] }));

function readText(file) {
  let b = fs.readFileSync(file);
  let n = Math.min(b.length, 1 << 20);
  while (n > 0 && (b[n] & 0xc0) === 0x80) n--;
  return b.subarray(0, n).toString('utf8');
}

async function main() {
  const args = process.argv.slice(2);
  const dir = args.shift();
  let idsFile = null, lines = false;
  const files = [];
  while (args.length) {
    const a = args.shift();
    if (a === '--ids') idsFile = args.shift();
    else if (a === '--lines') lines = true;
    else files.push(a);
  }
  let best = Infinity, tok;
  for (let r = 0; r < 3; r++) {
    const c0 = process.cpuUsage();
    tok = Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));
    const c = process.cpuUsage(c0);
    best = Math.min(best, (c.user + c.system) / 1e3);
  }
  console.log(`tokenizer ${dir}: load ${best.toFixed(1)} ms (best of 3, process CPU time)`);
  const ours = idsFile ? JSON.parse(fs.readFileSync(idsFile, 'utf8')) : null;
  for (const f of files) {
    const text = readText(f);
    const bytes = Buffer.byteLength(text);
    let bestCpu = Infinity, bestWall = Infinity, ids = null;
    for (let r = 0; r < 5; r++) {
      const c0 = process.cpuUsage(), t0 = process.hrtime.bigint();
      const enc = await tok.encode(text, null, { addSpecialTokens: false });
      const wall = Number(process.hrtime.bigint() - t0) / 1e9;
      const c = process.cpuUsage(c0);
      bestCpu = Math.min(bestCpu, (c.user + c.system) / 1e6);
      bestWall = Math.min(bestWall, wall);
      ids = enc.getIds();
    }
    let same = '';
    if (ours && ours[f]) {
      const o = ours[f];
      let i = 0;
      while (i < o.length && i < ids.length && o[i] === ids[i]) i++;
      same = (i === o.length && i === ids.length) ? ', ids identical to ours'
        : `, ids DIFFER from ours at ${i} (${ids[i]} vs ${o[i]})`;
    }
    console.log(`${f}: ${bytes} bytes -> ${ids.length} ids; encode ${(bytes / bestCpu / 1e6).toFixed(2)} ` +
      `MB/s CPU, ${(bytes / bestWall / 1e6).toFixed(2)} MB/s wall${same}`);
    if (lines) {
      const parts = text.split(/(?<=\n)/);
      let lc = Infinity, lw = Infinity, n = 0;
      for (let r = 0; r < 3; r++) {
        const c0 = process.cpuUsage(), t0 = process.hrtime.bigint();
        const encs = await tok.encodeBatch(parts, { addSpecialTokens: false });
        const wall = Number(process.hrtime.bigint() - t0) / 1e9;
        const c = process.cpuUsage(c0);
        lc = Math.min(lc, (c.user + c.system) / 1e6);
        lw = Math.min(lw, wall);
        n = encs.reduce((a, e) => a + e.getIds().length, 0);
      }
      console.log(`  as ${parts.length} lines (encodeBatch): ${n} ids; ${(bytes / lc / 1e6).toFixed(2)} MB/s CPU, ` +
        `${(bytes / lw / 1e6).toFixed(2)} MB/s wall`);
    }
  }
}

main();
