#!/usr/bin/env bash
# tenth session, call 4: Nsight Compute on production's megakernel (one launch of --bench's
# tripwire-compiled-out configuration): warp state stats and stall sampling per SASS line
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1
FINAL=$OUT; D=/tmp/ncu; rm -rf $D; mkdir -p $D
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader > $D/env.txt; echo "tree: main 829ab29 (production = step 10)" >> $D/env.txt; date -u >> $D/env.txt
ncu --version >> $D/env.txt
EXE=$(python3 -c "from hazards.family import build_harness; print(build_harness('megakernel_layers'))")
echo "exe $EXE" >> $D/env.txt
# launch-skip 2: the two warm-up launches of the first configuration (tripwire compiled out)
timeout 200 ncu --kernel-name mkl_megakernel --launch-skip 2 --launch-count 1 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats \
  --section SourceCounters --section Occupancy --section LaunchStats \
  -o $D/prod $EXE --bench '{"rounds":1,"launches":3}' > $D/ncu.log 2>&1; echo "ncu rc $?"
tail -5 $D/ncu.log
timeout 60 ncu --import $D/prod.ncu-rep --page details --csv > $D/details.csv 2>&1; echo "details rc $?"
timeout 60 ncu --import $D/prod.ncu-rep --page source --csv --print-source sass > $D/source_sass.csv 2>&1; echo "source rc $?"
wc -l $D/*.csv; head -c 600 $D/source_sass.csv
date -u >> $D/env.txt
tar -czf $FINAL/ncu.tar.gz -C $D .
