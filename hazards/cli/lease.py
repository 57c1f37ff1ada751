"""`hazards lease -- CMD`: run any command on one exclusively leased GPU (the broker)."""
from __future__ import annotations

import sys
from typing import Optional

import typer

from hazards.cli.app import app
from hazards.cli.options import CommandArgument, parse_duration
from hazards.engine.errors import UserError

_HELP = """Run a command on one GPU that nobody else holds.

Waits for a free GPU (a lease no other process holds; with the default --exclusive, also
no foreign compute process on the card per NVML), sets CUDA_VISIBLE_DEVICES to it, streams
the command's output, and gives the GPU back when the command ends -- or when this broker
dies, even by SIGKILL: the command's whole process tree is then killed with it. SIGINT,
SIGTERM and SIGHUP are forwarded to the command.

Exit status: the command's (128+N if signal N ended it); 2 for bad input or no GPU within --wait.

Examples:\n
  hazards lease -- python3 bench.py --seq 4096\n
  hazards lease --wait 10m --holder nightly -- ./my_kernel_test
"""


@app.command("lease", help=_HELP, context_settings={"allow_interspersed_args": False})
def lease_command(
    command: CommandArgument = None,
    wait: Optional[str] = typer.Option(None, "--wait", help="How long to wait for a GPU leased by someone else.",
                                       show_default="forever"),
    holder: str = typer.Option("hazards lease", "--holder", help="Who holds the lease (shown to waiters, in the lease log)."),
    exclusive: bool = typer.Option(True, "--exclusive/--shared-card",
                                   help="Refuse GPUs that run compute processes of others (NVML)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No broker messages on stderr."),
) -> None:
    from hazards.engine.broker import run_leased

    if not command:
        raise UserError("no command given: put it after `--`, e.g. hazards lease -- ./my_test")
    wait_s = None if wait is None else parse_duration(wait, allow_zero=True)
    note = None if quiet else (lambda s: print(f"hazards lease: {s}", file=sys.stderr, flush=True))
    sys.exit(run_leased(list(command), holder=holder, wait_s=wait_s, exclusive=exclusive, note=note))
