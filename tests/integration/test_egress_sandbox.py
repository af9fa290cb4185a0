"""The sandbox reaches the network only through its run's egress proxy, on its group's
policy (the issue's check, with python's urllib in the sandbox as the client): with
``allowlist:files.internal.test`` and a resolve entry for a web server on a loopback port,
the file is fetched; another name is refused with the proxy's reason; a group whose policy
is off reaches nothing; ``orchestrator runs show RUN --egress`` lists the decisions.  Real
clients (curl, git over HTTP and over HTTPS with a test CA the sandbox trusts by
``ORCHESTRATOR_EGRESS_UPSTREAM_CA_FILE``, pip from a local index) in one run; Claude Code's
WebFetch (the claude-code image) over HTTPS, without its preflight to the provider."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.core.settings import Settings
from orchestrator.http.api import create_app
from orchestrator.http.endpoint import CLIENT_HEADER
from orchestrator.root import Orchestrator
from orchestrator.run.egress_log import run_egress
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline
from orchestrator.sandbox.config import set_container_config
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group, ensure_main_group
from orchestrator.store.message_log import get_messages_after
from tests.conftest import TEST_ENV
from tests.host.test_egress_brokered import upstream as upstream  # the HTTPS server fixture

JID, OFF = "main@local", "off@g.us"


class _Files(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def files(tmp_path: Path) -> Iterator[int]:
    root = tmp_path / "www"
    root.mkdir()
    (root / "hello.txt").write_text("hello from the files host\n")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: _Files(*a, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


SCRIPT = """/write fetch.py
import sys, urllib.request, urllib.error
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())
except urllib.error.HTTPError as e:
    print("HTTP", e.code, e.read().decode())
except OSError as e:
    print("URLError", e)
/end
"""


def fetch(*urls: str) -> str:
    """A message for the offline model: python's urllib (it honours HTTP_PROXY) fetches each URL."""
    return SCRIPT + "\n".join(f"$ python3 fetch.py {url}" for url in urls)


def outputs(db: Database, jid: str) -> list[str]:
    """The bash commands' outputs in the chat."""
    return [
        m.content
        for m in get_messages_after(jid, 0, db=db)
        if m.message_type == "tool_result" and m.sender_name == "bash"
    ]


