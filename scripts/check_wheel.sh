#!/usr/bin/env bash
# The wheel works outside the checkout: build it from the tracked sources, install it with
# --no-deps into a fresh venv that sees the system's site-packages (the machine's own
# dependencies, e.g. a CUDA torch, are used as they are), and from a folder outside the
# checkout run `hazards --version`, `hazards list`, `hazards check --static` and one
# `hazards run`. Every module of the checkout must then load from the venv's copy: an
# editable install of the checkout on the system would otherwise hide a module the wheel
# forgot (its import finder serves what the wheel lacks).
#
# Usage: bash scripts/check_wheel.sh [WHEEL]   (no WHEEL: build one). Called by .ci/run;
# tests/test_wheel.py runs it on the wheel it builds. Exits non-zero on the first failure.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/hazards-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
unset PYTHONPATH  # the checkout must not be importable: only the wheel is

step() { echo "check_wheel: $*"; }

wheel=${1:-}
if [ -z "$wheel" ]; then
  mkdir "$work/src" "$work/dist"
  # Tracked files, copied out: building writes build/ and *.egg-info into its source.
  (cd "$repo" && git ls-files -z -- pyproject.toml README.md hazards stress standalone |
     xargs -0 cp --parents -t "$work/src")
  step "building the wheel"
  python3 -m pip wheel -q --no-deps --no-build-isolation --no-index -w "$work/dist" "$work/src"
  wheel=$(ls "$work"/dist/gpu_hazards-*.whl)
fi
wheel=$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")

step "installing $(basename "$wheel") --no-deps into a venv with the system's site-packages"
python3 -m venv --system-site-packages --without-pip "$work/venv"
site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# A venv made from inside another venv sees the *base* interpreter's packages, not the active
# venv's: list the active interpreter's site folders in a .pth so that what the contributor's
# venv installed (typer, rich, ...) is what the wheel runs against. Its .pth files are not
# processed, so an editable install of this checkout there cannot serve a module the wheel lacks.
python3 -c 'import site, sys; print("\n".join(p for p in [*site.getsitepackages(), site.getusersitepackages()] if p not in sys.argv[1:]))' \
  "$site" > "$site/zz-active-interpreter.pth"
"$work/venv/bin/python" -m pip install -q --no-deps --no-index "$wheel"
hazards="$work/venv/bin/hazards"

step "the wheel runs against the active interpreter's dependencies"
# The core dependencies' import names (pyproject.toml's dependencies): each must resolve to the
# same file in the wheel's venv as in the interpreter that runs this script (a venv included).
origins='import importlib.util as u
for name in ("hypothesis", "psutil", "scipy", "typer", "rich", "pynvml", "filelock"):
    spec = u.find_spec(name)
    print(name, spec.origin if spec else "MISSING")'
python3 -c "$origins" > "$work/active-deps.txt"
"$work/venv/bin/python" -c "$origins" > "$work/wheel-deps.txt"
if ! diff -u "$work/active-deps.txt" "$work/wheel-deps.txt"; then
  echo "check_wheel: the wheel's venv does not see the active interpreter's dependencies" >&2
  exit 1
fi

mkdir "$work/outside"
cd "$work/outside"

step "hazards --version"
version=$("$hazards" --version)
echo "$version"
[ "$version" = "hazards $(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/pyproject.toml")" ] ||
  { echo "check_wheel: --version says '$version', pyproject.toml another version" >&2; exit 1; }

step "hazards list"
"$hazards" list

step "hazards check --static"
"$hazards" check --static
if [ -n "$(ls -A)" ]; then
  echo "check_wheel: list/check wrote into the current folder: $(ls -A)" >&2
  exit 1
fi

step "hazards run"
"$hazards" run -n 3 --timeout 60 -- python3 -c "print('clean run')"
[ -f .hazards/results.db ] || { echo "check_wheel: hazards run stored nothing in .hazards/results.db" >&2; exit 1; }

step "every module of the checkout loads from the installed wheel"
(cd "$repo" && git ls-files -- 'hazards/*.py' 'stress/*.py') |
  "$work/venv/bin/python" -c '
import importlib.util, sys
site = sys.argv[1]
bad = []
for path in sys.stdin.read().split():
    parts = path[:-3].split("/")
    parts = ["hazards", "engine", *parts[1:]] if parts[0] == "stress" else parts
    if parts[-1] == "__init__":
        parts.pop()
    name = ".".join(parts)
    try:
        spec = importlib.util.find_spec(name)
    except Exception as e:  # a parent package that fails to import
        bad.append(f"{name}: {e!r}")
        continue
    if spec is None or not (spec.origin or "").startswith(site):
        bad.append(f"{name}: {spec.origin if spec else None}")
if bad:
    sys.exit("check_wheel: not from the installed wheel:\n  " + "\n  ".join(bad))
' "$site"
step "passed"
