"""Images a person sent, made into image blocks inside the sandbox (agent_runner/images.py):
scaled, bounded before any pixel is decoded, and refused with a line of text for whatever
cannot be shown; then in both wire formats and in the offline model's ``/images``."""

from __future__ import annotations

import base64
import io
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from runner_harness import make_input

from agent_runner.conversation import build_messages
from agent_runner.images import MAX_EDGE, MAX_PIXELS, MAX_SOURCE_BYTES, image_block
from agent_runner.loop import run_agent
from agent_runner.protocol import AssistantEvent, Event, ImageRef, ModelSettings, SdkMessage, decode_input
from agent_runner.providers import anthropic, openai_request
from agent_runner.providers.anthropic import AnthropicProvider
from agent_runner.providers.base import ImageBlock, TextBlock
from agent_runner.providers.offline import OfflineProvider
from fakes import anthropic_api as fake_anthropic
from fakes import openai_api as fake_openai
from fakes.anthropic_api import serve_tcp
from tests.image_bombs import png_claiming

__all__ = ["serve_tcp"]  # a fixture, used by name


def save(path: Path, size: tuple[int, int], mode: str = "RGB", fmt: str = "PNG") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, (200, 30, 30, 128) if mode == "RGBA" else (200, 30, 30)).save(path, fmt)
    return path


def decoded(block: ImageBlock) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(block.data)))


def test_a_large_photo_is_scaled_to_the_long_edge_as_jpeg(tmp_path: Path) -> None:
    save(tmp_path / "inbox" / "photo.png", (3000, 2000))
    block = image_block(tmp_path, ImageRef(file_id="f1", mime="image/png", path="inbox/photo.png"))
    assert isinstance(block, ImageBlock)
    assert (block.media_type, block.width, block.height) == ("image/jpeg", MAX_EDGE, 1045)
    assert decoded(block).size == (MAX_EDGE, 1045)


def test_transparency_is_kept_as_png_and_a_small_image_is_not_enlarged(tmp_path: Path) -> None:
    save(tmp_path / "logo.png", (40, 30), mode="RGBA")
    block = image_block(tmp_path, ImageRef(file_id="f1", mime="image/png", path="logo.png"))
    assert isinstance(block, ImageBlock)
    assert (block.media_type, block.width, block.height) == ("image/png", 40, 30)
    assert decoded(block).mode == "RGBA"


@pytest.mark.parametrize(
    ("size", "said"),
    [
        # Past twice the bound: Pillow's own check refuses it in the header.
        ((100_000, 100_000), f"it has more than {MAX_PIXELS} pixels, more than are ever decoded"),
        # Past the bound, within twice it: ours does, from the same header.
        ((8_000, 7_000), f"it is 8000x7000 pixels, more than the {MAX_PIXELS} ever decoded"),
    ],
)
def test_an_image_bomb_is_refused_from_its_header_before_decoding(
    tmp_path: Path, size: tuple[int, int], said: str
) -> None:
    (tmp_path / "bomb.png").write_bytes(png_claiming(*size))
    assert (tmp_path / "bomb.png").stat().st_size < 200
    started = time.monotonic()
    block = image_block(tmp_path, ImageRef(file_id="f1", mime="image/png", path="bomb.png"))
    assert time.monotonic() - started < 5  # none of its pixels were decoded
    assert isinstance(block, TextBlock)
    assert block.text == f"[image bomb.png is not shown: {said}]"


@pytest.mark.parametrize(
    ("plant", "why"),
    [
        (lambda p: p.write_text("not an image at all"), "cannot be decoded"),
        (lambda p: p.write_text('<svg xmlns="http://www.w3.org/2000/svg"><script>x()</script></svg>'), "cannot be"),
        (lambda p: p.symlink_to("/etc/passwd"), "symbolic link"),
        (lambda p: os.mkfifo(p), "not a regular file"),
        (lambda p: os.truncate(os.open(p, os.O_CREAT | os.O_WRONLY), MAX_SOURCE_BYTES + 1), "larger than"),
    ],
    ids=["text", "svg", "symlink", "fifo", "too-large"],
)
def test_what_cannot_be_shown_becomes_a_line_saying_why(tmp_path: Path, plant, why: str) -> None:  # type: ignore[no-untyped-def]
    plant(tmp_path / "x.png")
    block = image_block(tmp_path, ImageRef(file_id="f1", mime="image/png", path="x.png"))
    assert isinstance(block, TextBlock)
    assert block.text.startswith("[image x.png is not shown: ") and why in block.text


