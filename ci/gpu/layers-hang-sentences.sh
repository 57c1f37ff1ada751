#!/usr/bin/env bash
# The tripwire sentence of each megakernel_layers hang class: one `hazards repro` run of 2
# launches per class, its outcome counts and the first failure's sentence printed
# (ci/gpu/repro_summary.py).
#   bash ci/gpu/layers-hang-sentences.sh WORK_DIR BINARY SECONDS [CUT]
# SECONDS bounds the whole loop (a class starts only with 10 s left, each run gets at most 12 s);
# CUT is how many characters of each sentence line are printed (default 900).
W=$1 BIN=$2 END=$(( $(date +%s) + $3 )) CUT=${4:-900}
for v in participant_set chunk_supply shared_line; do
  LEFT=$(( END - $(date +%s) ))
  [ "$LEFT" -lt 10 ] && { echo "== no time left for the hang sentences"; break; }
  echo "== hang class $v: 1 run of 2 launches on $(basename "$(dirname "$BIN")")"
  timeout "$(( LEFT < 12 ? LEFT : 12 ))" python3 -m hazards repro --family megakernel_layers --binary "$BIN" \
    --store "$W/repro.db" --json --keep-going --variant "$v" --runs 1 --launches 2 --timeout 2 --no-forensics \
    > "$W/repro_$v.json" 2> "$W/repro_$v.err"
  python3 ci/gpu/repro_summary.py "$W/repro_$v.json" 2>&1 | cut -c1-"$CUT"
done
