#!/usr/bin/env bash
# The ragged-decode regression on one card: the kernel as the layered campaign found it (f05cafc, the
# issue's filing commit) against this tree, alternated old/new/old/new in one device call.
#     W=/tmp/x bash .hazards/ragged_pair.sh [calls]
set -u
CALLS=${1:-20}
ROOT=$PWD; OLD=/tmp/ragged-old-f05cafc
rm -rf "$OLD"; mkdir -p "$OLD"; tar -xf .hazards/old_f05cafc.tar -C "$OLD"
for i in 1 2; do
  ( cd "$OLD" && PYTHONPATH=$OLD HZ_BUILD_DIR=/tmp/hz-build-old timeout 70 python3 bench/ragged_decode_h200.py --calls "$CALLS" \
      --out-md "$W/ragged_old$i.md" --json "$W/ragged_old$i.json" > "$W/ragged_old$i.txt" 2>&1 ); echo "old $i rc $?"
  ( cd "$ROOT" && PYTHONPATH=$ROOT timeout 70 python3 bench/ragged_decode_h200.py --calls "$CALLS" \
      --out-md "$W/ragged_new$i.md" --json "$W/ragged_new$i.json" > "$W/ragged_new$i.txt" 2>&1 ); echo "new $i rc $?"
done
python3 - "$W" <<'PY'
import json, sys, statistics
from pathlib import Path
w = Path(sys.argv[1]); got = {}
for tag in ("old1", "new1", "old2", "new2"):
    p = w / f"ragged_{tag}.json"
    if not p.exists():
        print(tag, "missing"); continue
    r = json.loads(p.read_text())
    row = next(x for x in r["rows"] if x["name"].startswith("megakernel ("))
    got[tag] = row["us"]
    print(f"{tag}: {row['us']:.1f} us (min {row['us_min']:.1f}), {row['x_floor']:.3f}x floor {r['floor_us']:.1f} us, {r['device']}")
old = [got[t] for t in ("old1", "old2") if t in got]; new = [got[t] for t in ("new1", "new2") if t in got]
if old and new:
    print(f"ragged new/old (mean of medians): {statistics.mean(new) / statistics.mean(old):.4f}; "
          f"pairs: {[round(n / o, 4) for o, n in zip(old, new)]}")
PY
grep -h "megakernel (this kernel" "$W"/ragged_old*.txt "$W"/ragged_new*.txt