def test_the_sandbox_reaches_what_its_group_allows_and_nothing_else(
    settings: Settings, db: Database, agent_image: str, files: int
) -> None:
    s = settings.replace(
        agent_image=agent_image, run_timeout_s=60.0, egress_resolve=f"files.internal.test:{files}:127.0.0.1"
    )
    s.ensure_dirs()
    ensure_main_group(db)
    set_container_config(db, s, JID, {"egress": {"mode": "allowlist", "allow": ["files.internal.test"]}})
    add_group(db, chat_jid=OFF, name="off", folder="off", requires_trigger=False)
    good, other = f"http://files.internal.test:{files}/hello.txt", f"http://other.internal.test:{files}/"
    ingest(db, s, IncomingMessage(chat_jid=JID, sender="u", content=fetch(good, other)), signal=None)
    (run,) = Pipeline(s, db, ChannelRegistry([])).drain_group(JID)
    assert run.run.state == "succeeded"
    got, refused = outputs(db, JID)
    assert "hello from the files host" in got
    assert "HTTP 403 egress refused: other.internal.test" in refused and "not on this group's allowlist" in refused

    ingest(db, s, IncomingMessage(chat_jid=OFF, sender="u", content=fetch(good)), signal=None)
    (off,) = Pipeline(s, db, ChannelRegistry([])).drain_group(OFF)
    (nothing,) = outputs(db, OFF)
    assert "hello from the files host" not in nothing and ("URLError" in nothing or "Errno" in nothing)

    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")}
    env |= TEST_ENV | {"ORCHESTRATOR_DATA_DIR": str(s.data_dir), "ORCHESTRATOR_DATABASE_URL": s.database_url}
    cli = str(Path(sys.executable).parent / "orchestrator")
    shown = subprocess.run(
        [cli, "runs", "show", run.run.id, "--egress"], env=env, capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    with TestClient(
        create_app(Orchestrator(s.replace(api_allowed_hosts="testserver"))), headers={CLIENT_HEADER: "t"}
    ) as api:
        log = api.get(f"/api/runs/{run.run.id}/egress").json()
    assert [(d["host"], d["allowed"]) for d in log["decisions"]] == [
        ("files.internal.test", True),
        ("other.internal.test", False),
    ]
    assert log["decisions"][0]["received"] > 0 and log["left_out"] == 0
    lines = shown.stdout.splitlines()
    assert lines[0].startswith(f"allowed  GET files.internal.test:{files}  allowed")
    assert lines[1].startswith(f"refused  GET other.internal.test:{files}  other.internal.test:{files} is not on")


def test_ask_mode_asks_the_chat_and_a_later_run_goes_through(
    settings: Settings, db: Database, agent_image: str, files: int
) -> None:
    from orchestrator.run.questions import answer_question
    from orchestrator.store.questions import chat_questions

    s = settings.replace(
        agent_image=agent_image, run_timeout_s=60.0, egress_resolve=f"files.internal.test:{files}:127.0.0.1"
    )
    s.ensure_dirs()
    ensure_main_group(db)
    set_container_config(db, s, JID, {"egress": {"mode": "ask"}})
    url = f"http://files.internal.test:{files}/hello.txt"
    ingest(db, s, IncomingMessage(chat_jid=JID, sender="u", content=fetch(url)), signal=None)
    Pipeline(s, db, ChannelRegistry([])).drain_group(JID)
    (refused,) = outputs(db, JID)
    assert "the chat is asked whether to allow it" in refused
    (question,) = chat_questions(db, JID, open_only=True)
    assert question.subject == {"host": "files.internal.test", "port": files}
    answer_question(db, JID, "allow", via="api", question_id=question.id)
    ingest(db, s, IncomingMessage(chat_jid=JID, sender="u", content=f"$ python3 fetch.py {url}"), signal=None)
    Pipeline(s, db, ChannelRegistry([])).drain_group(JID)
    assert "hello from the files host" in outputs(db, JID)[-1]


def _git_repo(root: Path) -> None:
    """A bare repository with one commit under ``root``/repo.git, served as git's dumb HTTP."""
    work = root.parent / "work"
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "HOME": str(root.parent),
    }
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True, env=env)
    (work / "README").write_text("cloned through the egress proxy\n")
    subprocess.run(["git", "-C", str(work), "add", "README"], check=True, env=env)
    subprocess.run(["git", "-C", str(work), "commit", "-q", "-m", "first"], check=True, env=env)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(root / "repo.git")], check=True, env=env)
    subprocess.run(["git", "-C", str(root / "repo.git"), "update-server-info"], check=True, env=env)


def _wheel(root: Path) -> None:
    """A one-module wheel (hello-egress 1.0) and a PEP 503 index naming it, under ``root``."""
    import base64
    import hashlib
    import zipfile

    files = {
        "hello_egress.py": b"WORD = 'installed through the egress proxy'\n",
        "hello_egress-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: hello-egress\nVersion: 1.0\n",
        "hello_egress-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
        for name, data in files.items()
    ]
    files["hello_egress-1.0.dist-info/RECORD"] = (
        "\n".join([*record, "hello_egress-1.0.dist-info/RECORD,,"]) + "\n"
    ).encode()
    (root / "packages").mkdir()
    wheel = root / "packages" / "hello_egress-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    (root / "simple" / "hello-egress").mkdir(parents=True)
    (root / "simple" / "hello-egress" / "index.html").write_text(
        '<a href="../../packages/hello_egress-1.0-py3-none-any.whl">hello_egress-1.0-py3-none-any.whl</a>\n'
    )


