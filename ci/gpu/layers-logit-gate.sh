#!/usr/bin/env bash
# The logit gate on the real layered megakernel, one GPU, <= 120 s of script time.
#     OUT=/tmp/out bash ci/gpu/layers-logit-gate.sh                 # candidate: step (c), MKL_CAMPAIGN_STEP=4
#     CANDIDATE=MKL_CAMPAIGN_STEP=3 OUT=/tmp/out bash ci/gpu/layers-logit-gate.sh   # another candidate build
#     CANDIDATE=none OUT=/tmp/out bash ci/gpu/layers-logit-gate.sh                  # production only
# What it settles (hazards/gates/synthlm/megakernel.py; docs/gates.md):
#   * builds the family binary (production, and the candidate's defines: CANDIDATE)
#     while the synthetic-language model at the kernel's toy shape (synthlm config `layers`)
#     trains for at most 35 s (or loads from the cache);
#   * the precision-matched reference (torch, the kernel's arithmetic) and a correct
#     reordering of it (f64 accumulation: the floor), then the megakernel decodes 64 held-out
#     sequences (8192 tokens, one launch each) for the family variants clean, clean_skew,
#     stale_descriptor, amax_tail, dead_flag, stale_release (the family's skew); embedding
#     and LM head in torch around it; every path's logit sink as .npz;
#   * `hazards gate logits` (the CLI) judges every sink against the reference: clean ones must
#     pass, the four silent corruptions must fail. Prints the verdicts;
#   * the candidate build: clean (must pass: a new summation order may move last bits, not the
#     model) and stale_descriptor (must fail: the switch still acts in the candidate).
# Raw output: $OUT/layers-logit-gate/ (console.log, env.txt, result.json, gate-cli.txt,
# gate-cli.json, and result-candidate.json with CANDIDATE; the sinks stay on the machine).
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD HZ_BUILD_DIR=${HZ_BUILD_DIR:-/tmp/hz-build} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/layers-logit-gate-out}
R=$OUT/layers-logit-gate
W=$(mktemp -d)/layers-logit-gate
mkdir -p "$R" "$W"
exec > >(tee "$R/console.log") 2>&1
T0=$(date +%s)
log() { echo "== [$(( $(date +%s) - T0 ))s] $*"; }
RATIO=1.0001  # the gate's defaults (hazards/gates/__init__.py), also on this model
MAX_KL=1e-6
TRAIN_S=35
CANDIDATE=${CANDIDATE:-MKL_CAMPAIGN_STEP=4}
[ "$CANDIDATE" = none ] && CANDIDATE=

{
date -u +"date %Y-%m-%dT%H:%M:%SZ"; hostname
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader
nvcc --version | tail -2 | head -1
python3 -c "import torch; print('torch', torch.__version__)"
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "sources sha256 $(cat standalone/megakernel_layers/* hazards/gates/synthlm/*.py | sha256sum | cut -c1-16)"
echo "candidate defines: ${CANDIDATE:-none}"
} | tee "$R/env.txt"

log "build (production${CANDIDATE:+ and $CANDIDATE}) beside training the model (<= ${TRAIN_S} s, or the cache)"
timeout 150 python3 -c "from hazards.family import build_harness; print(build_harness('megakernel_layers'))" \
  > "$W/build.txt" 2>&1 &
B1=$!
B2=
if [ -n "$CANDIDATE" ]; then
  timeout 150 python3 -c "
from hazards.gates.synthlm.megakernel import parse_defines
from hazards.family import build_harness
print(build_harness('megakernel_layers', defines=parse_defines('$CANDIDATE')))" > "$W/build_candidate.txt" 2>&1 &
  B2=$!
fi
timeout 120 python3 -m hazards.gates.synthlm.train --config layers --max-seconds "$TRAIN_S" > "$W/train.txt" 2>&1
echo "train exit $?: $(grep SYNTHLM "$W/train.txt" | cut -c1-400)"
wait $B1; echo "build exit $?: $(tail -1 "$W/build.txt")"
if [ -n "$B2" ]; then wait "$B2"; echo "candidate build exit $?: $(tail -1 "$W/build_candidate.txt")"; fi

log "decode: reference, reference_f64, and every variant through the production kernel"
timeout 150 python3 -m hazards.gates.synthlm.megakernel --out "$W/sinks" --sequences 64 --max-seconds "$TRAIN_S" \
  --ratio "$RATIO" --max-kl "$MAX_KL" --timeout 25
echo "driver exit $?"
cp "$W/sinks/result.json" "$R/result.json" 2>/dev/null

log "hazards gate logits (the CLI) on every sink"
CEIL=$(python3 -c "import json; print(json.load(open('$W/sinks/result.json'))['ceiling'])" 2>/dev/null || echo 100)
CANDS=()
for v in reference_f64 clean clean_skew stale_descriptor amax_tail dead_flag stale_release; do
  [ -f "$W/sinks/$v.npz" ] && CANDS+=(--candidate "$W/sinks/$v.npz")
done
if [ ${#CANDS[@]} -gt 0 ]; then
  python3 -m hazards gate logits --reference "$W/sinks/reference.npz" "${CANDS[@]}" --ratio "$RATIO" \
    --max-kl "$MAX_KL" --ceiling "$CEIL" > "$R/gate-cli.txt" 2>&1
  echo "gate logits exit $? (1 expected: the corruptions fail)"
  grep -E "vs reference: (PASS|FAIL)" "$R/gate-cli.txt"
  python3 -m hazards gate logits --reference "$W/sinks/reference.npz" "${CANDS[@]}" --ratio "$RATIO" \
    --max-kl "$MAX_KL" --ceiling "$CEIL" --json > "$R/gate-cli.json" 2>/dev/null
fi

if [ -n "$CANDIDATE" ]; then
  log "candidate $CANDIDATE: clean and stale_descriptor"
  timeout 60 python3 -m hazards.gates.synthlm.megakernel --out "$W/candidate" --sequences 64 \
    --max-seconds "$TRAIN_S" --ratio "$RATIO" --max-kl "$MAX_KL" --timeout 20 --defines "$CANDIDATE" \
    --variants clean,stale_descriptor | grep -E "^\| |LAYERS_LOGIT_GATE" | cut -c1-300
  cp "$W/candidate/result.json" "$R/result-candidate.json" 2>/dev/null
fi
log "done"
