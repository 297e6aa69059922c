#!/usr/bin/env bash
# test_bench_cli.sh - `dflash bench` end to end on a tiny random Qwen3 target
# and DFlash drafter (tools/make_checkpoint.py), every section, two weight
# types: the run succeeds, its JSON parses and holds what the tables show
# (no timing assertions: only presence, shapes, positivity and exactness --
# every replayed speculative run must equal classic decode). Bad options
# exit 2 with a message.
set -u
bin=${DFLASH_BIN:?}
src=${DFLASH_SRC:-..}
PY=${DFLASH_PYTHON:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/build/venv/bin/python}
tmp=$(mktemp -d /tmp/dflash-test-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }

$PY "$src/tools/make_checkpoint.py" --preset tiny --dtype bf16 --quiet --out "$tmp/t" &&
  $PY "$src/tools/make_checkpoint.py" --drafter --target "$tmp/t" --layers 2 --block-size 16 \
    --quiet --out "$tmp/d" || { echo "FAIL make_checkpoint"; echo "0 passed, 1 failed"; exit 1; }

if "$bin" bench -m "$tmp/t" --draft "$tmp/d" -t 2 --types bf16,q8_0 --ctx 128,256 --ttft-max 128 \
    -n 24 --tau 1,6.5 --blocks 4,8 --max-block 8 --reps 1 --temps 0,1 --rule-block 4 \
    --json "$tmp/b.json" \
    >"$tmp/out" 2>"$tmp/err"; then ok; else bad "dflash bench exited $?"; cat "$tmp/err"; fi
grep -q "speculative A/B" "$tmp/out" && grep -q "acceptance rules" "$tmp/out" && grep -q "context ladder" "$tmp/out" &&
  grep -q "decode summary" "$tmp/out" && ok || bad "tables missing from stdout"

$PY - "$tmp/b.json" <<'PYEOF' && ok || bad "JSON checks"
import json, sys
j = json.load(open(sys.argv[1]))
m = j["machine"]
assert m["read_gbs"] > 0 and m["fma_gflops"] > 0 and m["threads"] == 2, m
assert [d["type"] for d in j["decode"]] == ["bf16", "q8_0"], j["decode"]
for d in j["decode"]:
    assert d["tok_s"] > 0 and d["gbs"] > 0 and d["weight_bytes"] > 0, d
    r = d["sustained"]
    assert r["tokens"] == 256 and 0 < r["ms_p10"] <= r["ms_median"] <= r["ms_p90"], r
    assert abs(r["tok_s"] * r["ms_median"] - 1e3) < 1e-6 * r["tok_s"] and r["frac_of_bw"] > 0, r
    p = d["paired"]
    assert p["pairs"] == 32 and p["sample_bytes"] == 256 << 20, p
    assert 0 < p["frac_p10"] <= p["frac_median"] <= p["frac_p90"], p
assert len(j["verify"]) == 2
for v in j["verify"]:
    assert [r["B"] for r in v["rows"]] == list(range(1, 9)), v
    assert v["rows"][0]["ratio"] == 1 and all(r["ms"] > 0 for r in v["rows"]), v
s = j["spec"]
modes = [(r["tau"], r["mode"]) for r in s["runs"]]
assert modes == [(t, m) for t in (1, 6.5) for m in ("classic", "B=4", "B=8", "adaptive")], modes
for r in s["runs"]:
    assert r["matches_classic"] is True, r
    assert r["tok_s"] > 0, r
    if r["mode"] != "classic":
        assert r["accepted"] == r["forced"], r
        assert r["exact_checked"] == 1, r
    if r["tau"] == 1:
        assert r["accepted"] == 0, r
assert len(s["cost_table_ms"]) == 8 and all(s["cost_table_ms"][b - 1] > 0 for b in (1, 2, 3, 4, 6, 8))
# rules: per temperature, classic, the exact rule replayed at each profile,
# then every rule (only exact when greedy) with the real drafter, pinned and adaptive
ru = j["rules"]["runs"]
want = [(0, "none", "none", "classic"), (0, "exact", "replay", "B=4"), (0, "exact", "replay", "B=4"),
        (0, "exact", "real", "B=4"), (0, "exact", "real", "adaptive"),
        (1, "none", "none", "classic"), (1, "exact", "replay", "B=4"), (1, "exact", "replay", "B=4")]
want += [(1, rule, "real", m) for rule in ("exact", "rejection", "typical") for m in ("B=4", "adaptive")]
assert [(r["temp"], r["rule"], r["drafter"], r["mode"]) for r in ru] == want, ru
for r in ru:
    assert r["tok_s"] > 0 and r["tau"] >= 1 and 0 <= r["accept_rate"] <= 1, r
    if r["rule"] == "exact":
        assert r["matches_classic"] is True, r   # the exact rule's promise, sampled too
    if r["drafter"] == "replay" and r["tau_profile"] == 1:
        assert r["accepted"] == 0 and r["tau"] == 1, r
    if r["drafter"] == "replay" and r["tau_profile"] == 6.5 and r["temp"] == 1:
        assert r["accepted"] > 0, r              # forced drafts accepted at temperature 1
    if r["rule"] == "rejection":
        assert r["accepted_lossy"] == 0, r
c = j["ctx"]
assert [r["ctx"] for r in c] == [128, 256] and c[0]["ttft_measured"] and not c[1]["ttft_measured"]
assert all(r["decode_tok_s"] > 0 and r["prefill_tok_s"] > 0 and r["ttft_s"] > 0 for r in c)
assert all(r["verify_rows"] == 8 and r["verify_ms"] > 0 for r in c) and j["kv_type"] == "f16"  # --max-block 8
assert [r["type"] for r in j["peak_rss"]] == ["bf16", "q8_0"] and j["peak_rss"][0]["with_drafter"]
assert all(r["peak_rss_mb"] > 0 for r in j["peak_rss"])
PYEOF

# only some sections; no drafter: the spec section says so
"$bin" bench -m "$tmp/t" -t 1 --sections decode,ctx --ctx 64 --reps 1 --json "$tmp/c.json" \
  >"$tmp/out2" 2>&1 && $PY -c "
import json, sys; j = json.load(open('$tmp/c.json'))
assert 'spec' not in j and len(j['decode']) == 1 and len(j['ctx']) == 1 and j['verify'] == []
" && ok || bad "sections decode,ctx"

for args in "--sections nope" "--tau 0.5" "--blocks 1" "--types" "--bogus" "--temps -1" \
    "--rule-block 1"; do
  # shellcheck disable=SC2086
  "$bin" bench -m "$tmp/t" $args >"$tmp/o" 2>"$tmp/e"
  rc=$?
  [ $rc = 2 ] && grep -q "^dflash" "$tmp/e" && ok || bad "'$args': exit $rc, $(cat "$tmp/e")"
done

echo "$pass passed, $fail failed"
[ $fail = 0 ]