def test_real_clients_curl_git_and_pip_through_the_proxy(
    settings: Settings, db: Database, agent_image: str, tmp_path: Path
) -> None:
    from tests.host.test_egress_brokered import tls_for

    root = tmp_path / "served"
    root.mkdir()
    _git_repo(root)
    _wheel(root)
    (root / "hello.txt").write_text("hello from the files host\n")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: _Files(*a, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    # The same files over HTTPS, with a certificate of a test CA the sandbox trusts through
    # ORCHESTRATOR_EGRESS_UPSTREAM_CA_FILE (an on-premise git server's CA): a plain tunnel.
    test_ca, tls = tls_for(tmp_path, ("git.internal.test",))
    https = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: _Files(*a, directory=str(root)))
    https.socket = tls.wrap_socket(https.socket, server_side=True)
    threading.Thread(target=https.serve_forever, daemon=True).start()
    tls_port = https.server_address[1]
    names = ("files.internal.test", "git.internal.test", "pypi.internal.test")
    try:
        s = settings.replace(
            agent_image=agent_image,
            run_timeout_s=120.0,
            egress_resolve=",".join(
                [*(f"{n}:{port}:127.0.0.1" for n in names), f"git.internal.test:{tls_port}:127.0.0.1"]
            ),
            egress_upstream_ca_file=str(test_ca),
        )
        s.ensure_dirs()
        ensure_main_group(db)
        set_container_config(db, s, JID, {"egress": {"mode": "allowlist", "allow": list(names)}})
        lines = [
            f"$ curl -s http://files.internal.test:{port}/hello.txt",
            f"$ curl -s http://other.internal.test:{port}/",
            f"$ git clone -q http://git.internal.test:{port}/repo.git cloned && cat cloned/README",
            f"$ git clone -q https://git.internal.test:{tls_port}/repo.git over-tls && cat over-tls/README",
            f"$ git clone -q https://gitx.internal.test:{tls_port}/repo.git refused 2>&1; echo exit $?",
            "$ python3 -m venv /tmp/v && PIP_DISABLE_PIP_VERSION_CHECK=1 /tmp/v/bin/python -m pip install -q "
            f"--index-url http://pypi.internal.test:{port}/simple/ --trusted-host pypi.internal.test hello-egress "
            "&& /tmp/v/bin/python -c 'import hello_egress; print(hello_egress.WORD)'",
        ]
        ingest(db, s, IncomingMessage(chat_jid=JID, sender="u", content="\n".join(lines)), signal=None)
        (run,) = Pipeline(s, db, ChannelRegistry([])).drain_group(JID)
        assert run.run.state == "succeeded"
        curl_ok, curl_refused, cloned, cloned_tls, clone_refused, installed = outputs(db, JID)
        assert curl_ok.strip() == "hello from the files host"
        assert f"egress refused: other.internal.test:{port} is not on this group's allowlist" in curl_refused
        assert "cloned through the egress proxy" in cloned
        assert cloned_tls.strip() == "cloned through the egress proxy"  # git verified the test CA's certificate
        assert "403" in clone_refused and clone_refused.strip().endswith("exit 128")
        assert "installed through the egress proxy" in installed
        log = run_egress(db, run.run.id)
        tunnelled = [(d.method, d.host, d.port, d.allowed) for d in log.decisions if d.port == tls_port]
        assert ("CONNECT", "git.internal.test", tls_port, True) in tunnelled
        assert ("CONNECT", "gitx.internal.test", tls_port, False) in tunnelled
    finally:
        for each in (server, https):
            each.shutdown()
            each.server_close()


def test_a_brokered_secret_reaches_its_host_and_nothing_of_the_sandbox(
    settings: Settings, db: Database, agent_image: str, upstream: tuple[int, Path, list[dict[str, str]]]
) -> None:
    from orchestrator.run.assembly import stored_input
    from tests.host.test_egress_brokered import API, SECRET, settings_for

    port, test_ca, seen = upstream
    s = settings_for(settings, port, test_ca).replace(agent_image=agent_image, run_timeout_s=60.0)
    s.ensure_dirs()
    ensure_main_group(db)
    set_container_config(db, s, JID, {"egress": {"mode": "allowlist", "credentials": ["github"]}})
    lines = [
        f"$ curl -sS https://{API}:{port}/repos/acme/x | tee fetched.txt",
        "$ env | sort > env.txt; grep -ril canary /workspace /tmp /proc/self/environ; echo scanned",
    ]
    ingest(db, s, IncomingMessage(chat_jid=JID, sender="u", content="\n".join(lines)), signal=None)
    (run,) = Pipeline(s, db, ChannelRegistry([])).drain_group(JID)
    assert run.run.state == "succeeded"
    fetched, scanned = outputs(db, JID)
    assert fetched == "secret area\n"  # through the proxy's TLS, trusted by the mounted bundle
    assert seen[0]["authorization"] == SECRET  # the host got it
    assert scanned.strip() == "scanned"  # nothing in the sandbox's files or environment names it
    # Nor anything the host keeps of the run: its messages, its input.
    stored = [m.content + json.dumps(m.metadata) for m in get_messages_after(JID, 0, db=db)]
    assert all(SECRET not in text for text in stored)
    raw = stored_input(db, run.run.id)
    assert raw is not None and SECRET.encode() not in raw


# Claude Code's WebFetch, through the proxy: the fake model asks for a page of an allowed host
# over HTTPS (a test CA's certificate), then for one off the allowlist.
WEBFETCH_PROMPT = "read the docs page"


