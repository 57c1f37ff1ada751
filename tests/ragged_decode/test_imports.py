"""Importing the package (and its torch-free modules) must not import torch."""
from __future__ import annotations

import subprocess
from pathlib import Path
import sys



def test_package_and_build_modules_do_not_import_torch():
    code = ("import sys, hazards, hazards.ragged_decode, hazards.ragged_decode.build, hazards.ragged_decode.schedule; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
