"""Executors: where the per-GPU loops of a soak run.

- `local` (the default, `hazards.engine.loop.run_local`): one thread per GPU leased on this host.
- `ray` (`hazards.engine.executors.ray_executor`): one Ray actor per GPU of a Ray cluster
  (`num_gpus=1`, no restarts, no task retries), results streamed to this driver's store.
More in docs/campaigns.md.
"""
from __future__ import annotations

from typing import Any

from ..errors import UserError

EXECUTORS = ("local", "ray")


def check_executor(name: str) -> str:
    """`name` if it is a known executor whose dependencies are installed; UserError otherwise."""
    if name not in EXECUTORS:
        raise UserError(f"unknown executor {name!r} (known: {', '.join(EXECUTORS)})")
    if name == "ray":
        from ..executors.ray_executor import import_ray

        import_ray()
    return name


def run_soak_with(executor: str, store: Any, items: list | None, *, budget_s: float, resume: int | None = None,
                  name: str | None = None, address: str | None = None, max_gpus: int | None = None,
                  **ray_options: Any) -> Any:
    """Run a soak (`hazards.engine.soak.run_soak`) on the per-GPU loops of `executor`.

    Only 'ray' is dispatched here (the local executor needs this host's leases, which the
    `hazards soak` command takes itself). Returns the `SoakResult`.
    """
    check_executor(executor)
    if executor != "ray":
        raise UserError(f"run_soak_with handles remote executors only, not {executor!r}")
    from ..executors.ray_executor import run_soak_ray

    return run_soak_ray(store, items, budget_s=budget_s, resume=resume, name=name, address=address,
                        max_gpus=max_gpus, **ray_options)