@pytest.mark.parametrize("db_backend", ["sqlite"])  # one container run: the backends are proven above
def test_claude_code_webfetch_goes_through_the_proxy_without_its_preflight(
    settings: Settings, db: Database, agent_image: str, claude_code_image: str, tmp_path: Path
) -> None:
    """WebFetch is offered with a proxy; it fetches an allowed host's page through it (the
    CLI's summarising request to the run's model passing the gateway), is refused another
    host, and its preflight to the provider's domain check (api.anthropic.com) never leaves."""
    from fakes.anthropic_api import FakeAnthropic, Recorded, Reply, message
    from tests.host.test_egress_brokered import tls_for

    seen: list[str] = []

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(f"{self.headers.get('Host')}{self.path}")
            body = b"<html><body><h1>Docs</h1><p>The magic word is PELICAN.</p></body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    test_ca, tls = tls_for(tmp_path, ("docs.internal.test", "other.internal.test"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    good, other = f"https://docs.internal.test:{port}/page", f"https://other.internal.test:{port}/page"

    def call(tool_id: str, url: str) -> Reply:
        use = {"type": "tool_use", "id": tool_id, "name": "WebFetch", "input": {"url": url, "prompt": "The word?"}}
        return message([use], "tool_use", 2)

    def model(rec: Recorded) -> Reply:
        last = rec.body["messages"][-1]
        blocks = [b for b in last["content"] if isinstance(b, dict)] if isinstance(last["content"], list) else []
        answered = [b["tool_use_id"] for b in blocks if b.get("type") == "tool_result"]
        if not rec.body.get("tools"):  # WebFetch's request to read the page for the prompt
            return message([{"type": "text", "text": "summary: the magic word is PELICAN"}], "end_turn", 1)
        if answered == ["toolu_wf_docs"]:
            return call("toolu_wf_other", other)
        if answered:
            return message([{"type": "text", "text": "done reading"}], "end_turn", 1)
        if WEBFETCH_PROMPT in json.dumps(last):
            return call("toolu_wf_docs", good)
        return message([{"type": "text", "text": "(not scripted)"}], "end_turn", 1)

    fake = FakeAnthropic(*([model] * 20))
    try:
        with fake.serve() as upstream:
            s = settings.replace(
                agent_image=agent_image,
                model="claude-code:claude-sonnet-4-5",
                anthropic_base_url=upstream,
                anthropic_api_key="sk-webfetch-test",
                max_tokens=4096,
                container_memory="1g",
                run_timeout_s=180.0,
                max_attempts=1,
                egress_resolve=f"docs.internal.test:{port}:127.0.0.1",
                egress_upstream_ca_file=str(test_ca),
            )
            s.ensure_dirs()
            ensure_main_group(db)
            set_container_config(db, s, JID, {"egress": {"mode": "allowlist", "allow": ["docs.internal.test"]}})
            ingest(db, s, IncomingMessage(chat_jid=JID, sender="u", content=WEBFETCH_PROMPT), signal=None)
            (run,) = Pipeline(s, db, ChannelRegistry([])).drain_group(JID)
    finally:
        server.shutdown()
        server.server_close()

    assert run.run.state == "succeeded", run.run.error
    tools = {t["name"] for t in fake.calls[0].body["tools"]}
    assert "WebFetch" in tools and "WebSearch" not in tools, tools
    results = {
        (m.metadata or {}).get("tool_use_id"): m.content
        for m in get_messages_after(JID, 0, db=db)
        if m.message_type == "tool_result"
    }
    # The page came from the server through the proxy, and the run's model read it.
    assert seen == [f"docs.internal.test:{port}/page"], seen
    (read,) = [c for c in fake.calls if not c.body.get("tools")]
    assert "PELICAN" in json.dumps(read.body["messages"]) and read.body["model"] == "claude-sonnet-4-5"
    assert "summary: the magic word is PELICAN" in results["toolu_wf_docs"], results
    assert "proxy refused" in results["toolu_wf_other"], results
    log = run_egress(db, run.run.id)
    decisions = [(d.method, d.host, d.port, d.allowed) for d in log.decisions]
    assert decisions == [
        ("CONNECT", "docs.internal.test", port, True),
        ("CONNECT", "other.internal.test", port, False),
    ], decisions  # and nothing for api.anthropic.com: the preflight is off
    assert "not on this group's allowlist" in log.decisions[1].reason
