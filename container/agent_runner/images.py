"""Images a person sent, made into what a model that sees images takes: image blocks.

The host places a message's files in the workspace and names the images' paths in the
input (``SdkMessage.images``); the runner reads each here, inside the sandbox, so no
image is ever decoded on the host.  The decoding is still bounded, because an image can be
a bomb (a few kilobytes that decode to gigapixels):

* at most :data:`MAX_SOURCE_BYTES` are read (the host's per-file limit);
* only the raster formats the host previews are opened (PNG, JPEG, GIF, WebP: Pillow's
  other decoders are never tried), and the size in the header is checked against
  :data:`MAX_PIXELS` before a pixel is decoded;
* a JPEG is decoded at a reduced scale where it can be (``draft``), and every image is
  scaled to at most :data:`MAX_EDGE` pixels on its long side (what the providers
  recommend: a larger one costs tokens and is scaled down by them anyway), an animated
  one to its first frame;
* the encoded result is at most :data:`MAX_ENCODED_BYTES` (the providers' per-image
  limit, with room for base64), else it is shown smaller.

Whatever cannot be shown becomes a line of text saying which image and why, in its place:
the run goes on.  The container's memory limit bounds whatever is left.
"""

from __future__ import annotations

import base64
import io
import os
import stat
import warnings
from pathlib import Path

from .protocol import ImageRef
from .providers.base import ImageBlock, TextBlock
from .tools.base import ToolOutcome
from .tools.paths import file_in_workspace

MAX_SOURCE_BYTES = 25 * 1024 * 1024
MAX_PIXELS = 50_000_000
MAX_EDGE = 1568
MAX_ENCODED_BYTES = 3_500_000
_FORMATS = ("PNG", "JPEG", "GIF", "WEBP")


class _NotShown(Exception):
    """Why one image is left out (its text stands in its place)."""


def image_block(workspace: Path, ref: ImageRef) -> ImageBlock | TextBlock:
    """The image ``ref`` names as a block for the model, or a text saying why not."""
    where = ref.path if isinstance(ref.path, str) else f"file {ref.file_id}"
    try:
        if not isinstance(ref.path, str):
            raise _NotShown("it could not be placed in the workspace")
        return _encoded(_read(workspace, ref.path))
    except _NotShown as exc:
        return TextBlock(f"[image {where} is not shown: {exc}]")


def _read(workspace: Path, relative: str) -> bytes:
    found = file_in_workspace(workspace, relative, "image")
    if isinstance(found, ToolOutcome):
        raise _NotShown(found.output)
    rel, info = found
    if not stat.S_ISREG(info.st_mode):
        raise _NotShown("it is not a regular file")
    try:
        fd = os.open(workspace / rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise _NotShown(exc.strerror or str(exc)) from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise _NotShown("it is not a regular file")
        data = fh.read(MAX_SOURCE_BYTES + 1)
    if len(data) > MAX_SOURCE_BYTES:
        raise _NotShown(f"it is larger than {MAX_SOURCE_BYTES} bytes")
    return data


def _encoded(data: bytes) -> ImageBlock:
    from PIL import Image, UnidentifiedImageError

    # Pillow's own bomb check, at our bound (it raises past twice its limit, warns past it).
    Image.MAX_IMAGE_PIXELS = MAX_PIXELS
    try:
        with warnings.catch_warnings():
            # Between the bound and twice it Pillow only warns: the check below refuses those.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            opened = Image.open(io.BytesIO(data), formats=_FORMATS)
        with opened:
            width, height = opened.size
            if width * height > MAX_PIXELS:
                raise _NotShown(f"it is {width}x{height} pixels, more than the {MAX_PIXELS} ever decoded")
            if opened.format == "JPEG":
                opened.draft("RGB", (MAX_EDGE, MAX_EDGE))  # decode at a reduced scale: less memory
            opened.seek(0)  # an animation: its first frame
            image = opened.convert("RGBA" if _has_alpha(opened) else "RGB")
    except Image.DecompressionBombError:
        # Pillow's check, on the header too, past twice the bound.
        raise _NotShown(f"it has more than {MAX_PIXELS} pixels, more than are ever decoded") from None
    except (UnidentifiedImageError, OSError, ValueError, EOFError) as exc:
        raise _NotShown(f"it cannot be decoded ({type(exc).__name__})") from None
    image.thumbnail((MAX_EDGE, MAX_EDGE))
    edge = MAX_EDGE
    while True:
        out = io.BytesIO()
        if image.mode == "RGBA":
            image.save(out, "PNG", optimize=True)
            media_type = "image/png"
        else:
            image.save(out, "JPEG", quality=85)
            media_type = "image/jpeg"
        if out.tell() <= MAX_ENCODED_BYTES or edge <= 64:
            break
        edge //= 2
        image.thumbnail((edge, edge))
    if out.tell() > MAX_ENCODED_BYTES:
        raise _NotShown("it stays too large even scaled down")
    return ImageBlock(
        media_type=media_type,
        data=base64.b64encode(out.getvalue()).decode("ascii"),
        width=image.width,
        height=image.height,
    )


def _has_alpha(image: object) -> bool:
    mode = getattr(image, "mode", "")
    info = getattr(image, "info", {})
    return mode in ("RGBA", "LA", "PA") or (mode == "P" and "transparency" in info)
