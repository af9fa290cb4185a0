"""What the model gateway's request policy costs per request: the rules that read the body
(``rules.prepare``: the allowlists, the model and output cap, the sources in messages; in a
revision where the gateway was one module, ``ModelGateway._prepare``) of the tree's gateway
against another revision's, interleaved in one process, on a Claude Code request and on long
sessions built from it.

    .venv/bin/python -m bench.gateway_prepare [--against REV] [--body FILE] [--rounds 15]

``--against`` names the revision whose gateway (the package ``orchestrator/sandbox/gateway/``,
whose modules import each other relatively, or the one module ``gateway.py`` it was) is the
baseline, loaded under another name (default ``HEAD``); ``--body`` a request the Claude Code CLI sent (recorded: the body a
``fakes`` upstream got, ``calls[i].raw``, under ``python -m tests.gateway_wire``), by
default a stand-in of its shape (17 tools, 75 KB; a 20 KB system prompt; three messages).

The long sessions put 300 turns (a Bash call, 8 KB of output) after the first message, ~2.7 MB;
then the same with one screenshot (a 200 KB base64 image in a tool result), with one WebFetch
call (a ``url`` in a tool's input), and with a URL image at the end (refused); last, 300 turns
reading files of code (quotes, braces, escapes, non-ASCII text), sent as the CLI sends them
(UTF-8).  Each figure is the min (and median) of ``--rounds`` rounds, in microseconds per
request, each round timing both gateways in turn; the peak is what the tree's ``_prepare``
allocates at most (tracemalloc, in a run of its own).  Then hostile bodies for the tree's
gateway alone: the outcome, the time and the peak.
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from email.message import Message
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODEL = "claude-sonnet-4-5"


def _show(revision: str, path: str) -> bytes:
    return subprocess.run(["git", "show", f"{revision}:{path}"], cwd=ROOT, check=True, capture_output=True).stdout


def _module(revision: str) -> ModuleType:
    """``revision``'s gateway as the module ``gateway_baseline``: its package, or its one module."""
    folder = Path(tempfile.mkdtemp(prefix="gateway-baseline-"))
    listed = subprocess.run(
        ["git", "ls-tree", "--name-only", f"{revision}:orchestrator/sandbox/gateway/"], cwd=ROOT, capture_output=True
    )
    if listed.returncode == 0:
        package = folder / "gateway_baseline"
        package.mkdir()
        for name in listed.stdout.decode().split():
            if name.endswith(".py"):
                (package / name).write_bytes(_show(revision, f"orchestrator/sandbox/gateway/{name}"))
        path = package / "__init__.py"
        spec = importlib.util.spec_from_file_location(
            "gateway_baseline", path, submodule_search_locations=[str(package)]
        )
    else:
        path = folder / "gateway_baseline.py"
        path.write_bytes(_show(revision, "orchestrator/sandbox/gateway.py"))
        spec = importlib.util.spec_from_file_location("gateway_baseline", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["gateway_baseline"] = module
    spec.loader.exec_module(module)
    return module


def _stand_in() -> dict[str, Any]:
    tool = {
        "name": "Tool",
        "description": "Does a thing. " * 200,
        "input_schema": {
            "type": "object",
            "required": ["file_path"],
            "properties": {"url": {"type": "string"}, "file_path": {"type": "string"}},
        },
    }
    return {
        "model": MODEL,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>context</system-reminder>"},
                    {"type": "text", "text": "please run the command"},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "running it"},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "Bash",
                        "input": {"command": "echo recorded", "description": "Echo"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "tool_use_id": "toolu_1",
                        "type": "tool_result",
                        "content": "recorded",
                        "is_error": False,
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            },
        ],
        "system": [{"type": "text", "text": "You are Claude Code. " * 1000}],
        "tools": [{**tool, "name": f"T{i}"} for i in range(17)],
        "metadata": {"user_id": "u"},
        "max_tokens": 32000,
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "stream": True,
    }


