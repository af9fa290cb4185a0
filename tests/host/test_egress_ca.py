"""The installation's egress CA is one for every group and run (orchestrator/sandbox/egress_ca.py,
issue 44): made for all the brokered hosts of ``ORCHESTRATOR_EGRESS_CREDENTIALS``, not a group's
few, so groups with different credentials share it, and made anew only when the installation's
hosts change (or by ``orchestrator egress rotate-ca``); its key and certificate are replaced as
one, so workers making and reading it at once (real processes) never pair a key with another
CA's certificate."""

from __future__ import annotations

import json
import multiprocessing
import re
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from typer.testing import CliRunner

from orchestrator.cli.main import app
from orchestrator.core.settings import Settings
from orchestrator.sandbox.egress import egress_proxy
from orchestrator.sandbox.egress_ca import CA_CERT, CA_DIR, CA_KEY, InstallationCA, ensure_ca
from orchestrator.sandbox.egress_policy import parse_network_option

CREDENTIALS = [
    {"name": "github", "hosts": ["api.github.com", "github.com"], "value": "Bearer one"},
    {"name": "gitlab", "hosts": ["gitlab.example.test"], "value": "Bearer two"},
    {"name": "npm", "hosts": ["registry.npmjs.org"], "value": "Bearer three"},
]
ALL_HOSTS = {"api.github.com", "github.com", "gitlab.example.test", "registry.npmjs.org"}


def fingerprint(ca: InstallationCA | None) -> str:
    assert ca is not None
    return ca.cert.fingerprint(hashes.SHA256()).hex()


def group_ca(settings: Settings, tmp_path: Path, network: str) -> InstallationCA | None:
    return egress_proxy(settings, tmp_path / "egress.sock", parse_network_option(network)).ca


def test_groups_with_different_credentials_share_the_installations_ca(settings: Settings, tmp_path: Path) -> None:
    s = settings.replace(egress_credentials=json.dumps(CREDENTIALS))
    groups = (
        "allowlist:credential:github",
        "allowlist:credential:gitlab",
        "allowlist:credential:npm,credential:github",
    )
    cas = [group_ca(s, tmp_path, network) for network in groups * 2]  # two rounds of runs
    assert len({fingerprint(ca) for ca in cas}) == 1
    first = cas[0]
    assert first is not None and first.permitted() == ALL_HOSTS
    assert group_ca(s, tmp_path, "allowlist:example.org") is None  # no credential: no interception


def test_the_ca_is_made_anew_when_the_installations_hosts_change(settings: Settings, tmp_path: Path) -> None:
    s = settings.replace(egress_credentials=json.dumps(CREDENTIALS))
    before = group_ca(s, tmp_path, "allowlist:credential:github")
    # A host added to a credential this group does not get: the installation's set changed.
    added = [*CREDENTIALS[:2], {**CREDENTIALS[2], "hosts": ["registry.npmjs.org", "npm.example.test"]}]
    after = group_ca(s.replace(egress_credentials=json.dumps(added)), tmp_path, "allowlist:credential:github")
    assert fingerprint(after) != fingerprint(before)
    assert after is not None and after.permitted() == ALL_HOSTS | {"npm.example.test"}
    # A credential removed: the CA no longer vouches for its hosts.
    fewer = group_ca(s.replace(egress_credentials=json.dumps(CREDENTIALS[:1])), tmp_path, "allowlist:credential:github")
    assert fingerprint(fewer) != fingerprint(after)
    assert fewer is not None and fewer.permitted() == {"api.github.com", "github.com"}


def test_egress_rotate_ca_makes_a_new_ca_the_groups_then_use(settings: Settings, tmp_path: Path) -> None:
    env = {
        "ORCHESTRATOR_DATA_DIR": str(settings.data_dir),
        "ORCHESTRATOR_EGRESS_CREDENTIALS": json.dumps(CREDENTIALS),
    }

    def shown(command: str) -> str:
        result = CliRunner().invoke(app, ["egress", command], env=env)
        assert result.exit_code == 0, result.output
        found = re.search(r"sha256:\s+(\S+)", result.stdout)
        assert found is not None, result.stdout
        return found.group(1).replace(":", "")

    s = settings.replace(egress_credentials=json.dumps(CREDENTIALS))
    made = shown("ca")
    assert fingerprint(group_ca(s, tmp_path, "allowlist:credential:gitlab")) == made == shown("ca")
    rotated = shown("rotate-ca")
    assert rotated != made
    assert fingerprint(group_ca(s, tmp_path, "allowlist:credential:npm")) == rotated == shown("ca")
    # One credential fewer: the CA `egress ca` shows is made for the installation's hosts only.
    fewer = json.dumps(CREDENTIALS[1:])
    env["ORCHESTRATOR_EGRESS_CREDENTIALS"] = fewer
    assert shown("ca") != rotated
    assert fingerprint(group_ca(s.replace(egress_credentials=fewer), tmp_path, "allowlist:credential:npm")) == shown(
        "ca"
    )


def _matches(ca: InstallationCA) -> bool:
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    return ca.cert.public_key().public_bytes(serialization.Encoding.PEM, spki) == ca.key.public_key().public_bytes(
        serialization.Encoding.PEM, spki
    )


def _worker(data_dir: str, index: int, rounds: int, out: multiprocessing.Queue[str]) -> None:
    """One worker process: a CA made anew every other round (rotate-ca, a new credential), read
    in the others; each must be whole."""
    problems = 0
    for n in range(rounds):
        try:
            ca = ensure_ca(Path(data_dir), ["api.github.com"], label=f"w{index}", rotate=(n + index) % 2 == 0)
            problems += 0 if _matches(ca) else 1
        except Exception as exc:  # noqa: BLE001 - told to the test
            out.put(f"worker {index}: {type(exc).__name__}: {exc}")
            return
    out.put(f"worker {index}: {problems} mismatched" if problems else "ok")


def test_workers_making_the_ca_at_once_never_pair_a_key_with_another_certificate(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    out: multiprocessing.Queue[str] = context.Queue()
    workers = [context.Process(target=_worker, args=(str(tmp_path), i, 25, out)) for i in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert all(w.exitcode == 0 for w in workers), [w.exitcode for w in workers]
    assert sorted(out.get(timeout=5) for _ in workers) == ["ok"] * 4
    # What the workers left: the key on disk is the certificate's, and the copy for people is it.
    folder = tmp_path / CA_DIR
    key = serialization.load_pem_private_key((folder / CA_KEY).read_bytes(), password=None)
    cert = x509.load_pem_x509_certificate((folder / CA_CERT).read_bytes())
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    assert cert.public_key().public_bytes(serialization.Encoding.PEM, spki) == key.public_key().public_bytes(
        serialization.Encoding.PEM, spki
    )
    assert ensure_ca(tmp_path, ["api.github.com"]).cert == cert
    assert [p.name for p in folder.iterdir() if p.name.endswith(".tmp")] == []  # no half-written file left
