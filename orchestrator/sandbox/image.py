"""Build the agent image locally, with no registry.

1. The base image (``settings.base_image``) is used if present.  If it is
   missing and is our local default, ``container/build-base.sh`` makes it
   (debootstrap + ``docker import``); any other name is pulled.
2. A wheelhouse of the runner's dependencies is downloaded on the host for
   the base image's Python version and CPU, once, into the data dir.
3. ``docker build`` runs with ``--network none``, installing only from that
   wheelhouse.  The build is keyed by a hash of its inputs (a label on the
   image), so a changed runner rebuilds and an unchanged one is reused.
"""

from __future__ import annotations

import hashlib
import logging
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import docker
from docker.errors import BuildError, DockerException, ImageNotFound

from orchestrator.core.errors import ImageBuildError
from orchestrator.core.settings import Settings

log = logging.getLogger(__name__)

DEFAULT_BASE = "orchestrator-base:bookworm-git"
HASH_LABEL = "orchestrator.build-hash"


def container_dir() -> Path:
    """The ``container/`` folder of the source tree (Dockerfile, runner, scripts)."""
    import agent_runner

    path = Path(agent_runner.__file__).resolve().parent.parent
    if not (path / "Dockerfile").is_file():
        raise ImageBuildError(
            f"no Dockerfile next to the agent runner ({path}); build the image from a "
            "source checkout (pip install -e .)"
        )
    return path


def _build_hash(cdir: Path, base_id: str) -> str:
    h = hashlib.sha256(base_id.encode())
    files = [cdir / "Dockerfile", cdir / "requirements.txt", *sorted((cdir / "agent_runner").rglob("*.py"))]
    for f in files:
        h.update(str(f.relative_to(cdir)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def ensure_base_image(client: docker.DockerClient, settings: Settings) -> str:
    """Return the base image's id, making or pulling it if missing."""
    name = settings.base_image
    try:
        return str(client.images.get(name).id)
    except ImageNotFound:
        pass
    if name == DEFAULT_BASE:
        log.info("building the local base image %s (debootstrap; takes a minute or two)", name)
        script = container_dir() / "build-base.sh"
        proc = subprocess.run(["bash", str(script), name], capture_output=True, text=True)
        if proc.returncode != 0:
            raise ImageBuildError(f"building {name} failed:\n{proc.stderr[-3000:]}")
    else:
        log.info("pulling base image %s", name)
        try:
            client.images.pull(name)
        except DockerException as exc:
            raise ImageBuildError(f"cannot pull base image {name}: {exc}") from exc
    return str(client.images.get(name).id)


def _base_python(client: docker.DockerClient, base: str) -> tuple[int, int]:
    out = client.containers.run(
        base, ["python3", "-c", "import sys; print(*sys.version_info[:2])"],
        network_mode="none", remove=True,
    )
    major, minor = out.decode().split()
    return int(major), int(minor)


def _wheelhouse(settings: Settings, cdir: Path, py: tuple[int, int]) -> Path:
    machine = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}.get(
        platform.machine().lower(), platform.machine()
    )
    req = cdir / "requirements.txt"
    key = hashlib.sha256(req.read_bytes() + f"{py}{machine}".encode()).hexdigest()[:12]
    dest = settings.build_dir / f"wheels-{key}"
    if (dest / "requirements.txt").is_file():
        return dest
    tmp = dest.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tag = f"{py[0]}{py[1]}"
    cmd = [
        sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:",
        "--python-version", tag, "--implementation", "cp", "--abi", f"cp{tag}",
        "--platform", f"manylinux_2_28_{machine}", "--platform", f"manylinux2014_{machine}",
        "-d", str(tmp), "-r", str(req), "pip",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ImageBuildError(f"downloading the runner's wheels failed:\n{proc.stderr[-3000:]}")
    shutil.copy(req, tmp / "requirements.txt")
    tmp.rename(dest)
    return dest


def ensure_agent_image(client: docker.DockerClient, settings: Settings, *, force: bool = False) -> str:
    """Build ``settings.agent_image`` unless an image of the same inputs exists."""
    cdir = container_dir()
    base_id = ensure_base_image(client, settings)
    digest = _build_hash(cdir, base_id)
    if not force:
        try:
            image = client.images.get(settings.agent_image)
            if (image.labels or {}).get(HASH_LABEL) == digest:
                return str(image.id)
        except ImageNotFound:
            pass
    wheels = _wheelhouse(settings, cdir, _base_python(client, settings.base_image))
    ctx = settings.build_dir / "context"
    shutil.rmtree(ctx, ignore_errors=True)
    ctx.mkdir(parents=True)
    shutil.copy(cdir / "Dockerfile", ctx / "Dockerfile")
    shutil.copytree(wheels, ctx / "wheels")
    shutil.copytree(cdir / "agent_runner", ctx / "agent_runner", ignore=shutil.ignore_patterns("__pycache__"))
    log.info("building agent image %s from %s", settings.agent_image, settings.base_image)
    try:
        image, _ = client.images.build(
            path=str(ctx), tag=settings.agent_image, rm=True, forcerm=True, network_mode="none",
            buildargs={"BASE_IMAGE": settings.base_image}, labels={HASH_LABEL: digest},
        )
    except (BuildError, DockerException) as exc:
        detail = "".join(str(c.get("stream", "")) for c in getattr(exc, "build_log", []) or [])
        raise ImageBuildError(f"docker build failed: {exc}\n{detail[-3000:]}") from exc
    finally:
        shutil.rmtree(ctx, ignore_errors=True)
    return str(image.id)