def test_an_image_that_was_not_placed_says_so(tmp_path: Path) -> None:
    block = image_block(tmp_path, ImageRef(file_id="f9", mime="image/png"))
    assert isinstance(block, TextBlock)
    assert block.text == "[image file f9 is not shown: it could not be placed in the workspace]"


def test_a_messages_images_follow_its_text_in_both_wire_formats(tmp_path: Path) -> None:
    save(tmp_path / "inbox" / "a.png", (20, 10))
    history = [
        SdkMessage(
            role="user",
            content="what is this?",
            images=[ImageRef(file_id="f1", mime="image/png", path="inbox/a.png")],
        )
    ]
    (turn,) = build_messages(history, tmp_path)
    assert [type(b) for b in turn.content] == [TextBlock, ImageBlock]
    image = turn.content[1]
    assert isinstance(image, ImageBlock)

    (wire,) = anthropic.messages_to_wire([turn])
    assert wire["content"] == [
        {"type": "text", "text": "what is this?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": image.data}},
    ]
    (chat,) = openai_request.messages_to_wire("", [turn])
    assert chat == {
        "role": "user",
        "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{image.data}"}},
        ],
    }
    # Without images a user turn stays plain text.
    (plain,) = openai_request.messages_to_wire("", build_messages([SdkMessage(role="user", content="hi")], tmp_path))
    assert plain == {"role": "user", "content": "hi"}


def test_the_offline_model_reports_the_images_it_was_shown(tmp_path: Path) -> None:
    save(tmp_path / "inbox" / "a.png", (64, 48))
    (tmp_path / "inbox" / "b.png").write_text("broken")
    refs = [
        ImageRef(file_id="f1", mime="image/png", path="inbox/a.png"),
        ImageRef(file_id="f2", mime="image/png", path="inbox/b.png"),
    ]
    messages = build_messages([SdkMessage(role="user", content="/images", images=refs)], tmp_path)
    answer = OfflineProvider("Andy").complete("", messages, [])
    assert answer.content == [
        TextBlock("image/jpeg 64x48\n[image inbox/b.png is not shown: it cannot be decoded (UnidentifiedImageError)]")
    ]


def test_the_fakes_take_our_image_blocks_and_refuse_malformed_ones(tmp_path: Path) -> None:
    save(tmp_path / "a.png", (20, 10))
    turn = build_messages(
        [SdkMessage(role="user", content="see", images=[ImageRef(file_id="f", mime="image/png", path="a.png")])],
        tmp_path,
    )
    ours = {"messages": anthropic.messages_to_wire(turn)}
    assert fake_anthropic.image_problem(ours) is None
    assert fake_openai.image_problem({"messages": openai_request.messages_to_wire("", turn)}) is None
    bad_type = {"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/svg+xml", "data": "PHN2Zz4="}}]}]}  # fmt: skip
    assert "unsupported image source" in str(fake_anthropic.image_problem(bad_type))
    in_reply = {"messages": [{"role": "assistant", "content": ours["messages"][0]["content"]}]}
    assert "user messages only" in str(fake_anthropic.image_problem(in_reply))
    not_data = {
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file:///etc/x"}}]}]
    }
    assert "data:image" in str(fake_openai.image_problem(not_data))
    not_base64 = {
        "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,%%"}}]}
        ]
    }
    assert "not base64" in str(fake_openai.image_problem(not_base64))


def test_an_anthropic_run_sends_the_image_over_http(serve_tcp: Any, tmp_path: Path) -> None:
    save(tmp_path / "inbox" / "cat.png", (300, 200))
    fake = fake_anthropic.FakeAnthropic(fake_anthropic.message([{"type": "text", "text": "A red square."}], "end_turn"))
    provider = AnthropicProvider(
        ModelSettings(provider="anthropic", model="claude-fake", max_tokens=64, base_url=serve_tcp(fake))
    )
    inp = decode_input(
        json.dumps(
            make_input(
                {
                    "role": "user",
                    "content": "what is it?",
                    "images": [{"file_id": "f1", "mime": "image/png", "path": "inbox/cat.png"}],
                }
            )
        )
    )
    events: list[Event] = []
    run_agent(inp, provider, events.append, workspace=tmp_path)
    assert any(isinstance(e, AssistantEvent) and e.text == "A red square." for e in events)
    (request,) = fake.requests
    text, image = request["messages"][0]["content"]
    assert text == {"type": "text", "text": "what is it?"}
    assert image["source"]["media_type"] == "image/jpeg"
    assert Image.open(io.BytesIO(base64.b64decode(image["source"]["data"]))).size == (300, 200)
