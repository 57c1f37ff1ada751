#!/usr/bin/env bash
# Installs everything gpu-hazards' development needs: system packages (clang-19 for the
# AMDGCN static checks of gfx942; clang-22, lld-22 and llvm-22 for gfx950, which clang-19
# rejects - Debian 12 carries clang-22 in bookworm-security, `apt-cache policy clang-22`;
# ROCm's HIP headers and device libraries - Debian's libamdhip64-dev, HIP 5.2, and
# rocm-device-libs - so user sources compile with real headers and the HIP
# build of every family is checked; chromium for the report's headless check; gdb for the
# native host stacks of hang forensics), then the
# package, editable, with its dev extra. Called by the README's install command and by
# .ci/run. Safe to run twice. A torch already installed (say a CUDA build) is never touched.
# HZ_SETUP_PYTHON picks the interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${HZ_SETUP_PYTHON:-python3}

sudo_() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else "$@"; fi; }

if command -v apt-get >/dev/null 2>&1; then
  need=()
  command -v clang-19 >/dev/null 2>&1 || need+=(clang-19 llvm-19)
  command -v clang-22 >/dev/null 2>&1 || need+=(clang-22 lld-22 llvm-22)
  [ -f /usr/include/hip/hip_runtime.h ] || need+=(libamdhip64-dev)
  [ -d /usr/lib/x86_64-linux-gnu/amdgcn/bitcode ] || need+=(rocm-device-libs)
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
  command -v gdb >/dev/null 2>&1 || need+=(gdb)  # hang forensics: native host stacks (tests/forensics)
  if [ ${#need[@]} -gt 0 ]; then
    echo "setup: installing system packages: ${need[*]}"
    if ! { sudo_ apt-get update -qq && DEBIAN_FRONTEND=noninteractive sudo_ apt-get install -y -qq --no-install-recommends "${need[@]}"; } >/tmp/hazards-apt.log 2>&1; then
      echo "setup: WARNING: could not install ${need[*]} (see /tmp/hazards-apt.log); tests that need them will skip with a reason" >&2
    fi
  fi
else
  echo "setup: WARNING: no apt-get; install clang-19, clang-22, ROCm's HIP headers and device libraries, and chromium yourself for the AMDGCN checks and report tests" >&2
fi

# torch: the dev extra asks for a lower bound only. An installed torch is pinned for this
# install (a constraint on its own version), so pip keeps it, or says it is too old, and
# never plans to replace it. With none importable, install 2.13.0 first: this project's
# machines keep its CPU build on disk, so pip takes that instead of a CUDA download.
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
if torch_version=$("$PYTHON" -c "import torch; print(torch.__version__)" 2>/dev/null); then
  echo "setup: torch $torch_version is installed: kept as it is"
  echo "torch==$torch_version" > "$constraints"
else
  echo "setup: no torch importable: installing torch==2.13.0 (the CPU build)"
  "$PYTHON" -m pip install -q torch==2.13.0
fi

# The editable build uses the setuptools already here when it is new enough (no download,
# so a machine with every dependency installed needs no network).
build=()
if "$PYTHON" -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 68)" >/dev/null 2>&1; then
  build=(--no-build-isolation)
fi
"$PYTHON" -m pip install -q "${build[@]}" -c "$constraints" -e ".[dev]"
echo "setup: done"
