#!/usr/bin/env bash
# Lead's device call 1, eighth session (carried). Whichever card comes gets its best work:
#   H200: issue 23's owed rows on main's tree as it is (d90d7de; code 7ebbfc3, whose GPU suite
#         passed): the false stalls of both megakernels, then the long batches;
#   other (H100): device-plan5.sh's H100 work (the GPU suite on merge8's tree, step_g_on_e's gates).
export HZ_BUILD_DIR=/tmp/hz-build PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $name"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
[[ "$name" == *H200* ]] || exec bash .hazards/device-plan5.sh
pack() { cd "$OUT" && tar -czf /tmp/all.tar.gz . && find . -mindepth 1 -delete && mv /tmp/all.tar.gz "$OUT/all-${1}.tar.gz"; ls -la "$OUT"; }
trap 'pack 1' EXIT
OUT=$OUT bash ci/gpu/falsestall-h200.sh 450 megakernel_layers,ragged_decode 2>&1 | tail -30; echo "== falsestall rc=${PIPESTATUS[0]}"; date -u
OUT=$OUT bash ci/gpu/long-batch-beats.sh 2>&1 | tail -12; echo "== long batches rc=${PIPESTATUS[0]}"; date -u
