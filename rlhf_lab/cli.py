"""The `rlhf-lab` command line: a thin typer adapter over the lab's functions."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="Plan, launch, watch and record small RLHF experiments.",
    no_args_is_help=True,
    add_completion=False,
)


@app.command()
def demo(
    campaign: str = typer.Option("dpo-sanity", help="campaign slug for the demo's run"),
) -> None:
    """Run the offline demo: a short DPO sanity run on the built-in tiny model."""
    from rlhf_lab.demo import run_demo
    from rlhf_lab.paths import LabError

    try:
        run_demo(campaign)
    except LabError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None


@app.command()
def version() -> None:
    """Print the rlhf-lab version."""
    from rlhf_lab import __version__

    typer.echo(__version__)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
