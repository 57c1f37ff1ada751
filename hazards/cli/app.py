"""The typer application every command module registers on.

Help texts are markdown: paragraphs are reflowed to the terminal's width (write them as
prose, wrapped anywhere), an indented block is shown as written (examples), and
`[default: …]` comes from each option's `show_default`, never from its help text.
"""
from typing import Optional

import typer

app = typer.Typer(
    name="hazards",
    help="Find, reproduce and guard against hardware hazards in GPU kernels.",
    no_args_is_help=True,
    add_completion=False,
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
    version: Optional[bool] = typer.Option(None, "--version", callback=_print_version, is_eager=True,
                                           help="Print the version and exit."),
) -> None:
    """Find, reproduce and guard against hardware hazards in GPU kernels."""