def _bodies(first: bytes) -> dict[str, bytes]:
    request = json.loads(first)
    turns: list[dict[str, Any]] = []
    for i in range(300):
        turns.append(
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": f"t{i}", "name": "Bash", "input": {"command": "ls -la " * 50}}],
            }
        )
        turns.append(
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": "x" * 8000}]}
        )

    def session(*extra: dict[str, Any]) -> bytes:
        long = {**request, "messages": request["messages"][:1] + turns + list(extra) + request["messages"][1:]}
        return json.dumps(long, separators=(",", ":")).encode()

    png = base64.b64encode(b"\x89PNG" + bytes(range(256)) * 600).decode()
    screenshot = [
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "shot", "name": "Read", "input": {"file_path": "/workspace/shot.png"}}
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "shot",
                    "content": [
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}
                    ],
                }
            ],
        },
    ]
    fetch = [
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "web",
                    "name": "WebFetch",
                    "input": {"url": "https://example.com", "prompt": "summarize"},
                }
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "web", "content": "no network"}]},
    ]
    url = [
        {
            "role": "user",
            "content": [{"type": "image", "source": {"type": "url", "url": "https://attacker.example/x.png"}}],
        }
    ]
    code = (
        'def read(path: str) -> dict[str, str]:\n    """Reads {path} — naïvely."""\n'
        '    return {"path": path, "text": open(path).read()}  # ok ✓\n'
    ) * 60
    coded: list[dict[str, Any]] = []
    for i in range(300):
        coded.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me read it."},
                    {
                        "type": "tool_use",
                        "id": f"toolu_{i:024d}",
                        "name": "Read",
                        "input": {"file_path": f"/workspace/m{i}.py"},
                    },
                ],
            }
        )
        coded.append(
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i:024d}", "content": code}]}
        )
    real = json.dumps(
        {**request, "messages": request["messages"][:1] + coded + request["messages"][1:]},
        ensure_ascii=False,
        separators=(",", ":"),
    ).encode()
    long = session()
    return {
        "small (90 B)": json.dumps(
            {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
        ).encode(),
        f"Claude Code ({len(first) // 1000} KB)": first,
        f"long session ({len(long) / 1e6:.1f} MB)": long,
        "  + a screenshot": session(*screenshot),
        "  + a WebFetch call": session(*fetch),
        "  + a URL image (refused)": session(*url),
        f"session of code, UTF-8 ({len(real) / 1e6:.1f} MB)": real,
    }


def _hostile() -> dict[str, bytes]:
    head = b'{"model":"%s","max_tokens":16,"messages":[' % MODEL.encode()
    url = b'{"type":"image","source":{"type":"url","url":"https://a.example"}}'
    return {
        "10M empty blocks and a source key (30 MB)": head
        + b'{"role":"user","content":['
        + b"{}," * 10_000_000
        + url
        + b"]}]}",
        "1M messages, each a source (30 MB)": head
        + b",".join([b'{"role":"user","content":[{"source":"s"}]}'] * 700_000)
        + b"]}",
        "3M source keys in a tool's input (30 MB)": head + b'{"role":"assistant","content":[{"type":"tool_use",'
        b'"input":{' + b",".join(b'"url":%d' % (i % 10) for i in range(3_000_000)) + b"}}]}]}",
        "5M escaped letters in a text (30 MB)": head
        + b'{"role":"user","content":[{"type":"text","text":"'
        + b"\\u0041" * 5_000_000
        + b'"},'
        + url
        + b"]}]}",
        "a URL image under 8 nested lists": head
        + b'{"role":"user","content":'
        + b'[{"content":' * 9
        + url
        + b"}]" * 9
        + b"}]}",
    }


class _Subject:
    """One revision's gateway, held to ``MODEL`` and its output cap, and its policy step on a body."""

    def __init__(self, module: ModuleType, path: Path) -> None:
        self.module = module
        self.rules = getattr(module, "rules", None)  # the package's; a one-module gateway has none
        if self.rules is None:
            self.gateway = module.ModelGateway(
                path, upstream="http://127.0.0.1:9", api_key="k", model=MODEL, max_tokens=32000
            )
        else:
            config = module.GatewayConfig(base_url="http://127.0.0.1:9", api_key="k", model=MODEL, max_tokens=32000)
            self.gateway = module.ModelGateway(path, config)

    def prepare(self, body: bytes) -> bytes:
        if self.rules is None:
            return bytes(self.gateway._prepare("/v1/messages", body))
        request = self.rules.Request("/v1/messages", Message(), self.gateway.config, self.gateway.account)
        request.body = body
        return bytes(self.rules.prepare(request))

    def close(self) -> None:
        self.gateway.close()


def _prepare(gateway: _Subject, body: bytes) -> str:
    try:
        gateway.prepare(body)
    except Exception as exc:  # noqa: BLE001 - the module's own refusal, whichever revision's class it is
        return f"{getattr(exc, 'status', '?')} {getattr(exc, 'kind', type(exc).__name__)}"
    return "forwarded"


def _per_request(gateway: _Subject, body: bytes, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        _prepare(gateway, body)
    return (time.perf_counter() - t0) / n * 1e6


def _peak(gateway: _Subject, body: bytes) -> tuple[str, float, int]:
    """The outcome, the time (untraced: tracemalloc slows every allocation) and the peak allocation."""
    t0 = time.perf_counter()
    outcome = _prepare(gateway, body)
    elapsed = time.perf_counter() - t0
    tracemalloc.start()
    _prepare(gateway, body)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return outcome, elapsed, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", default="HEAD")
    parser.add_argument("--body", type=Path)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()

    from orchestrator.sandbox import gateway as tree

    baseline = _module(args.against)
    first = args.body.read_bytes() if args.body else json.dumps(_stand_in()).encode()
    with tempfile.TemporaryDirectory() as folder:
        gateways = {
            name: _Subject(module, Path(folder) / name) for name, module in ((args.against, baseline), ("tree", tree))
        }
        print(
            f"_prepare, us per request: min / median of {args.rounds} rounds, {args.against} and the tree "
            f"interleaved; the tree's peak allocation"
        )
        for label, body in _bodies(first).items():
            n = max(3, min(3000, 30_000_000 // (len(body) * 40 + 1)))
            times: dict[str, list[float]] = {name: [] for name in gateways}
            outcomes = {name: _prepare(gateway, body) for name, gateway in gateways.items()}
            for _ in range(args.rounds):
                for name, gateway in gateways.items():
                    times[name].append(_per_request(gateway, body, n))
            _, _, peak = _peak(gateways["tree"], body)
            cells = [
                f"{name} {min(t):8.1f} / {statistics.median(t):8.1f} ({outcomes[name]})" for name, t in times.items()
            ]
            print(f"  {label:28} {'   '.join(cells)}   peak {peak / 1e6:.2f} MB")
        print("hostile bodies, the tree's gateway: outcome, time, peak allocation")
        for label, body in _hostile().items():
            outcome, elapsed, peak = _peak(gateways["tree"], body)
            print(f"  {label:44} {outcome:28} {elapsed * 1e3:7.1f} ms   peak {peak / 1e6:6.1f} MB")
        for gateway in gateways.values():
            gateway.close()


if __name__ == "__main__":
    main()
