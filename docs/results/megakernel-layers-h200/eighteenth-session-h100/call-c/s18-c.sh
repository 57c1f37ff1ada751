#!/usr/bin/env bash
# eighteenth session, call C (the machine calls A and B left warm, the device time left): step 22's sub-spans (its layer
# head measured on production itself), then a second bench with torch (the headline's second reading).
cd "$(dirname "$0")/.."; PLAN=c source ci/gpu/plan-preamble.sh; cp .hazards/s18-c.sh "$PLAN_DIR/"
timeout 90 python3 bench/megakernel_layers_profile.py --candidate production --launches 5 --subspans --out $PLAN_DIR/subspans > $PLAN_DIR/subspans.txt 2>&1
echo "subspans rc $? ($(left) s left)"; grep -E "^== |layer head|head" $PLAN_DIR/subspans.txt | head -12 | cut -c1-220
[ $(left) -ge 70 ] && timeout $(( $(left) - 10 )) python3 bench/megakernel_layers_perf.py --compile-mode default+graph --compile-timeout 60 --rounds 9 \
  --json $PLAN_DIR/perf2.json > $PLAN_DIR/perf2.txt 2>&1; echo "bench rc $? ($(left) s left)"; grep -E "floor|megakernel|torch.compile|headline" $PLAN_DIR/perf2.txt | cut -c1-200
