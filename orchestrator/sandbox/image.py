"""Build the agent image locally, with no registry.

1. The base image (``settings.sandbox.base_image``) is used if present.  If it is
   missing and is our local default, ``container/build-base.sh`` makes it
   (debootstrap + ``docker import``); any other name is pulled.
2. A wheelhouse of the runner's dependencies is downloaded on the host for
   the base image's Python version and CPU, once, into the data dir.
3. ``docker build`` runs with ``--network none``, installing only from that
   wheelhouse.  The build is keyed by a hash of its inputs (a label on the
   image), so a changed runner rebuilds and an unchanged one is reused.

A variant is the agent image plus a provider's heavy dependencies, built on
top of it the same way, and only when that provider is chosen (the
``image_variant`` of its row in ``sandbox/providers.py``): ``claude-code``
(``container/Dockerfile.claude-code``, the Claude Agent SDK with its bundled
CLI, about 400 MB) is tagged ``<agent image repository>:claude-code``.
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
from orchestrator.sandbox.providers import facts_of, split_spec

log = logging.getLogger(__name__)

DEFAULT_BASE = "orchestrator-base:bookworm-net"
HASH_LABEL = "orchestrator.build-hash"
# variant -> (its Dockerfile, its requirements file), both in container/.
VARIANTS: dict[str, tuple[str, str]] = {"claude-code": ("Dockerfile.claude-code", "requirements-claude-code.txt")}


def model_variant(provider: str) -> str | None:
    """The image variant a model provider needs (None: the agent image itself, or no such provider)."""
    facts = facts_of(provider)
    return None if facts is None else facts.image_variant


def settings_variant(settings: Settings) -> str | None:
    """The variant ``ORCHESTRATOR_MODEL`` needs (its provider is the part before ``:``)."""
    return model_variant(split_spec(settings.provider.model)[0])


def image_name(settings: Settings, variant: str | None) -> str:
    """``settings.sandbox.agent_image``, or its variant's tag in the same repository."""
    if variant is None:
        return settings.sandbox.agent_image
    if variant not in VARIANTS:
        raise ImageBuildError(f"no image variant {variant!r}; there are: {', '.join(sorted(VARIANTS))}")
    repo, colon, tag = settings.sandbox.agent_image.rpartition(":")
    repository = repo if colon and "/" not in tag else settings.sandbox.agent_image
    return f"{repository}:{variant}"


def image_present(client: docker.DockerClient, settings: Settings, variant: str | None) -> bool:
    """Whether the engine behind ``client`` has the agent image of ``variant`` (nothing is
    built or pulled: a group's choice of model asks, and building is the operator's)."""
    try:
        client.images.get(image_name(settings, variant))
    except ImageNotFound:
        return False
    return True


def container_dir() -> Path:
    """The ``container/`` folder of the source tree (Dockerfile, runner, scripts)."""
    from agent_runner import protocol  # the host reads only the runner's protocol

    path = Path(protocol.__file__).resolve().parents[2]  # container/agent_runner/protocol/__init__.py
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
    name = settings.sandbox.base_image
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
        base,
        ["python3", "-c", "import sys; print(*sys.version_info[:2])"],
        network_mode="none",
        remove=True,
    )
    major, minor = out.decode().split()
    return int(major), int(minor)


def _wheelhouse(settings: Settings, req: Path, py: tuple[int, int]) -> Path:
    """The wheels of ``req`` (and pip) for the image's Python, downloaded once into the data dir."""
    machine = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}.get(
        platform.machine().lower(), platform.machine()
    )
    key = hashlib.sha256(req.read_bytes() + f"{py}{machine}".encode()).hexdigest()[:12]
    dest = settings.build_dir / f"wheels-{key}"
    if (dest / "requirements.txt").is_file():
        return dest
    tmp = dest.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tag = f"{py[0]}{py[1]}"
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--only-binary=:all:",
        "--python-version",
        tag,
        "--implementation",
        "cp",
        "--abi",
        f"cp{tag}",
        # manylinux_2_17 is manylinux2014's other name; pip matches a wheel's tag by name.
        "--platform",
        f"manylinux_2_28_{machine}",
        "--platform",
        f"manylinux2014_{machine}",
        "--platform",
        f"manylinux_2_17_{machine}",
        "-d",
        str(tmp),
        "-r",
        str(req),
        "pip",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ImageBuildError(f"downloading the runner's wheels failed:\n{proc.stderr[-3000:]}")
    shutil.copy(req, tmp / "requirements.txt")
    tmp.rename(dest)
    return dest


