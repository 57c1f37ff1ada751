#!/usr/bin/env bash
# Lead's device call, eighth session (carried), for whichever card comes:
#   H200: device-plan8.sh (issue 23's owed rows on main's tree);
#   other (H100): on a copy of main (d90d7de) with branch layers9's non-docs diff applied
#   (= merge8 + candidate step (h)): the whole GPU suite (BUDGET=400), then steph-quick (step (h)
#   against step (e)), then step_g_on_e against step_e judged on the launch, with what is left.
export HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $name"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
[[ "$name" == *H200* ]] && exec bash .hazards/device-plan8.sh
rm -rf /tmp/l9 && cp -a . /tmp/l9 && cd /tmp/l9 && git apply --whitespace=nowarn .hazards/layers9.patch \
  && echo "layers9 patch applied" || { echo "PATCH FAILED"; exit 3; }
export PYTHONPATH=/tmp/l9
pack() { cd "$OUT" && tar -czf /tmp/all.tar.gz . && find . -mindepth 1 -delete && mv /tmp/all.tar.gz "$OUT/all-${1}.tar.gz"; ls -la "$OUT"; }
trap 'pack H100' EXIT
OUT=$OUT BUDGET=400 bash ci/gpu/final-gpu-tests.sh > $OUT/final-gpu-tests.console 2>&1; echo "== GPU suite rc=$?"
grep -E '(PASSED|FAILED|ERROR) ' $OUT/final-gpu-tests.console | grep -v PASSED | head -20
grep -E '[0-9]+ (passed|failed)' $OUT/final-gpu-tests.console | tail -2; tail -2 $OUT/final-gpu-tests.console; date -u
left=$(( 590 - SECONDS ))
if [ $left -ge 100 ]; then
  mkdir -p $OUT/steph
  OUT=$OUT/steph BUDGET=$(( left > 135 ? 120 : left - 15 )) timeout $(( left > 135 ? 130 : left - 5 )) bash ci/gpu/layers-campaign.sh steph-quick 2>&1 | tail -45
  echo "== steph-quick rc=${PIPESTATUS[0]}"; date -u
fi
if [ $(( 590 - SECONDS )) -ge 45 ]; then
  mkdir -p $OUT/gates; tag=step_e-step_g_on_e-worker
  timeout $(( 585 - SECONDS )) python3 -m hazards gate perf --baseline megakernel_layers:step_e --candidate megakernel_layers:step_g_on_e --workers 132 --repeats 12 --task worker --json > $OUT/gates/$tag.json 2> $OUT/gates/$tag.err
  echo "$tag exit $?: $(python3 ci/gpu/gate_summary.py $OUT/gates/$tag.json 2>&1 | cut -c1-600)"
fi
date -u
