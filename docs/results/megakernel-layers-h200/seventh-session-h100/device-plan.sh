#!/usr/bin/env bash
# Lead's device plan for whichever card comes (not part of the repository: carried).
#   H200: issue 23's check at defaults with a cold static cache, the whole GPU suite, the long
#         batches, then ragged_decode's false stalls toward 20,000 launches with what is left.
#   other (H100): the whole GPU suite on this tree, then issue 25's promote round on a copy of
#         this tree with branch merge8's non-docs diff applied (.hazards/merge8.patch).
export PYTHONPATH=$PWD HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $name"; date -u
if [[ "$name" == *H200* ]]; then
  OUT=$OUT bash ci/gpu/check-cold-static-cache.sh; echo "== check script rc=$?"; date -u
  OUT=$OUT BUDGET=330 bash ci/gpu/final-gpu-tests.sh > $OUT/final-gpu-tests.console 2>&1; echo "== GPU suite rc=$?"
  tail -4 $OUT/final-gpu-tests.console; date -u
  OUT=$OUT bash ci/gpu/long-batch-beats.sh; echo "== long batches rc=$?"; date -u
  left=$(( 578 - SECONDS )); if [ $left -ge 60 ]; then OUT=$OUT bash ci/gpu/falsestall-h200.sh $left ragged_decode; echo "== falsestall rc=$?"; else echo "== falsestall skipped: $left s left"; fi; date -u
else
  OUT=$OUT BUDGET=340 bash ci/gpu/final-gpu-tests.sh > $OUT/final-gpu-tests.console 2>&1; echo "== GPU suite rc=$?"
  tail -4 $OUT/final-gpu-tests.console; date -u
  rm -rf /tmp/m8 && cp -a . /tmp/m8 && cd /tmp/m8 && git apply --whitespace=nowarn .hazards/merge8.patch \
    && echo "merge8 patch applied" || { echo "PATCH FAILED"; exit 3; }
  mkdir -p $OUT/promote
  OUT=$OUT/promote BUDGET=205 timeout 220 bash ci/gpu/layers-campaign.sh promote; echo "== promote rc=$?"; date -u
fi
