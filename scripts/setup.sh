#!/usr/bin/env bash
# Installs everything gpu-hazards needs: system packages (clang-19 for the AMDGCN static
# checks, chromium for the report's headless check), then the package with its dev extras.
# Called by the README's install command and by .ci/run. Safe to run twice.
set -euo pipefail
cd "$(dirname "$0")/.."

sudo_() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else "$@"; fi; }

if command -v apt-get >/dev/null 2>&1; then
  need=()
  command -v clang-19 >/dev/null 2>&1 || need+=(clang-19 llvm-19)
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
  if [ ${#need[@]} -gt 0 ]; then
    echo "setup: installing system packages: ${need[*]}"
    if ! { sudo_ apt-get update -qq && DEBIAN_FRONTEND=noninteractive sudo_ apt-get install -y -qq --no-install-recommends "${need[@]}"; } >/tmp/hazards-apt.log 2>&1; then
      echo "setup: WARNING: could not install ${need[*]} (see /tmp/hazards-apt.log); tests that need them will skip with a reason" >&2
    fi
  fi
else
  echo "setup: WARNING: no apt-get; install clang-19 and chromium yourself for the AMDGCN checks and report tests" >&2
fi

python3 -m pip install -q -e ".[dev]"
echo "setup: done"
