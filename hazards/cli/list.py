"""`hazards list`: the catalog (families, variants, run-time parameters)."""
from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from hazards.cli.app import app
from hazards.cli.options import JsonOption, VerboseOption, literal
from hazards.family import Family


def family_json(f: Family) -> dict[str, Any]:
    """One family as JSON: what it is, where its kernel lives, its variants and parameters."""
    variants = []
    for v in f.variants:
        verdict = f.static_model({"variant": v.name, **v.params})
        variants.append({"name": v.name, "role": v.role, "canary": v.is_canary,
                         "description": v.description, "why": v.why, "params": dict(v.params),
                         "detected_by": list(v.detected_by),
                         "static": {"hazardous": verdict.hazardous, "reason": verdict.reason}})
    return {"name": f.name, "summary": f.summary, "binary": f.binary,
            "source": str(f.source_path) if f.binary or f.source_dir else None,
            "platforms": list(f.platforms), "default_launches": f.default_launches,
            "timeout_s": f.timeout_s, "runtime_params": dict(f.runtime_params),
            "variants": variants}


@app.command("list")
def list_command(
    json_out: JsonOption = False,
    verbose: VerboseOption = False,
) -> None:
    """The hazard catalog: families and their variants (canaries marked).

    With `-v` each family's run-time parameters are listed too (`--json` always has them).
    """
    from hazards.families import all_families

    fams = all_families()
    if json_out:
        print(json.dumps({"families": [family_json(f) for f in fams]}, indent=None))
        return
    out = Console(width=None if sys.stdout.isatty() else 160)
    for f in fams:
        kind = f"binary {f.binary}" if f.binary else "static checks"
        out.print(f"[bold]{literal(f.name)}[/] " + literal(f"({kind}; {', '.join(f.platforms)}): {f.summary}"),
                  highlight=False)
        table = Table(show_header=True, box=None, pad_edge=False)
        for col in ("variant", "role", "detected by", "description"):
            table.add_column(col)
        for v in f.variants:
            role = f"[red]{literal(v.role)}[/]" if v.is_canary else literal(v.role)
            table.add_row(literal(v.name), role, literal(", ".join(v.detected_by) or "-"), literal(v.description))
        out.print(table)
        if verbose and f.runtime_params:
            for name, doc in f.runtime_params.items():
                out.print(f"    {name}: {doc}", highlight=False, markup=False)
        out.print()
