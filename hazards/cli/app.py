"""The typer application every command module registers on.

Help texts are markdown: paragraphs are reflowed to the terminal's width (write them as
prose, wrapped anywhere), an indented block is shown as written (examples), and
`[default: …]` comes from each option's `show_default`, never from its help text.
"""
from typing import Optional

import typer

DEFAULTS_HELP = ("Defaults, in order: the flag, its HZ_* environment variable, `[tool.hazards]` in the "
                 "nearest pyproject.toml (docs/cli.md), the built-in default. Shell completion: "
                 "`hazards --install-completion`.")

app = typer.Typer(
    name="hazards",
    help="Find, reproduce and guard against hardware hazards in GPU kernels.",
    epilog=DEFAULTS_HELP,
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)


def _print_version(value: bool) -> None:
    if value:
        from hazards import __version__

        typer.echo(f"hazards {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    ctx: typer.Context,
    version: Optional[bool] = typer.Option(None, "--version", callback=_print_version, is_eager=True,
                                           help="Print the version and exit."),
) -> None:
    """Find, reproduce and guard against hardware hazards in GPU kernels."""
    from hazards.cli.project_defaults import default_map

    # Runs before the subcommand's context is made: its options then fall back to these
    # values after the command line and the environment (click's order).
    ctx.default_map = {**default_map(getattr(ctx.command, "commands", {})), **(ctx.default_map or {})}
