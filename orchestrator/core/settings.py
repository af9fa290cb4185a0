"""The one settings object: the only place that reads the environment.

Every value comes from an ``ORCHESTRATOR_*`` environment variable (a few of
OpenTelemetry's standard ``OTEL_*`` ones for traces) or an optional ``.env``
file in the working directory (:meth:`Settings.load`).
Everything the program writes lives under ``data_dir`` unless configured
otherwise, so one folder is the whole state of an embedded install.

A msgspec Struct, not pydantic-settings: every CLI command starts by loading
the settings, and importing pydantic-settings with pydantic and building this
model cost about 0.45 s of CPU, where msgspec costs about 0.06 s
(docs/performance.md, "CLI start-up").  msgspec converts the environment's
strings to the declared types and checks the bounds below; python-dotenv
reads the ``.env`` file.  Settings made in code (``Settings(...)``) are not
converted, like any Struct; :meth:`Settings.load` is the checked way in.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import msgspec
from msgspec import Meta

from orchestrator.core.errors import SettingsError
from orchestrator.core.private_dirs import private_dir
from orchestrator.core.settings_checks import check_settings
from orchestrator.core.settings_env import ENV_PREFIX, read_settings
from orchestrator.core.settings_secrets import masked_fields, secret_values
from orchestrator.core.sizes import parse_quota


class Settings(msgspec.Struct, kw_only=True):
    data_dir: Path = Path("./data")
    # This worker's name in the fleet (the hosts table, run owners, placement).
    # Empty: the machine's hostname.
    host_id: str = ""
    # The machine this worker runs on, as hosts compare it to know whether they share a
    # kernel (and so its mounts): empty, /etc/machine-id with the kernel's boot id
    # (core/machine.py).  Set it only to stand for another machine (the fault trials).
    machine_id: str = ""
    # The installation's id in container labels; empty: a hash of the database's URL.  Set
    # the same value on every host when hosts reach the database by different addresses
    # (a connection pooler beside each, a proxy), so that they know each other's containers.
    installation_id: Annotated[str, Meta(pattern=r"^([a-z0-9][a-z0-9-]{0,31})?$")] = ""
    # Empty means: the embedded default under data_dir (SQLite / filesystem://).
    database_url: str = ""
    broker_url: str = ""
    # Polling interval of kombu's virtual transports (filesystem, SQL); every
    # polled hop costs half of it on average, so keep it short.
    broker_polling_interval: Annotated[float, Meta(gt=0)] = 0.05
    # How an idle worker on the filesystem:// broker hears of a message:
    # "inotify" wakes it when the message file appears (no polling delay, an
    # idle worker near 0 % CPU; orchestrator/run/fs_transport.py), "poll"
    # looks every broker_polling_interval as kombu does (the benchmark's
    # baseline; also what happens by itself where inotify is unavailable).
    broker_wakeup: Literal["inotify", "poll"] = "inotify"

    # "offline" (no network, deterministic), "anthropic:<model id>",
    # "openai:<model id>" (any OpenAI-compatible Chat Completions server) or
    # "claude-code:<model id>" (Claude Code, the Claude Agent SDK, drives the
    # run in the agent image's claude-code variant; reaches the Messages API
    # through the same gateway with the anthropic_* settings below).
    model: str = "offline"
    anthropic_base_url: str = "https://api.anthropic.com"
    anthropic_api_key: str = ""
    # The OpenAI-compatible server's root (a trailing /v1 is accepted): a
    # local Ollama by default; vLLM, llama.cpp's server or
    # https://api.openai.com work the same.  The key is optional (sent as a
    # bearer token by the gateway; local servers need none).
    openai_base_url: str = "http://127.0.0.1:11434"
    openai_api_key: str = ""
    # Output tokens of one model answer.  The gateway holds every request to it
    # (and to the model above), whatever the container asks for.
    max_tokens: Annotated[int, Meta(ge=1)] = 1024
    # Model calls in one run: enough for a real task's dozens of tool calls.  The
    # token budget and the run's time limit are what bound a run in practice; a
    # run stopped by any of them says so in the chat, naming the setting.
    max_turns: Annotated[int, Meta(ge=1)] = 50
    # Tokens (input + output) one run may spend through the model gateway; 0: no
    # limit.  A million: some 50 turns over a 20k-token context.
    run_token_budget: Annotated[int, Meta(ge=0)] = 1_000_000
    # Anthropic extended thinking: the tokens each answer may think with (the API's
    # budget_tokens, at least 1024 and below max_tokens); 0: off.  Thinking is
    # stored (sender "thinking") and shown muted on the page, never sent to
    # channels nor shown to the model again.  Other providers ignore it.
    thinking_budget: Annotated[int, Meta(ge=0)] = 0
    # What the model gateway does with a request that names another model, or
    # asks for more than max_tokens: "refuse" it (403, saying what is allowed),
    # or "rewrite" it to the host's model and cap (for clients that pick models
    # themselves).  Either way the container never chooses what a run costs.
    gateway_model_policy: Literal["refuse", "rewrite"] = "refuse"
    # Quotas of every group (orchestrator/store/usage.py), on the database's clock;
    # a group may set its own (`orchestrator groups set JID --runs-per-hour N
    # --tokens-per-day N`).  Over one, new messages are stored and wait: the
    # next run starts when the quota frees, after a 🏠 message saying when.
    # Runs started in the last hour; 0: no limit.
    group_runs_per_hour: Annotated[int, Meta(ge=0)] = 0
    # Model tokens (input + output) of the runs started since 00:00 UTC; 0: no limit.
    group_tokens_per_day: Annotated[int, Meta(ge=0)] = 0
    # Messages one sender may send into one chat in a minute, checked at ingest
    # (people only: not the harness's own senders, not is_from_me).  Over it
    # the message is refused, not stored (HTTP 429 with Retry-After; Telegram
    # replies "slow down").  0: no limit, the default: the tests, the
    # benchmarks and a single-user install send far more than any sensible
    # limit from one sender; an install open to strangers sets e.g. 20 (what
    # strangers' chats store is bounded either way: the two settings below).
    sender_messages_per_minute: Annotated[int, Meta(ge=0)] = 0
    # Chats that are no registered group (a Telegram chat or Slack channel no group is
    # attached to; any chat posted to with ORCHESTRATOR_API_REQUIRE_REGISTERED_CHAT=false):
    # their messages are stored but never wake an agent, within two bounds ingest keeps
    # for every channel (orchestrator/run/ingest.py).  How many such chats are kept: past
    # it, a chat not yet kept has its messages dropped, not stored (counted by the metric
    # orchestrator_unregistered_messages_dropped, logged once per chat) until one is
    # registered.  0: no limit.
    unregistered_chats: Annotated[int, Meta(ge=0)] = 100
    # How many of an unregistered chat's newest messages are kept: each new one deletes
    # the oldest past it, so a chat registered later starts with its recent messages as
    # context.  0: no limit.
    unregistered_chat_messages: Annotated[int, Meta(ge=0)] = 50
    # Runs at once across the whole fleet (every worker of every host), counted
    # and admitted by the database (orchestrator/store/slots.py); 0: no cap.
    # A run over it never starts: its group waits (`orchestrator runs waiting`),
    # a person's message before scheduled tasks, the main group before others,
    # then the oldest wait, and a run that ends hands its slot on at once.
    max_concurrent_runs: Annotated[int, Meta(ge=0)] = 0
    # The model gateway's limits on what a sandbox can make the host spend
    # (orchestrator/sandbox/gateway/).  The largest request body it reads; a larger
    # Content-Length is refused (413) before any byte of the body is read.
    gateway_max_request_bytes: Annotated[int, Meta(ge=1024)] = 32 * 1024 * 1024
    # Connections served at once (one host thread each); more are closed at once.
    gateway_max_connections: Annotated[int, Meta(ge=1)] = 16
    # How long a connection may send nothing (request line, headers, body, the
    # wait for a keep-alive's next request) before the gateway closes it.
    gateway_read_timeout_s: Annotated[float, Meta(gt=0)] = 30.0
    # Requests with a server tool a group's network policy opens (the provider's web search)
    # one run may make: their fees are not tokens, so the token budget does not bound them.
    gateway_max_server_tool_requests: Annotated[int, Meta(ge=0)] = 20
    # The egress proxy of a run whose group's network policy is not off
    # (orchestrator/sandbox/egress/): names mapped to addresses, exactly per host and port,
    # like curl's --resolve ("host:port:address", comma separated), for tests and on-premise
    # hosts (such an address may be private; the installation's own ports never are allowed);
    # and a run's bounds: requests, bytes both ways, connections open at once, idle seconds.
    egress_resolve: str = ""
    # Secrets the egress proxy adds to requests to their hosts, never entering a sandbox
    # (orchestrator/sandbox/egress_credentials.py: a JSON list of name, hosts, header, value,
    # methods, path_prefixes); a group's policy names the ones it gets.  And a CA file trusted
    # besides the system's (tests and on-premise hosts): by the proxy for those hosts, and by
    # the sandboxes (its certificates only) for the hosts they reach through a tunnel.
    egress_credentials: str = ""
    egress_upstream_ca_file: str = ""
    egress_max_requests: Annotated[int, Meta(ge=1)] = 1000
    egress_max_bytes: Annotated[int, Meta(ge=1024)] = 256 * 1024 * 1024
    egress_max_connections: Annotated[int, Meta(ge=1)] = 64
    egress_idle_s: Annotated[float, Meta(gt=0)] = 60.0
    # Days a run's egress log (its stored-only ``egress_log`` record) is kept; the sweeper
    # deletes older ones (orchestrator/run/sweeper.py).  0: kept for ever.
    egress_log_retention_days: Annotated[int, Meta(ge=0)] = 30

    assistant_name: str = "Andy"
    # The main group's chat id (it answers every message and may post to other
    # chats): made on start by `up`, `api` and `worker` when missing, so a fleet
    # started by compose has one.  Empty: `up` makes "main@local".
    main_group: str = ""
    # Extra names that also trigger the agent (comma separated), besides assistant_name:
    # "@Name" at the start of a message wakes a group that requires the trigger.  A group
    # with trigger names of its own (`orchestrator groups set JID --trigger-name NAME`)
    # answers to those instead of these two (and to its own assistant name).
    trigger_aliases: str = ""
    # How many earlier messages a run shows the model besides the new ones
    # (messages of the model's view: earlier tool calls and results count,
    # thinking and host notes do not); the token budget below bounds it in practice.
    context_messages: Annotated[int, Meta(ge=0)] = 200
    # How many groups' histories a worker process keeps between their runs, so that a run
    # reads only the messages stored since the last (orchestrator/run/history_cache.py;
    # ~200 messages a group); 0 reads the whole history every run.
    history_cache_groups: Annotated[int, Meta(ge=0)] = 256
    # Tokens of history a run's input may carry (estimated as JSON bytes / 4,
    # no tokenizer in the host): past it the oldest whole turns are left out
    # and a system notice says how much.  The new messages always go.
    context_tokens: Annotated[int, Meta(ge=0)] = 60_000
    # Context blocks of user messages (files, URLs) are expanded when a run is
    # assembled; these bound what one block may add to the model's input.
    context_file_max_bytes: Annotated[int, Meta(ge=1)] = 200_000
    context_url_max_bytes: Annotated[int, Meta(ge=1)] = 200_000
    context_url_timeout_s: Annotated[float, Meta(gt=0)] = 5.0
    # The timeout above bounds each read, so a server trickling a byte every few
    # seconds could hold a run's assembly for ever: one URL's whole fetch
    # (resolving, connecting, redirects, the body) stops at the first deadline,
    # all URL blocks of one run's input together at the second; a URL past
    # either becomes an error block (orchestrator/run/url_fetch.py).
    context_url_fetch_deadline_s: Annotated[float, Meta(gt=0)] = 10.0
    context_url_run_deadline_s: Annotated[float, Meta(gt=0)] = 30.0
    # URL blocks are fetched by the host: by default never from loopback or
    # private addresses, so a chat message cannot probe the host's network.
    context_url_allow_private: bool = False
    # Lease on a group while a run holds it; renewed by a heartbeat.
    lease_ttl_s: Annotated[float, Meta(gt=1)] = 60.0
    # The sandbox fences itself (container/agent_runner/fence.py): the worker beats on
    # the run's stream every sandbox_fence_s / 4 seconds, and a runner whose stream ends
    # (the worker died) or stays silent this long (frozen, cut off) kills every process
    # of its container and exits.  Well inside the 9 s after which another host takes a
    # dead host's groups (store/hosts.py).  0: no fence (the runner reads its input to
    # the end of stdin, as runners before the fence did).
    sandbox_fence_s: Annotated[float, Meta(ge=0, le=8)] = 5.0
    # The OCI runtime of agent containers (sandbox/runtime.py): runc, gVisor's runsc (a
    # probe proves its limits hold before the first container, or the process stops),
    # or auto (runsc when the engine has it and the probe passes, else runc).
    sandbox_runtime: Literal["runc", "runsc", "auto"] = "runc"
    # A host that has not beaten for this long is gone for good: any live host on the
    # same Docker engine removes its warm and standby containers (sandbox/warm/; a
    # worker SIGKILLed for good leaves them running otherwise), and another host may
    # take over the group volumes it held (store/volume_holds.py).  0: never.
    dead_host_s: Annotated[float, Meta(ge=0)] = 120.0
    # Failed runs that stored no output are retried with backoff and jitter.
    max_attempts: Annotated[int, Meta(ge=1)] = 3
    retry_base_s: Annotated[float, Meta(ge=0)] = 2.0
    retry_max_s: Annotated[float, Meta(ge=0)] = 60.0
    # Deliveries of stored messages to channels (orchestrator/store/deliveries.py):
    # a failed send is retried after base·2ⁿ⁻¹ seconds (capped, with jitter)
    # up to max_attempts; a send that outlives claim_s is presumed cut off
    # and is never retried (never sent twice).
    delivery_max_attempts: Annotated[int, Meta(ge=1)] = 6
    delivery_retry_base_s: Annotated[float, Meta(ge=0)] = 1.0
    delivery_retry_max_s: Annotated[float, Meta(ge=0)] = 300.0
    delivery_claim_s: Annotated[float, Meta(gt=0)] = 120.0
    # Extra channels: comma-separated "module:factory", each called with the
    # settings and returning a channel or a list of them (orchestrator/channels/registry.py).
    channel_plugins: str = ""
    # Secret the outbound webhooks are signed with (HMAC-SHA256): every receiver
    # holds it, so it signs nothing we accept.
    webhook_secret: str = ""
    # The address people and other systems reach this installation's API at (e.g.
    # https://orchestrator.example.com): an outbound webhook names a message's files with
    # signed links under it (orchestrator/core/file_links.py), each good this long (a link
    # that says it is good for longer is refused).  The links' key: this one when set (hosts
    # that share no data dir), else one made once under the data dir; never a webhook secret.
    public_base_url: str = ""
    file_link_ttl_s: Annotated[float, Meta(gt=0)] = 86400.0
    file_link_key: str = ""
    # Secret inbound webhooks (POST /webhooks/inbound) must be signed with, over
    # timestamp, nonce and body (orchestrator/channels/webhook.py); empty: inbound
    # webhooks are off.  Its own, not the outbound one: a receiver of our
    # deliveries holding that one could otherwise post as anyone.  Must differ from it.
    webhook_inbound_secret: str = ""
    # How far an inbound webhook's X-Orchestrator-Timestamp may be from this host's
    # clock, either way; older ones are refused as replays (a replay inside the
    # window is the duplicate of what it replays: its nonce is the message's id).
    webhook_inbound_window_s: Annotated[float, Meta(gt=0)] = 300.0
    webhook_timeout_s: Annotated[float, Meta(gt=0)] = 10.0
    # Telegram (orchestrator/channels/telegram.py, the optional "telegram" extra):
    # the bot's token from @BotFather, and the Bot API's root (tests point
    # it at a fake).
    telegram_bot_token: str = ""
    telegram_api_base: str = "https://api.telegram.org"
    # How long a file sent to the bot may take to come in (getFile, then the download,
    # orchestrator/channels/telegram_files.py): one still coming past it is stopped and
    # its message says so, so one slow file cannot hold the poller.
    telegram_file_timeout_s: Annotated[float, Meta(gt=0)] = 60.0
    # Slack (orchestrator/channels/slack.py, the optional "slack" extra): the bot
    # token (xoxb-, chat.postMessage and the rest of the Web API), the signing
    # secret POST /slack/events checks (empty: that route answers 404), the
    # app-level token Socket Mode connects with (xapp-, connections:write), the
    # Web API's root (tests point it at a fake; it ends with a slash, as
    # slack_sdk joins method names to it), and how often a run's "working..."
    # message is brought up to date (chat.update is rate limited per channel).
    slack_bot_token: str = ""
    slack_signing_secret: str = ""
    slack_app_token: str = ""
    slack_api_base: str = "https://slack.com/api/"
    slack_progress_interval_s: Annotated[float, Meta(gt=0)] = 2.0
    # The longest one file's transfer to or from Slack may take, all of it (a file share
    # downloaded, a reply's file uploaded: orchestrator/channels/slack_files.py); a server
    # that sends a byte now and then is cut off here, not when it pleases.
    slack_file_timeout_s: Annotated[float, Meta(gt=0)] = 60.0
    # The agent's schedule tools (orchestrator/run/agent_tasks.py): the live tasks it may have
    # made per group, and the shortest interval it may schedule.
    agent_tasks_max: Annotated[int, Meta(ge=0)] = 20
    agent_task_min_interval_s: Annotated[float, Meta(ge=1)] = 60.0
    # How long a question the agent asked (ask_user) stays open before it expires unanswered
    # (orchestrator/run/questions.py); the sweeper expires it.
    question_ttl_s: Annotated[float, Meta(ge=60)] = 86400.0
    # A regenerate or an edit that reruns: how long the agent's superseded replies stay on the
    # channels waiting for the rerun's, which then take their posts over in place
    # (orchestrator/store/delivery_changes.py); past it, or at 0, they are retracted.
    rerun_replace_s: Annotated[float, Meta(ge=0)] = 300.0
    # How often Celery beat runs the sweeper.
    sweep_interval_s: Annotated[float, Meta(gt=0)] = 15.0
    # How often each worker looks for groups whose lease holder is gone (a
    # SIGKILLed process of its host, a dead host) and signals them, so they
    # are taken over without waiting for the lease to expire (orchestrator/run/recovery.py); 0: never.
    recovery_interval_s: Annotated[float, Meta(ge=0)] = 0.5
    # How often Celery beat looks for scheduled tasks that are due.
    schedule_tick_s: Annotated[float, Meta(gt=0)] = 10.0

    # Agent image and how it is built when missing.
    agent_image: str = "orchestrator-agent:latest"
    base_image: str = "orchestrator-base:bookworm-net"
    docker_url: str = ""  # empty: docker's own environment defaults

    # Sandbox limits of the run container.
    container_memory: str = "512m"
    container_cpus: Annotated[float, Meta(gt=0)] = 1.0
    container_pids: Annotated[int, Meta(ge=16)] = 256
    run_timeout_s: Annotated[float, Meta(gt=0)] = 300.0
    # > 0: a group's container stays up this long after a run and takes the
    # next one without a cold start (orchestrator/sandbox/warm/); 0: one per run.
    # On by default: a warm run costs a tenth of a cold one and an idle warm
    # container about 11 MiB; the cap below bounds how many one host keeps.
    warm_idle_s: Annotated[float, Meta(ge=0)] = 300.0
    # The most warm containers one host keeps; past it the least recently used
    # idle one is stopped.  0: sized by the host's memory (warm.warm_cap).
    warm_max: Annotated[int, Meta(ge=0)] = 0
    # Standby sandboxes a host keeps started ahead for quiet groups' first runs
    # (orchestrator/sandbox/standby.py; needs root and warm sessions); 0: none.
    standby: Annotated[int, Meta(ge=0, le=64)] = 2
    bash_timeout_s: Annotated[float, Meta(gt=0)] = 60.0
    # Bounds on what one run's output may cost the host (orchestrator/sandbox/bounded_io.py):
    # the agent can write anything to the runner's stdout and stderr.  A run
    # that breaks one is stopped and fails, not retried, with a host message.
    # The longest output line (one event) the host reads; a longer one is never buffered.
    max_event_line_bytes: Annotated[int, Meta(ge=4096)] = 1024 * 1024
    # Output lines one run may write (events, and lines that are not events).
    max_run_events: Annotated[int, Meta(ge=10)] = 2000
    # Bytes of messages (content + metadata) one run may store, summed.
    max_run_stored_bytes: Annotated[int, Meta(ge=65536)] = 16 * 1024 * 1024
    # A replay (orchestrator/run/replay.py) runs on a scratch copy of the group's
    # workspace: the workspace is the agent's and may hold anything, so the copy
    # is bounded; a workspace over either bound is refused, not copied in part
    # (a partial copy would not be the input the run had).
    replay_max_bytes: Annotated[int, Meta(ge=0)] = 512 * 1024 * 1024
    replay_max_files: Annotated[int, Meta(ge=1)] = 50_000
    # One tool result's stored output (and its envelope): longer output is cut
    # with a visible marker, the original size kept in the metadata.
    max_tool_result_bytes: Annotated[int, Meta(ge=1024)] = 256 * 1024
    # Host folders a group may mount (orchestrator/sandbox/mounts.py).  Kept outside
    # the project and the data dir, so no agent can ever edit it.
    mount_allowlist: Path = Path("~/.config/orchestrator/mount-allowlist.json")
    # Disk one group's workspace may take (orchestrator/sandbox/quota/): a size like
    # "2g"; "0": no quota; "auto": 2g where the host can enforce it hard
    # (loop-mounted volumes: root with loop devices), none where only a check
    # before each run could (that walk costs every run; set a size to have
    # it).  A group's container_config may set its own.
    workspace_quota: str = "auto"
    # auto: loop-mounted ext4 volumes when the host runs as root with loop
    # devices, else a usage check before each run; "volume" or "checked" force one.
    workspace_quota_mode: Literal["auto", "volume", "checked"] = "auto"
    # Disk one group's session folder (data/sessions/<folder>, where Claude Code keeps
    # its transcripts; mounted read-write at /session) may take: a size like "256m";
    # "0": no quota; "auto": 512m.  Enforced as the workspace's is (a volume of its
    # own, or a check before each run), by the same mode.
    session_quota: str = "auto"

    # Files people send and agents hand back (orchestrator/store/files.py), stored once by
    # content under <data_dir>/files.  The largest one file may be: an upload is counted as
    # it streams in and stopped past it, nothing kept.
    file_max_bytes: Annotated[int, Meta(ge=1)] = 25 * 1024 * 1024
    # The bytes of all the files a group stored first (a file another group stored before
    # costs nothing more); a file that would take the group past it is refused.
    group_files_max_bytes: Annotated[int, Meta(ge=1)] = 1024 * 1024 * 1024
    # The longest instructions file (the installation's, a group's: orchestrator/run/instructions.py)
    # and the part of a group's MEMORY.md a run's system prompt carries (a longer one is cut,
    # and the run's notice says so).
    instructions_max_bytes: Annotated[int, Meta(ge=1)] = 32 * 1024
    memory_max_bytes: Annotated[int, Meta(ge=1)] = 16 * 1024
    # How long a stored file no live message names is kept before the sweeper frees it: an
    # upload's message comes after it; a truncated history's files go after this long.
    file_unreferenced_grace_s: Annotated[float, Meta(ge=0)] = 86400.0
    # The models that see images (comma-separated shell patterns, matched against the model
    # id without its provider, case-insensitive): a person's images go to them as image
    # blocks, scaled in the sandbox (agent_runner/images.py); any other model reads the
    # images' names and paths only.  "offline" reports what it was shown (/images).
    vision_models: str = "claude-*,gpt-4o*,gpt-4.1*,gpt-5*,offline"

    # The API the CLI's ``send`` talks to (e.g. http://10.0.0.5:8000 for a
    # fleet's API).  Empty: the one ``orchestrator up``/``api`` announced in
    # the data dir (orchestrator/http/endpoint.py), else the CLI stores in process.
    api_url: str = ""
    api_host: str = "127.0.0.1"
    api_port: Annotated[int, Meta(ge=0, le=65535)] = 8000
    # Bearer token of every /api route (``Authorization: Bearer <token>``).
    # Required when the API listens beyond loopback (it refuses to start
    # without one); optional on loopback, and enforced there too when set.
    api_token: str = ""
    # ``user:password`` for Flower's page and JSON API (``orchestrator flower``), passed to it
    # through its environment, never its command line.  Required when Flower listens beyond
    # loopback; empty on loopback: no login (the JSON API too, for local scripts).
    flower_basic_auth: str = ""
    # POST /api/messages (and the stream) answer 404 for a chat that is not a
    # registered group, instead of storing a message no agent will ever see.
    api_require_registered_chat: bool = True
    # The largest request body the API reads (orchestrator/http/guards.py): a larger
    # Content-Length is a 413 before any byte of the body is read, and a chunked body
    # is cut off at it.  1 MiB holds the largest message (100,000 characters of
    # content) with its context items.
    api_max_request_bytes: Annotated[int, Meta(ge=4096)] = 1024 * 1024
    # Without a token the API serves loopback only, and answers only requests whose
    # Host header names this machine (127.0.0.1, localhost, [::1], with any port):
    # a web page whose name an attacker re-points at 127.0.0.1 (DNS rebinding) must
    # not drive the agent from a browser.  Further names (comma separated) that
    # reach this API on loopback, e.g. one from /etc/hosts.
    api_allowed_hosts: str = ""
    # How a chat's open readers (the API's event streams, `orchestrator chat`) hear that the
    # chat changed (a message stored, a draft written, a run's state): "push" is a wake-up
    # (PostgreSQL LISTEN/NOTIFY; SQLite: an inotify watch of the wake-up files beside the
    # database, orchestrator/store/chat_listener.py), "poll" only the safety poll below:
    # for a PostgreSQL behind a pooler that cannot LISTEN (PgBouncer's transaction mode),
    # and the baseline of bench/stream_push.py.
    stream_wakeup: Literal["push", "poll"] = "push"
    # How often an open reader looks without being woken: at most what a lost wake-up costs
    # (and, with stream_wakeup=poll, how late a change is seen).  An idle stream's look is
    # three indexed reads: at 2 s, about 1.5 a second (0.2 s before streams were woken).
    stream_safety_poll_s: Annotated[float, Meta(gt=0, le=300)] = 2.0
    # How long an API request waits for SQLite's write lock (another process holding
    # it: a worker's long transaction, a backup, a stray sqlite3 shell) before it
    # answers 503 with Retry-After.  Workers wait 60 s (they have no caller waiting);
    # a client should hear "busy, retry" in seconds, not hang for a minute.
    api_db_wait_s: Annotated[float, Meta(gt=0, le=60)] = 5.0

    log_level: str = "INFO"
    # "text" for people, "json" for log pipelines: one object per line with the
    # chat, run, host and trace it is about (orchestrator/core/logs.py).
    log_format: Literal["text", "json"] = "text"

    # Prometheus metrics (orchestrator/core/metrics.py).  The API serves its own on
    # GET /metrics.  A worker's main process serves those of its pool children on
    # http://<metrics_host>:<metrics_port>/metrics; 0: not served, and the worker's
    # processes count in memory only (nothing written to metrics_dir).  Two workers on
    # one machine (`orchestrator up` runs two) need two ports.
    metrics_port: Annotated[int, Meta(ge=0, le=65535)] = 0
    metrics_host: str = "127.0.0.1"
    # Where a serving worker's processes keep their counts (prometheus_client's
    # multiprocess mode: a file per process, read by the main process): a folder per
    # worker, <host id>-<pid>, made empty when the worker starts and removed when it
    # stops.  None: <data_dir>/metrics.
    metrics_dir: Path | None = None

    # OpenTelemetry traces (orchestrator/core/tracing.py), set by the standard OTEL_*
    # variables, not ORCHESTRATOR_* ones (read here all the same: _OTEL_VARIABLES):
    # OTEL_TRACES_EXPORTER "none" (the default: nothing of OpenTelemetry is even
    # imported), "console" (one JSON object per span on stderr) or "otlp" (OTLP over
    # HTTP/protobuf, the `otlp` extra), or both comma-separated; OTEL_SERVICE_NAME;
    # OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces,
    # else the SDK's default (http://localhost:4318/v1/traces).
    otel_traces_exporter: str = "none"
    otel_service_name: str = "agent-orchestrator"
    otel_exporter_otlp_endpoint: str = ""
    otel_exporter_otlp_traces_endpoint: str = ""

    def __post_init__(self) -> None:
        # Runs for Settings made in code and for loaded ones alike.
        # The gateway appends the request's path (/v1/chat/completions).
        self.openai_base_url = self.openai_base_url.strip().rstrip("/").removesuffix("/v1")
        # Workers, the API and containers' bind mounts all need the same
        # absolute path, whatever directory each process starts in.
        self.data_dir = Path(self.data_dir).expanduser().resolve()
        # Symlinks are resolved when the file is read, not here.
        self.mount_allowlist = Path(self.mount_allowlist).expanduser().absolute()
        if self.metrics_dir is not None:
            self.metrics_dir = Path(self.metrics_dir).expanduser().resolve()
        self.main_group = self.main_group.strip()
        self.slack_api_base = self.slack_api_base.strip().rstrip("/") + "/"
        for name in ("workspace_quota", "session_quota"):
            size = getattr(self, name).strip().lower()
            setattr(self, name, size)
            if size != "auto":
                try:
                    parse_quota(size)
                except ValueError as exc:
                    raise SettingsError(f"{ENV_PREFIX}{name.upper()}: {exc}") from exc
        check_settings(self)

    @classmethod
    def load(
        cls, *, environ: Mapping[str, str] | None = None, env_file: str | Path | None = ".env", **values: Any
    ) -> Settings:
        """The settings from ``ORCHESTRATOR_*`` variables, converted and checked.

        Later sources win: the ``.env`` file (None: none), then ``environ``
        (default: the process environment), then ``values`` given in code.
        Raises :class:`SettingsError` naming the variable and what is wrong.
        """
        return read_settings(cls, environ=environ, env_file=env_file, values=values)

    def __repr__(self) -> str:
        # Settings end up in tracebacks, debug prints and error reports: the secrets never do.
        return f"Settings({', '.join(f'{name}={value!r}' for name, value in masked_fields(self))})"

    def secrets(self) -> list[str]:
        """The secret values set (tokens, keys, URL passwords): what no log line, error,
        export or answer may show (orchestrator/core/logs.py removes them from log lines)."""
        return secret_values(self)

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` (as given, not converted), re-normalized."""
        return msgspec.structs.replace(self, **changes)

    # -- derived values ------------------------------------------------------

    @property
    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'orchestrator.db'}"

    @property
    def effective_broker_url(self) -> str:
        # An explicit host keeps kombu from warning that none was supplied.
        return self.broker_url or "filesystem://localhost/"

    @property
    def effective_host_id(self) -> str:
        """This worker's fleet name: ``host_id``, or the machine's hostname."""
        import socket

        return self.host_id or socket.gethostname()

    @property
    def install_id(self) -> str:
        """A short stable id of this installation (its database), for container labels:
        ``installation_id`` when set, else a hash of the database's URL."""
        return self.installation_id or hashlib.sha256(self.effective_database_url.encode()).hexdigest()[:12]

    @property
    def trigger_names(self) -> list[str]:
        names = [self.assistant_name, *self.trigger_aliases.split(",")]
        return [n.strip() for n in names if n.strip()]

    @property
    def egress_resolve_entries(self) -> list[str]:
        """ORCHESTRATOR_EGRESS_RESOLVE's ``host:port:address`` entries."""
        return [e.strip() for e in self.egress_resolve.split(",") if e.strip()]

    @property
    def own_ports(self) -> frozenset[int]:
        """The ports of this installation's own services (API, metrics, database, broker): never
        reachable through the egress proxy, whatever a resolve entry says."""
        ports = {self.api_port, self.metrics_port, 5432, 6379}
        for url in (self.database_url, self.broker_url):
            port = urlsplit(url).port if url else None
            if port:
                ports.add(port)
        return frozenset(p for p in ports if p)

    @property
    def trace_exporters(self) -> list[str]:
        """The span exporters OTEL_TRACES_EXPORTER names (``none``: none; empty: none)."""
        names = [n.strip().lower() for n in self.otel_traces_exporter.split(",")]
        return [n for n in dict.fromkeys(names) if n and n != "none"]

    @property
    def effective_metrics_dir(self) -> Path:
        """Where serving workers keep their metrics files: ``metrics_dir`` or ``<data_dir>/metrics``."""
        return self.metrics_dir or self.data_dir / "metrics"

    @property
    def broker_dir(self) -> Path:
        return self.data_dir / "broker"

    @property
    def groups_dir(self) -> Path:
        return self.data_dir / "groups"

    @property
    def runs_dir(self) -> Path:
        return self.data_dir / "runs"

    @property
    def sessions_dir(self) -> Path:
        return self.data_dir / "sessions"

    @property
    def files_dir(self) -> Path:
        """Where stored files live, once each by content (orchestrator/store/files.py)."""
        return self.data_dir / "files"

    @property
    def build_dir(self) -> Path:
        return self.data_dir / "build"

    def ensure_dirs(self) -> None:
        """The data dir's folders; the data dir, ``runs/`` and ``sessions/`` this user's alone
        (:func:`private_dir`), made so or tightened if an older version made them under a looser umask."""
        for d in (self.data_dir, self.runs_dir, self.sessions_dir):
            private_dir(d)
        for d in (self.groups_dir, self.build_dir):
            d.mkdir(parents=True, exist_ok=True)
        for sub in ("out", "processed", "control"):
            (self.broker_dir / sub).mkdir(parents=True, exist_ok=True)
