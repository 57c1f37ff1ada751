#!/usr/bin/env bash
# Lead's fourth device call (carried): on merge8 (production = step (d)), the campaign's gates
# judged on the whole launch (--task worker) beside the default any-task rule.
export PYTHONPATH=/tmp/m8 HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
rm -rf /tmp/m8 && cp -a . /tmp/m8 && cd /tmp/m8 && git apply --whitespace=nowarn .hazards/merge8.patch && echo "merge8 patch applied" || exit 3
mkdir -p $OUT/gates
for s in 6 7 8; do timeout 90 python3 -c "
from hazards.families import get_family
from hazards.stress_family import family_binary
print(family_binary(get_family('megakernel_layers'), defines={'HZ_PROFILER': 1, 'MKL_CAMPAIGN_STEP': $s}))" & done; wait
g() { local b=$1 c=$2 t=$3 tag=$1-$2${3:+-$3}
  timeout 40 python3 -m hazards gate perf --baseline megakernel_layers:$b --candidate megakernel_layers:$c --workers 132 --repeats 12 ${t:+--task $t} --json > $OUT/gates/$tag.json 2> $OUT/gates/$tag.err
  echo "$tag exit $?: $(python3 -c "
import json,sys; d=json.load(open(sys.argv[1])); p=d['points'][0]
print(d['verdict'], '; '.join(f\"{k} {v['slowCTA']['ratio']:.3f}/{v['wall']['ratio']:.3f}/{v['sumCTA']['ratio']:.3f}\" for k,v in p['ratios'].items()))" $OUT/gates/$tag.json 2>&1 | cut -c1-700)"; }
for pair in "production step_e" "step_e step_f" "step_f step_g"; do set -- $pair; g $1 $2 worker; g $1 $2; done
date -u
