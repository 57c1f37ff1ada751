#!/usr/bin/env bash
# thirteenth session, call: round 23 (steps (p), (r) and (p)+(r) against production; the gates judge the
# plain build's launch row beside the profiled one), in <= 585 s
cd "$(dirname "$0")/.."
T0=$(date +%s)
echo "tree: main $(cat .hazards/tree.txt)"; nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader; date -u
CANDS=step_p,step_r,step_p_r timeout 590 bash .hazards/s13-round.sh 2>&1 | tail -70
echo "== round 23 took $(( $(date +%s) - T0 )) s"; date -u
