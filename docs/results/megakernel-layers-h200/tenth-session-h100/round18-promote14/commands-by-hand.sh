#!/usr/bin/env bash
# Round 18's commands after device-plan9.sh, as the lead ran them (three device calls on the same
# warm H100, from the repository root; $OUT the device tool's output folder).
export PYTHONPATH=$PWD HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1
# 3. the bench with torch (perf_torch.txt / .json, bench-env.txt)
mkdir -p $OUT/r18; nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader > $OUT/r18/env.txt; date -u >> $OUT/r18/env.txt
echo "tree: main $(cat .hazards/tree.txt)" >> $OUT/r18/env.txt
timeout 165 python3 bench/megakernel_layers_perf.py --also-define MKL_CAMPAIGN_STEP=10 --compile-mode default+graph \
  --compile-timeout 90 --rounds 9 --json $OUT/r18/perf_torch.json > $OUT/r18/perf_torch.txt 2>&1
# 4. the logit gate on production (logit/)
mkdir -p $OUT/logit; date -u > $OUT/logit/when.txt
OUT=$OUT/logit CANDIDATE=none timeout 150 bash ci/gpu/layers-logit-gate.sh
# 5. the ragged-decode regression and snapshot_epoch at the 70-us skew on production (ragged-snapshot/)
W=$OUT/r18b; mkdir -p $W; date -u > $W/when.txt
timeout 55 python3 bench/ragged_decode_h200.py --calls 20 --out-md $W/ragged.md --json $W/ragged.json > $W/ragged.txt 2>&1
BIN=$(python3 -c "from hazards.family import build_harness; print(build_harness('megakernel_layers'))")
timeout 25 python3 -m hazards repro --family megakernel_layers --binary "$BIN" --store $W/repro.db --json --keep-going \
  --variant snapshot_epoch --params '{"jitter_cycles": 138600}' --runs 16 --launches 1 --timeout 1.5 --no-forensics \
  > $W/repro_snapshot_epoch_70us.json 2> $W/repro_snapshot_epoch_70us.err
python3 ci/gpu/repro_summary.py $W/repro_snapshot_epoch_70us.json 1
