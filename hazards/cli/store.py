"""`hazards store check` and `hazards store migrate`: a results store's schema, checked and updated.

Where a store stands, and taking it to this hazards' schema (docs/campaigns.md, "The results
store")."""
from __future__ import annotations

import json

import typer

from hazards.cli.app import app
from hazards.cli.options import JsonOption, StoreOption
from hazards.engine.errors import EXIT_HAZARD, EXIT_OK, EXIT_STORE

store_app = typer.Typer(name="store", no_args_is_help=True, rich_markup_mode="markdown",
                        help="The results store: check where it stands, migrate it to this hazards' schema.")
app.add_typer(store_app, name="store")

_CHECK_HELP = """Say where a results store stands, without changing it: its schema version and
the one this hazards uses, the migrations it lacks, SQLite's integrity check, and spill files
of runs waiting to be imported.

Exit status: 0 current and sound; 1 it needs `hazards store migrate`; 2 not a results store,
or newer than this hazards knows; 4 damaged.

Example:\n
  hazards store check --store nightly.db
"""

_MIGRATE_HELP = """Take a results store to the schema version this hazards uses: a copy of the
file is kept beside it first (`STORE.vN-backup-TIME`), then every missing migration runs in
one transaction (all or none). Forward only: a store newer than this hazards is refused.

Commands that write (run, soak, check, ...) migrate an older store the same way on their own;
those that only read (stats, report, compare) ask for this command instead.

Example:\n
  hazards store migrate --store nightly.db
"""


@store_app.command("check", help=_CHECK_HELP)
def check_command(store_path: StoreOption = None, json_out: JsonOption = False) -> None:
    from hazards.engine.store import SCHEMA_VERSION, inspect_store

    state = inspect_store(store_path)
    code = EXIT_STORE if not state.sound else EXIT_HAZARD if state.pending else EXIT_OK
    if json_out:
        typer.echo(json.dumps({"store": str(state.path), "schema_version": state.version,
                               "current_version": SCHEMA_VERSION,
                               "pending": [{"to": m.to, "what": m.what} for m in state.pending],
                               "integrity": state.integrity, "spill_files": [str(p) for p in state.spills]}))
        raise typer.Exit(code)
    typer.echo(f"results store {state.path}: schema version {state.version} (this hazards: {SCHEMA_VERSION})")
    if state.pending:
        typer.echo(f"  needs {len(state.pending)} migration(s): run `hazards store migrate --store {state.path}` "
                   "(it backs the file up first)")
        for m in state.pending:
            typer.echo(f"    to version {m.to}: {m.what}")
    typer.echo(f"  integrity: {state.integrity}")
    for spill in state.spills:
        typer.echo(f"  runs waiting in {spill}: any writable open of the store imports them")
    raise typer.Exit(code)


@store_app.command("migrate", help=_MIGRATE_HELP)
def migrate_command(store_path: StoreOption = None) -> None:
    from hazards.engine.store import Store, inspect_store

    state = inspect_store(store_path)
    if not state.pending:
        typer.echo(f"results store {state.path} is at schema version {state.version}: nothing to migrate")
        return
    with Store(state.path, create=False, say_migrated=False) as store:
        done = store.migrated
    typer.echo(done.describe(state.path) if done else
               f"results store {state.path} was migrated meanwhile by another process: nothing to do")
