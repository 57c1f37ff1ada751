#!/bin/bash
# hazards bisect on a GPU (H200 or H100): a scratch repository of 10 commits holding standalone/pipeline;
# at commit 6 the kernel's wait depth becomes one cp.async group too many (the RAW hazard of
# the broken_wait variant, now in `fixed`), commit 3 does not compile. `hazards bisect
# --family pipeline --variant fixed` must name commit 6, skip commit 3, and say what it spent.
# About 2 minutes (two nvcc builds of pipeline plus one that fails, ~50 runs of ~0.5 s).
#     OUT=/tmp/out bash ci/gpu/bisect-family.sh
cd "$(dirname "$0")/../.." && . ci/gpu/round.sh bisect-family 170
export HZ_BUILD_DIR=${HZ_BUILD_DIR:-/tmp/hz-build} PYTHONUNBUFFERED=1
machine_step
git --version || { echo "NO GIT: hazards bisect needs git"; finish; }

step "scratch repository"
S=/tmp/bisect-scratch-repo
rm -rf "$S" /tmp/bisect-scratch-work; mkdir -p "$S/standalone"
cp -r standalone/common standalone/include standalone/pipeline "$S/standalone/"
G="git -C $S -c user.name=bisect-example -c user.email=bisect@localhost"
$G init -q -b main
for i in 0 1 2 3 4 5 6 7 8 9; do
  echo "change $i" > "$S/CHANGES"
  F=$S/standalone/pipeline/pipeline.cu
  if [ $i = 3 ]; then echo '#error "commit 3 does not build"' >> "$F"; fi
  if [ $i = 4 ]; then sed -i '/commit 3 does not build/d' "$F"; fi
  if [ $i = 6 ]; then   # the regression: one cp.async group too many in flight at the wait
    sed -i 's/return war_barrier ? stages - 2 : stages - 1;/return war_barrier ? stages - 1 : stages;/' "$F"
    grep -q 'return war_barrier ? stages - 1 : stages;' "$F" || { echo "THE REGRESSION DID NOT APPLY"; finish; }
  fi
  $G add -A && $G commit -q -m "change $i$([ $i = 6 ] && echo ': wait depth off by one')$([ $i = 3 ] && echo ': does not build')"
done
$G log --format='%H %s' --reverse | tee "$R/commits.txt"
EXPECTED=$($G log --format=%H --reverse | sed -n 7p)
GOOD=$($G log --format=%H --reverse | sed -n 1p)
echo "expected culprit: $EXPECTED"

step "hazards bisect --family pipeline --variant fixed"
timeout -k 5 $(( $(left) - 15 )) python3 -m hazards bisect --repo "$S" --good "$GOOD" --bad main \
  --family pipeline --variant fixed --scratch /tmp/bisect-scratch-work --store "$R/results.db" --json \
  > "$R/bisect.json" 2> "$R/bisect.err"
echo "bisect rc=$?"
cat "$R/bisect.err" | cut -c1-300
python3 - "$R/bisect.json" "$EXPECTED" <<'EOF'
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
except ValueError:
    print("NO JSON"); sys.exit(0)
print(f"status {doc['status']}; culprit {doc['culprit']}; expected {sys.argv[2]}; "
      f"RIGHT: {doc['culprit'] == sys.argv[2]}; confidence {doc['confidence']}; runs {doc['runs']}")
for c in doc["commits"]:
    print(f"  {c['commit'][:12]} {c['role']:<8} {c['verdict']:<10} runs {c['runs']:>3} failures {c['failures']:>3}"
          f" {(c['why'] or '')[:120]}")
EOF
step "the scratch repository afterwards (no worktree left registered)"
$G worktree list
$G status --porcelain | head -5
finish
