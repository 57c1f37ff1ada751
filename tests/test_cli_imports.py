"""The whole CLI (every command, every family) loads without a GPU library: the supervisor
must never initialise CUDA, so a hang or a sticky CUDA error can never wedge it."""
import subprocess
import sys
from pathlib import Path

GPU_LIBRARIES = ("torch", "cupy", "pycuda", "cuda", "triton", "jax", "tensorflow", "numba")


def test_loading_every_command_and_family_imports_no_gpu_library():
    code = ("import sys; from hazards.cli import load_commands; load_commands(); "
            "from hazards.families import all_families; fams = all_families(); "
            f"print(len(fams), [m for m in {GPU_LIBRARIES!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent)
    n_families, loaded = out.stdout.strip().split(" ", 1)
    assert int(n_families) >= 6
    assert loaded == "[]"


def test_every_command_lives_in_the_module_named_after_it():
    from hazards.cli import load_commands
    from hazards.cli.app import app

    load_commands()
    homes = {c.name: c.callback.__module__ for c in app.registered_commands}
    assert {"check", "soak", "lint", "static", "run", "repro", "stress", "report"} <= set(homes)
    assert {name: home for name, home in homes.items() if home != f"hazards.cli.{name}"} == {}
