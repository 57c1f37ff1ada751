#!/usr/bin/env bash
# Lead's second device call (carried, not in the repository): on a copy with branch merge8's
# non-docs diff (production = step (d)): hazards check on the family and the hang sentences of
# step (d)'s build; then on this tree (main) the long batches with their new launch counts.
export PYTHONPATH=$PWD HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
MAIN=$PWD
rm -rf /tmp/m8 && cp -a . /tmp/m8 && cd /tmp/m8 && git apply --whitespace=nowarn .hazards/merge8.patch && echo "merge8 patch applied" || exit 3
export PYTHONPATH=/tmp/m8
mkdir -p $OUT/m8
echo "== hazards check --families megakernel_layers --skip clang --budget 90s (production = step (d))"; date -u
timeout 150 python3 -m hazards check --families megakernel_layers --skip clang --budget 90s --json \
  --junit $OUT/m8/check-junit.xml > $OUT/m8/check.json 2> $OUT/m8/check.err; echo "check exit $?"; tail -15 $OUT/m8/check.err; date -u
BIN=$(python3 -c "
from hazards.families import get_family
from hazards.stress_family import family_binary
print(family_binary(get_family('megakernel_layers')))")
echo "== hang sentences on $BIN"
bash ci/gpu/layers-hang-sentences.sh $OUT/m8 "$BIN" 60 600 2>&1 | tee $OUT/m8/hang-sentences.txt | cut -c1-600; date -u
cd $MAIN && export PYTHONPATH=$MAIN
OUT=$OUT bash ci/gpu/long-batch-beats.sh; echo "== long batches rc=$?"; date -u
