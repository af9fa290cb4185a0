"""``orchestrator egress``: the installation's egress CA (``orchestrator/sandbox/egress_ca.py``)
shown and rotated."""

from __future__ import annotations

import typer

from orchestrator.cli.support import echo, fail, setup
from orchestrator.core.errors import OrchestratorError

egress_app = typer.Typer(rich_markup_mode=None, help="The sandboxes' egress proxy.", no_args_is_help=True)


def _show(rotate: bool) -> None:
    from cryptography.hazmat.primitives import hashes

    from orchestrator.sandbox.egress_ca import CA_CERT, CA_DIR, ensure_ca
    from orchestrator.sandbox.egress_credentials import parse_credentials

    settings = setup().settings
    try:
        hosts = sorted({h for c in parse_credentials(settings.egress.credentials) for h in c.hosts})
        ca = ensure_ca(settings.data_dir, hosts, label=settings.install_id, rotate=rotate)
    except OrchestratorError as exc:
        raise fail(exc) from exc
    echo(f"{'rotated: ' if rotate else ''}{settings.data_dir / CA_DIR / CA_CERT}")
    echo(f"  sha256:  {ca.cert.fingerprint(hashes.SHA256()).hex(':')}")
    echo(f"  expires: {ca.cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
    echo(f"  for:     {', '.join(hosts) or 'no brokered host (ORCHESTRATOR_EGRESS_CREDENTIALS is empty)'}")


@egress_app.command("ca")
def show_ca() -> None:
    """The egress CA's certificate (made when missing or not covering the brokered hosts)."""
    _show(rotate=False)


@egress_app.command("rotate-ca")
def rotate_ca() -> None:
    """Make a new egress CA now: runs that start from now on trust the new one only."""
    _show(rotate=True)


def register(app: typer.Typer) -> None:
    app.add_typer(egress_app, name="egress")
