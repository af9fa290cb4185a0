"""The attacks again, with the orchestrator running as an ordinary uid-1000
user in the ``docker`` group (the reproduced git escape needed exactly that:
as root, git refused the agent's repository and hid the hole).

As root (CI), this runs the hostile-sandbox tests in a child pytest as the
machine's uid-1000 account (created if missing), with a virtualenv on
Debian's python3 that reuses this suite's installed packages.  As any other
user the whole suite already runs unprivileged, and this test says so.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import docker_available, require_service

ROOT = Path(__file__).resolve().parents[2]
UID = 1000
# The attacks, and the unit tests of the code they go through.
SUITES = [
    "tests/integration/test_hostile_sandbox.py",
    "tests/integration/test_output_bounds.py::test_a_stderr_flood_keeps_the_host_small",
    "tests/host/test_hostile_fs.py",
    "tests/host/test_context.py",
    "tests/host/test_notices_and_input.py::test_the_host_runs_nothing_in_a_hostile_repository",
]


def _account() -> str:
    try:
        return pwd.getpwuid(UID).pw_name
    except KeyError:
        subprocess.run(["useradd", "--uid", str(UID), "--no-create-home", "orch-unpriv"], check=True)
        return "orch-unpriv"


@pytest.fixture
def work() -> Iterator[Path]:
    # Not under pytest's own temp root: that is root's and 0700.
    path = Path(tempfile.mkdtemp(prefix="orch-unpriv-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_attacks_fail_against_a_non_root_host(work: Path, agent_image: str) -> None:
    if os.getuid() != 0:
        pytest.skip("this suite already runs as an unprivileged user")
    require_service(docker_available(), "a running Docker engine")
    system_python = shutil.which("python3", path="/usr/bin:/bin")
    assert system_python, "Debian's python3 is needed to run the suite as another user"
    user = _account()
    subprocess.run(["usermod", "-aG", "docker", user], check=True)

    venv = work / "venv"
    subprocess.run([system_python, "-m", "venv", "--without-pip", str(venv)], check=True)
    # This suite's packages (pure Python or cp311 wheels, and the editable
    # install of the project), seen through a .pth: no second install.
    site = Path(sysconfig.get_paths()["purelib"])
    [target] = list((venv / "lib").glob("python3*/site-packages"))
    # addsitedir, not a plain path line: the editable install is itself a .pth there.
    (target / "suite-packages.pth").write_text(f"import site; site.addsitedir({str(site)!r})\n")
    home = work / "home"
    home.mkdir()
    shutil.chown(home, UID, UID)
    basetemp = work / "basetemp"  # pytest makes it; its parent must be writable by the user
    shutil.chown(work, UID, UID)

    env = {
        "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        "HOME": str(home),
        "PYTHONDONTWRITEBYTECODE": "1",
        "CI": os.environ.get("CI", ""),
        "ORCHESTRATOR_AGENT_IMAGE": agent_image,
    }
    proc = subprocess.run(
        [
            "runuser",
            "-u",
            user,
            "--",
            str(venv / "bin" / "python"),
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--basetemp={basetemp}",
            "-x",
            *SUITES,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, tail
    summary = proc.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, tail
    passed = int(summary.split(" passed")[0].split()[-1])
    assert passed >= 40, tail
