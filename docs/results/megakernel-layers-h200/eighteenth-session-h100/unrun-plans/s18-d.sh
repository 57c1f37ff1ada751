#!/usr/bin/env bash
# eighteenth session, call D (the device time left): what the promotion rule asks of step 22 that no run gave it yet:
# the logit gate on production's build for every family variant (clean ones pass; stale_descriptor, amax_tail,
# dead_flag, stale_release fail), then `hazards check` on the family (clean variants clean, every canary detected).
cd "$(dirname "$0")/.."; PLAN=d source ci/gpu/plan-preamble.sh; cp .hazards/s18-d.sh "$PLAN_DIR/"
CANDIDATE=none OUT=$PLAN_DIR timeout 125 bash ci/gpu/layers-logit-gate.sh > /dev/null 2>&1
echo "logit gate rc $? ($(left) s left)"; grep -E "^\| |PASS|FAIL|exit" $PLAN_DIR/layers-logit-gate/console.log | tail -14 | cut -c1-200
cb=$(( $(left) - 30 )); [ $cb -gt 90 ] && cb=90
[ $cb -ge 40 ] && { timeout $(( cb + 20 )) python3 -m hazards check --families megakernel_layers --skip clang --budget ${cb}s \
  --junit $PLAN_DIR/check-junit.xml > $PLAN_DIR/check.txt 2>&1; echo "check exit $? (budget ${cb}s, $(left) s left)"; tail -25 $PLAN_DIR/check.txt | cut -c1-200; }
