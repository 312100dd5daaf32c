#!/bin/sh
# `dtectl plan` (or dte-plan before dtectl exists): stable output lines,
# JSON, and clear errors with the right exit status on bad input.
set -u
B=${B:-build}
PY=${PYTHON:-/usr/bin/python3}
D=tests/data/layout
if [ -x "$B/bin/dtectl" ]; then PLAN="$B/bin/dtectl plan"; else PLAN="$B/bin/dte-plan"; fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
checks=0; failed=0

ok()   { checks=$((checks + 1)); echo "ok   $1"; }
bad()  { checks=$((checks + 1)); failed=$((failed + 1)); echo "FAIL $1"; }

# expect NAME STATUS PATTERN ARGS...: exit status and a line matching PATTERN
# on stdout+stderr.
expect() {
	name=$1; want=$2; pat=$3; shift 3
	$PLAN "$@" >"$T/out" 2>&1
	rc=$?
	if [ "$rc" -eq "$want" ] && grep -qE "$pat" "$T/out"; then
		ok "$name"
	else
		bad "$name (exit $rc, want $want, pattern '$pat')"; cat "$T/out"
	fi
}

M=$D/models/qwen3-30b-a3b.json
expect "moe plan exact" 0 '^coverage: exact$' \
	--model $M --source megatron:tp=2,dp=4,ep=4,etp=1 --sink sglang:tp=4,ep=2 --sink-replicas 2
grep -qE '^entries: [0-9]+$' "$T/out" && ok "entries line" || bad "entries line"
grep -qE '^replication: replicas=2 ' "$T/out" && ok "replication line" || bad "replication line"
[ "$(grep -cE '^link [0-9]+->[0-9]+: entries=[0-9]+ elements=[0-9]+ dense_bytes=[0-9]+ sparse_bytes=[0-9]+$' "$T/out")" -eq 2 ] \
	&& ok "one link per replica" || bad "one link per replica"
# Totals: dense = 2 B/element, sparse = 4 B per changed element at 2 %.
if awk '/^total:/ { split($2, e, "="); split($3, d, "="); split($4, s, "=");
	exit !(d[2] == 2 * e[2] && s[2] == int(e[2] * 0.02 * 4 + 0.5)) }' "$T/out"; then
	ok "byte estimates"
else
	bad "byte estimates"; grep '^total' "$T/out"
fi

$PLAN --model $D/models/llama-3.1-8b.json --source fsdp:dp=4 --sink vllm:tp=8 --json --density 0.01 >"$T/json" 2>"$T/err"
if $PY -c 'import json,sys; p=json.load(open(sys.argv[1])); sys.exit(not (p["coverage"] == "exact" and p["entries"] > 0 and p["total"]["density"] == 0.01 and len(p["links"]) == 1))' "$T/json"; then
	ok "json output"
else
	bad "json output"; head -c 400 "$T/json"; cat "$T/err"
fi

expect "sink tp not dividing heads" 1 'tp=3 does not divide num_attention_heads' \
	--model $M --source megatron:tp=2 --sink sglang:tp=3
# TP above the 4 KV groups: ranks share a group's linear_qkv rows (Megatron's
# num_query_groups < world_size branch).
expect "source tp above kv groups" 0 '^coverage: exact$' \
	--model $M --source megatron:tp=8 --sink sglang:tp=8
expect "malformed config" 1 'malformed JSON' \
	--model $D/bad-malformed.json --source fsdp:dp=1 --sink sglang:tp=1
expect "unknown architecture" 1 'unknown architecture' \
	--model $D/bad-unknown-arch.json --source fsdp:dp=1 --sink sglang:tp=1
expect "missing model" 1 'malformed JSON|No such file|unable to open' \
	--model $T/none.json --source fsdp:dp=1 --sink sglang:tp=1
expect "usage: missing --model" 2 'required' --source fsdp:dp=1 --sink sglang:tp=1
expect "usage: unknown option" 2 'unknown option' --model $M --frobnicate 1
expect "usage: bad density" 2 'density' --model $M --source fsdp:dp=1 --sink sglang:tp=1 --density 2

# Declarative pieces: a spec-hash mismatch, overlapping sink pieces, a gap.
L=$D/tiny-llama-gqa.json
cat >"$T/hash.json" <<'J'
{"spec_hash": "00000000deadbeef", "pieces": [{"tensor": "model.norm.weight", "lo": [0], "hi": [64], "rank": 0, "buffer": 0, "strides": [1]}]}
J
expect "spec hash mismatch" 1 'spec_hash 00000000deadbeef does not match' \
	--model $L --source megatron:tp=1 --sink json:$T/hash.json
cat >"$T/overlap.json" <<'J'
{"pieces": [{"tensor": "model.norm.weight", "lo": [0], "hi": [64], "rank": 0, "buffer": 0, "strides": [1]},
            {"tensor": "model.layers.0.input_layernorm.weight", "lo": [0], "hi": [64], "rank": 0, "buffer": 0, "offset": 32, "strides": [1]}]}
J
expect "overlapping declarative pieces" 1 'overlapping pieces in rank 0 buffer 0' \
	--model $L --source megatron:tp=1 --sink json:$T/overlap.json
cat >"$T/gap.json" <<'J'
{"pieces": [{"tensor": "model.norm.weight", "lo": [0], "hi": [60], "rank": 0, "buffer": 0, "exp_avg": 1, "exp_avg_sq": 2, "strides": [1]}]}
J
cat >"$T/norm.json" <<'J'
{"pieces": [{"tensor": "model.norm.weight", "lo": [0], "hi": [64], "rank": 3, "buffer": 7, "strides": [1]}]}
J
expect "gap named" 1 'gap in tensor model.norm.weight: box \[60:64\]' \
	--model $L --source json:$T/gap.json --sink json:$T/norm.json
grep -q '^coverage: invalid$' "$T/out" && ok "coverage: invalid line" || bad "coverage: invalid line"

echo "layout-cli: checks=$checks passed=$((checks - failed))"
[ "$failed" -eq 0 ]
