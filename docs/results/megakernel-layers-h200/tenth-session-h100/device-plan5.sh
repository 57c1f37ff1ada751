#!/usr/bin/env bash
# tenth session, call 5: how much the launch gains from attention on more workers (production,
# chunk_tokens 124 (auto: 33 chunks) / 64 / 32), the per-task profile at 32; on an H200 also the
# bench with every torch path (step 10's first H200 headline)
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1
FINAL=$OUT; D=/tmp/chunks; rm -rf $D; mkdir -p $D
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv,noheader > $D/env.txt; echo "tree: main 829ab29 (production = step 10)" >> $D/env.txt; date -u >> $D/env.txt
timeout 60 python3 bench/megakernel_layers_perf.py --no-torch --also chunk_tokens=64 --also chunk_tokens=32 --json $D/perf_chunks.json > $D/perf_chunks.txt 2>&1; echo "perf rc $?"; tail -8 $D/perf_chunks.txt
timeout 45 python3 bench/megakernel_layers_profile.py --candidate production --candidate chunks32 --candidate chunks64 --launches 5 --out $D/profile > $D/profile.txt 2>&1; echo "profile rc $?"
grep -E "^==|layer head|layer time" $D/profile.txt
if grep -q H200 $D/env.txt; then
  timeout 330 python3 bench/megakernel_layers_perf.py --json $D/perf_torch.json > $D/perf_torch.txt 2>&1; echo "perf torch rc $?"; tail -14 $D/perf_torch.txt
fi
date -u >> $D/env.txt
tar -czf $FINAL/chunks.tar.gz -C $D .