def ensure_agent_image(
    client: docker.DockerClient, settings: Settings, *, force: bool = False, variant: str | None = None
) -> str:
    """Build ``settings.sandbox.agent_image`` unless an image of the same inputs exists;
    with ``variant``, that variant too (on top of it), and return the variant's id."""
    image_id = _ensure_plain_image(client, settings, force=force)
    if variant is None:
        return image_id
    return _ensure_variant(client, settings, variant, image_id, force=force)


def _current(client: docker.DockerClient, name: str, digest: str) -> str | None:
    """The id of image ``name`` when it was built from inputs hashing to ``digest``."""
    try:
        image = client.images.get(name)
    except ImageNotFound:
        return None
    return str(image.id) if (image.labels or {}).get(HASH_LABEL) == digest else None


def _docker_build(
    client: docker.DockerClient,
    ctx: Path,
    tag: str,
    buildargs: dict[str, str],
    digest: str,
    dockerfile: str = "Dockerfile",
) -> str:
    try:
        image, _ = client.images.build(
            path=str(ctx),
            dockerfile=dockerfile,
            tag=tag,
            rm=True,
            forcerm=True,
            network_mode="none",
            buildargs=buildargs,
            labels={HASH_LABEL: digest},
        )
    except (BuildError, DockerException) as exc:
        detail = "".join(str(c.get("stream", "")) for c in getattr(exc, "build_log", []) or [])
        raise ImageBuildError(f"docker build failed: {exc}\n{detail[-3000:]}") from exc
    finally:
        shutil.rmtree(ctx, ignore_errors=True)
    return str(image.id)


def _ensure_variant(client: docker.DockerClient, settings: Settings, variant: str, base_id: str, *, force: bool) -> str:
    tag = image_name(settings, variant)
    dockerfile, requirements = VARIANTS[variant]
    cdir = container_dir()
    h = hashlib.sha256(base_id.encode())
    for name in (dockerfile, requirements):
        h.update(name.encode())
        h.update((cdir / name).read_bytes())
    digest = h.hexdigest()[:16]
    if not force and (current := _current(client, tag, digest)):
        return current
    wheels = _wheelhouse(settings, cdir / requirements, _base_python(client, settings.sandbox.base_image))
    ctx = settings.build_dir / f"context-{variant}"
    shutil.rmtree(ctx, ignore_errors=True)
    ctx.mkdir(parents=True)
    shutil.copy(cdir / dockerfile, ctx / "Dockerfile")
    shutil.copytree(wheels, ctx / "wheels")
    log.info("building the %s image variant %s from %s", variant, tag, settings.sandbox.agent_image)
    return _docker_build(client, ctx, tag, {"AGENT_IMAGE": settings.sandbox.agent_image}, digest)


def _ensure_plain_image(client: docker.DockerClient, settings: Settings, *, force: bool) -> str:
    cdir = container_dir()
    base_id = ensure_base_image(client, settings)
    digest = _build_hash(cdir, base_id)
    if not force and (current := _current(client, settings.sandbox.agent_image, digest)):
        return current
    wheels = _wheelhouse(settings, cdir / "requirements.txt", _base_python(client, settings.sandbox.base_image))
    ctx = settings.build_dir / "context"
    shutil.rmtree(ctx, ignore_errors=True)
    ctx.mkdir(parents=True)
    shutil.copy(cdir / "Dockerfile", ctx / "Dockerfile")
    shutil.copytree(wheels, ctx / "wheels")
    shutil.copytree(cdir / "agent_runner", ctx / "agent_runner", ignore=shutil.ignore_patterns("__pycache__"))
    log.info("building agent image %s from %s", settings.sandbox.agent_image, settings.sandbox.base_image)
    return _docker_build(client, ctx, settings.sandbox.agent_image, {"BASE_IMAGE": settings.sandbox.base_image}, digest)
