#!/usr/bin/env bash
# Lead's last device call, eighth session (carried), on main's tree as landed (code = branch
# layers9's, whose GPU suite passed on an H100 at 04:06 UTC):
#   H200: issue 23's three short owed rows: the check at its defaults with a cold static cache,
#         the long batches, the deadlock family's clean variants' false stalls;
#   other (H100): issue 25's evidence on candidate step_g_on_e under the promotion rule: the
#         default gate against step_e, clean variants and canaries on its build, the logit gate.
export HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $name"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
pack() { cd "$OUT" && tar -czf /tmp/all.tar.gz . && find . -mindepth 1 -delete && mv /tmp/all.tar.gz "$OUT/all-${1}.tar.gz"; ls -la "$OUT"; }
trap 'pack 11' EXIT
if [[ "$name" == *H200* ]]; then
  OUT=$OUT bash ci/gpu/check-cold-static-cache.sh 2>&1 | tail -15; echo "== check script rc=${PIPESTATUS[0]}"; date -u
  OUT=$OUT bash ci/gpu/long-batch-beats.sh 2>&1 | tail -12; echo "== long batches rc=${PIPESTATUS[0]}"; date -u
  left=$(( ${CAP_S:-430} - SECONDS ))
  [ $left -ge 140 ] && { OUT=$OUT bash ci/gpu/falsestall-h200.sh $(( left > 180 ? 170 : left - 10 )) deadlock/fixed_grid,deadlock/fixed_epoch,deadlock/fixed_epoch_widen 2>&1 | tail -20; echo "== falsestall deadlock rc=${PIPESTATUS[0]}"; }
else
  mkdir -p $OUT/g
  for d in "'MKL_CAMPAIGN_STEP': 6" "'MKL_CAMPAIGN_STEP': 8, 'MKL_ATTN_AHEAD': 0"; do timeout 90 python3 -c "
from hazards.families import get_family
from hazards.stress_family import family_binary
print(family_binary(get_family('megakernel_layers'), defines={'HZ_PROFILER': 1, $d}))" & done; wait
  timeout 60 python3 -m hazards gate perf --baseline megakernel_layers:step_e --candidate megakernel_layers:step_g_on_e --workers 132 --repeats 12 --json > $OUT/g/gate-default.json 2> $OUT/g/gate-default.err
  echo "gate step_e -> step_g_on_e (default) exit $?: $(python3 ci/gpu/gate_summary.py $OUT/g/gate-default.json 2>&1 | cut -c1-700)"; date -u
  timeout 60 python3 bench/megakernel_layers_acceptance.py --define MKL_CAMPAIGN_STEP=8 --define MKL_ATTN_AHEAD=0 \
    --clean-launches 500 --clean-budget 2 --canary-budget 1 --skip-agreement --json $OUT/g/acceptance.json > $OUT/g/acceptance.txt 2>&1
  echo "acceptance exit $?"; cut -c1-220 $OUT/g/acceptance.txt | grep -v Warning | tail -14; date -u
  CANDIDATE=MKL_CAMPAIGN_STEP=8,MKL_ATTN_AHEAD=0 OUT=$OUT/g timeout 150 bash ci/gpu/layers-logit-gate.sh 2>&1 | tail -25; echo "== logit gate rc=${PIPESTATUS[0]}"; date -u
fi
date -u
