"""CLI command about the agent image: ``image build`` (``orchestrator/sandbox/image.py``)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from orchestrator.cli.support import fail as _fail
from orchestrator.cli.support import setup as _setup
from orchestrator.core.errors import OrchestratorError


def register(image_app: typer.Typer) -> None:
    image_app.command("build")(image_build)


def image_build(
    force: Annotated[bool, typer.Option(help="Rebuild even if current.")] = False,
    variant: Annotated[
        Optional[str],
        typer.Option(
            help="Also build this variant on top (claude-code); default: the one ORCHESTRATOR_MODEL needs, if any.",
        ),
    ] = None,
) -> None:
    """Build the agent image (and the local base image if missing), offline."""
    from orchestrator.sandbox.containers import docker_client
    from orchestrator.sandbox.image import ensure_agent_image, image_name, settings_variant

    settings = _setup().settings
    chosen = variant or settings_variant(settings)
    try:
        name = image_name(settings, chosen)
        image_id = ensure_agent_image(docker_client(settings), settings, force=force, variant=chosen)
    except OrchestratorError as exc:
        raise _fail(exc) from exc
    typer.echo(f"{name} {image_id}")
