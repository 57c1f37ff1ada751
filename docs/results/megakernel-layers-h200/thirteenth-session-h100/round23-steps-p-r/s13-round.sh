#!/usr/bin/env bash
# thirteenth session: a round of candidates on main (production = step 15) by catalog name ($CANDS):
# their GPU tests ($TESTS), both gates each (the launch gate judges --task launch, the plain build, and --task worker), the bench without torch, the sub-spans of all
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1
CANDS=${CANDS:-step_p}; TESTS=${TESTS:-}  # the candidates GPU tests run in the whole suite
FINAL=$OUT; D=/tmp/round23; rm -rf $D; mkdir -p $D; cp .hazards/s13-round.sh $D/
trap 'tar -czf $FINAL/round23.tar.gz -C $D .' EXIT  # kept when a timeout cuts the round
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader > $D/env.txt; echo "tree: main $(cat .hazards/tree.txt); candidates $CANDS" >> $D/env.txt; date -u >> $D/env.txt
timeout 100 python3 - "$CANDS" > $D/build.txt 2>&1 <<'PY'
import concurrent.futures as cf, sys
from hazards.families import get_family
from hazards.stress_family import family_binary
from hazards.megakernel_layers import faithful as FA
f = get_family('megakernel_layers')
ds = [None, {'HZ_PROFILER': 1}, {'HZ_PROFILER': 1, 'MKL_PROF_SUBSPANS': 1}]
for c in sys.argv[1].split(','):
    d = dict(FA.candidate(c).defines)
    ds += [d, {**d, 'HZ_PROFILER': 1}, {**d, 'HZ_PROFILER': 1, 'MKL_PROF_SUBSPANS': 1}]
print(list(cf.ThreadPoolExecutor(8).map(lambda d: family_binary(f, defines=d), ds)))
PY
echo "build rc $?"
[ -n "$TESTS" ] && { timeout 100 python3 -m pytest -m gpu -q -p no:randomly $TESTS > $D/pytest.txt 2>&1; echo "pytest rc $?"; tail -6 $D/pytest.txt | cut -c1-300; }
for c in ${CANDS//,/ }; do
  timeout 60 python3 -m hazards gate perf --baseline megakernel_layers:production --candidate megakernel_layers:$c --workers 132 --repeats 12 --profiled-launches 3 --wait 0s --task launch --task worker --json > $D/gate_${c}_launch.json 2> $D/gate_${c}_launch.err; echo "gate $c launch rc $?"
  timeout 60 python3 -m hazards gate perf --baseline megakernel_layers:production --candidate megakernel_layers:$c --workers 132 --repeats 12 --profiled-launches 3 --wait 0s --json > $D/gate_${c}.json 2> $D/gate_${c}.err; echo "gate $c rc $?"
done
ALSO=$(python3 -c "
import sys; from hazards.megakernel_layers import faithful as FA
print(' '.join('--also-define ' + ','.join(f'{k}={v}' for k, v in FA.candidate(c).defines) for c in sys.argv[1].split(',')))" "$CANDS")
timeout 60 python3 bench/megakernel_layers_perf.py $ALSO --no-torch --json $D/perf.json > $D/perf.txt 2>&1; echo "perf rc $?"
PROF="${PROF_EXTRA:-}"; for c in ${CANDS//,/ }; do PROF="$PROF --candidate $c"; done
timeout 50 python3 bench/megakernel_layers_profile.py --candidate production $PROF --launches 5 --subspans --out $D/subspans > $D/subspans.txt 2>&1; echo "subspans rc $?"
timeout 10 python3 ci/gpu/layers_campaign_table.py $D > $D/table.md 2>&1
date -u >> $D/env.txt
cat $D/table.md | cut -c1-400; grep -E "us/step|copy floor|x floor|headline|MKL_" $D/perf.txt | head -12
grep -A14 "every layer of all 5 launches" $D/subspans.txt | head -60
