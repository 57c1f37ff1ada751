"""The typer application every command module registers on."""
import typer

app = typer.Typer(
    name="hazards",
    help="Find, reproduce and guard against hardware hazards in GPU kernels.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
