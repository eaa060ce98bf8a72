"""The `inftyformer` command line."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="The ∞-former (Infinite Memory Transformer) and its baselines.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def main() -> None:
    """The ∞-former (Infinite Memory Transformer) and its baselines: train, evaluate, generate."""


@app.command()
def demo(
    length: int = typer.Option(65_536, help="Number of time steps of the random walk to stream."),
    segment_len: int = typer.Option(512, help="Vectors added to memory per update (L)."),
    num_basis: int = typer.Option(256, help="Number of basis functions N."),
    dim: int = typer.Option(16, help="Feature size e of the signal."),
    seed: int = typer.Option(0, help="Random seed."),
) -> None:
    """Stream a long random-walk signal into the continuous long-term memory and read it back."""
    from .demo import format_demo, run_demo

    try:
        result = run_demo(
            length=length, segment_len=segment_len, num_basis=num_basis, dim=dim, seed=seed
        )
    except ValueError as err:
        raise typer.BadParameter(str(err)) from err
    typer.echo(format_demo(result))


if __name__ == "__main__":
    app()
