#!/bin/bash
# soak-hang-md on the H200 ("a soak that meets a hang leaves its hang.md"):
# a short `hazards soak` of the `deadlock` family (its three broken variants are hang canaries)
# with forensics at their defaults, then `hazards check` of the same family on the same store
# (a canary whose hang the soak located gets no forensics there). Lists every hang.md the two
# left in the store's artifact folders and prints the first; the soak's and the check's
# "forensics: ..." lines say what each spent. About 2 minutes (build ~20 s, soak 40 s, check 25 s).
#     OUT=/tmp/out bash ci/gpu/soak-hang-md.sh
cd "$(dirname "$0")/../.." && . ci/gpu/round.sh soak-hang-md 130
export HZ_BUILD_DIR=${HZ_BUILD_DIR:-/tmp/hz-build} PYTHONUNBUFFERED=1
# the store and its artifact folders outside $OUT (too many files): tarred into $R at the end
S=/tmp/soak-hang-md-store
rm -rf "$S"; mkdir -p "$S"
STORE=$S/results.db
machine_step
(which py-spy cuda-gdb gdb; cuda-gdb --version | head -1) 2>&1 | sed 's/^/tools: /'

step "build deadlock"
build_family deadlock 60

step "soak: deadlock, 40 s, forensics defaults"
timeout -k 5 70 python3 -m hazards soak --budget 40s --families deadlock --explore 0 --max-gpus 1 \
  --store "$STORE" --report "$S/soak.html" --progress-interval 10s > "$R/soak.txt" 2>&1
echo "soak rc=$?"
grep -E "hazards: forensics" "$R/soak.txt"
grep -iE "hang\.md|new failure signature|stuck at" "$R/soak.txt" | head -12 | cut -c1-400

step "check: deadlock, 25 s, static part skipped"
timeout -k 5 50 python3 -m hazards check --families deadlock --budget 25s --skip static \
  --store "$STORE" --progress-interval 10s > "$R/check.txt" 2>&1
echo "check rc=$?"
grep -E "hazards: forensics" "$R/check.txt"
grep -E "deadlock/" "$R/check.txt" | head -8 | cut -c1-300

step "hang.md files"
find "$S/artifacts" -name hang.md | sort | tee "$R/hang-md-list.txt"
for f in $(head -50 "$R/hang-md-list.txt"); do echo "$f: $(sed -n 3p "$f" | cut -c1-200) [$(sed -n 6p "$f" | cut -c1-120)]"; done
FIRST=$(head -1 "$R/hang-md-list.txt")
if [ -n "$FIRST" ]; then step "first hang.md: $FIRST"; cat "$FIRST"; else echo "NO hang.md FOUND"; fi
ps -eo pid,stat,comm | grep -E "cuda-gdb|py-spy|deadlock" | grep -v grep | sed 's/^/left running: /'
tar -czf "$R/store.tar.gz" -C /tmp soak-hang-md-store
finish
