"""The run path: a run's bounds and retries, what its input carries, and the quotas
that decide whether it starts."""

from __future__ import annotations

from typing import Annotated, ClassVar

from msgspec import Meta

from orchestrator.core.settings.section import Section


class RunSettings(Section, kw_only=True):
    """One run's bounds and retries, the agent's tasks and questions, replays."""

    prefix: ClassVar[str] = ""

    # Failed runs that stored no output are retried with backoff and jitter.
    max_attempts: Annotated[int, Meta(ge=1, description="attempts of a failed run that stored no output")] = 3
    retry_base_s: Annotated[
        float, Meta(ge=0, description="the first retry's delay of a failed run (doubling, with jitter)")
    ] = 2.0
    retry_max_s: Annotated[float, Meta(ge=0, description="the longest retry delay of a failed run")] = 60.0
    run_timeout_s: Annotated[float, Meta(gt=0, description="seconds one run may take")] = 300.0
    bash_timeout_s: Annotated[float, Meta(gt=0, description="seconds one bash command of the agent may take")] = 60.0
    # Bounds on what one run's output may cost the host (orchestrator/sandbox/bounded_io.py):
    # the agent can write anything to the runner's stdout and stderr.  A run
    # that breaks one is stopped and fails, not retried, with a host message.
    # The longest output line (one event) the host reads; a longer one is never buffered.
    max_event_line_bytes: Annotated[
        int, Meta(ge=4096, description="the longest output line (one event) the host reads from a run")
    ] = 1024 * 1024
    # Output lines one run may write (events, and lines that are not events).
    max_run_events: Annotated[int, Meta(ge=10, description="output lines one run may write")] = 2000
    # Bytes of messages (content + metadata) one run may store, summed.
    max_run_stored_bytes: Annotated[int, Meta(ge=65536, description="bytes of messages one run may store")] = (
        16 * 1024 * 1024
    )
    # One tool result's stored output (and its envelope): longer output is cut
    # with a visible marker, the original size kept in the metadata.
    max_tool_result_bytes: Annotated[
        int, Meta(ge=1024, description="bytes of one tool result's stored output (longer is cut with a marker)")
    ] = 256 * 1024
    # The agent's schedule tools (orchestrator/run/agent_tasks.py): the live tasks it may have
    # made per group, and the shortest interval it may schedule.
    agent_tasks_max: Annotated[
        int, Meta(ge=0, description="live scheduled tasks the agent may have made per group")
    ] = 20
    agent_task_min_interval_s: Annotated[
        float, Meta(ge=1, description="the shortest interval the agent may schedule a task at")
    ] = 60.0
    # How long a question the agent asked (ask_user) stays open before it expires unanswered
    # (orchestrator/run/questions.py); the sweeper expires it.
    question_ttl_s: Annotated[float, Meta(ge=60, description="seconds a question the agent asked stays open")] = 86400.0
    # A regenerate or an edit that reruns: how long the agent's superseded replies stay on the
    # channels waiting for the rerun's, which then take their posts over in place
    # (orchestrator/store/delivery_changes.py); past it, or at 0, they are retracted.
    rerun_replace_s: Annotated[
        float, Meta(ge=0, description="seconds superseded replies wait on the channels for a rerun's to replace them")
    ] = 300.0
    # A replay (orchestrator/run/replay.py) runs on a scratch copy of the group's
    # workspace: the workspace is the agent's and may hold anything, so the copy
    # is bounded; a workspace over either bound is refused, not copied in part
    # (a partial copy would not be the input the run had).
    replay_max_bytes: Annotated[int, Meta(ge=0, description="the largest workspace a replay copies")] = (
        512 * 1024 * 1024
    )
    replay_max_files: Annotated[int, Meta(ge=1, description="the most files of a workspace a replay copies")] = 50_000


class ContextSettings(Section, kw_only=True):
    """What a run's input carries: history, context blocks (files, URLs), instructions and memory."""

    prefix: ClassVar[str] = "context_"
    unprefixed: ClassVar[frozenset[str]] = frozenset(
        {"history_cache_groups", "instructions_max_bytes", "memory_max_bytes"}
    )

    # How many earlier messages a run shows the model besides the new ones
    # (messages of the model's view: earlier tool calls and results count,
    # thinking and host notes do not); the token budget below bounds it in practice.
    messages: Annotated[int, Meta(ge=0, description="earlier messages a run shows the model besides the new ones")] = (
        200
    )
    # How many groups' histories a worker process keeps between their runs, so that a run
    # reads only the messages stored since the last (orchestrator/run/history_cache.py;
    # ~200 messages a group); 0 reads the whole history every run.
    history_cache_groups: Annotated[
        int, Meta(ge=0, description="groups' histories a worker process keeps between their runs; 0: none")
    ] = 256
    # Tokens of history a run's input may carry (estimated as JSON bytes / 4,
    # no tokenizer in the host): past it the oldest whole turns are left out
    # and a system notice says how much.  The new messages always go.
    tokens: Annotated[
        int, Meta(ge=0, description="tokens of history a run's input may carry (oldest whole turns left out past it)")
    ] = 60_000
    # Context blocks of user messages (files, URLs) are expanded when a run is
    # assembled; these bound what one block may add to the model's input.
    file_max_bytes: Annotated[
        int, Meta(ge=1, description="bytes one file context block may add to the model's input")
    ] = 200_000
    url_max_bytes: Annotated[
        int, Meta(ge=1, description="bytes one URL context block may add to the model's input")
    ] = 200_000
    url_timeout_s: Annotated[float, Meta(gt=0, description="seconds each read of a URL context block may take")] = 5.0
    # The timeout above bounds each read, so a server trickling a byte every few
    # seconds could hold a run's assembly for ever: one URL's whole fetch
    # (resolving, connecting, redirects, the body) stops at the first deadline,
    # all URL blocks of one run's input together at the second; a URL past
    # either becomes an error block (orchestrator/run/url_fetch.py).
    url_fetch_deadline_s: Annotated[float, Meta(gt=0, description="seconds one URL's whole fetch may take")] = 10.0
    url_run_deadline_s: Annotated[
        float, Meta(gt=0, description="seconds all URL blocks of one run's input may take together")
    ] = 30.0
    # URL blocks are fetched by the host: by default never from loopback or
    # private addresses, so a chat message cannot probe the host's network.
    url_allow_private: Annotated[
        bool, Meta(description="whether URL blocks may be fetched from loopback and private addresses")
    ] = False
    # The longest instructions file (the installation's, a group's: orchestrator/run/instructions.py)
    # and the part of a group's MEMORY.md a run's system prompt carries (a longer one is cut,
    # and the run's notice says so).
    instructions_max_bytes: Annotated[
        int, Meta(ge=1, description="the longest instructions file (the installation's, a group's)")
    ] = 32 * 1024
    memory_max_bytes: Annotated[
        int, Meta(ge=1, description="the part of a group's MEMORY.md a run's system prompt carries")
    ] = 16 * 1024


class QuotaSettings(Section, kw_only=True):
    """Quotas of every group and of every sender, and the bounds on chats that are no group (orchestrator/store/usage.py, orchestrator/run/ingest.py)."""

    prefix: ClassVar[str] = ""

    # Quotas of every group (orchestrator/store/usage.py), on the database's clock;
    # a group may set its own (`orchestrator groups set JID --runs-per-hour N
    # --tokens-per-day N`).  Over one, new messages are stored and wait: the
    # next run starts when the quota frees, after a 🏠 message saying when.
    # Runs started in the last hour; 0: no limit.
    group_runs_per_hour: Annotated[int, Meta(ge=0, description="runs a group may start in an hour; 0: no limit")] = 0
    # Model tokens (input + output) of the runs started since 00:00 UTC; 0: no limit.
    group_tokens_per_day: Annotated[
        int, Meta(ge=0, description="model tokens a group's runs may use since 00:00 UTC; 0: no limit")
    ] = 0
    # Messages one sender may send into one chat in a minute, checked at ingest
    # (people only: not the harness's own senders, not is_from_me).  Over it
    # the message is refused, not stored (HTTP 429 with Retry-After; Telegram
    # replies "slow down").  0: no limit, the default: the tests, the
    # benchmarks and a single-user install send far more than any sensible
    # limit from one sender; an install open to strangers sets e.g. 20 (what
    # strangers' chats store is bounded either way: the two settings below).
    sender_messages_per_minute: Annotated[
        int, Meta(ge=0, description="messages one sender may send into one chat in a minute; 0: no limit")
    ] = 0
    # Chats that are no registered group (a Telegram chat or Slack channel no group is
    # attached to; any chat posted to with ORCHESTRATOR_API_REQUIRE_REGISTERED_CHAT=false):
    # their messages are stored but never wake an agent, within two bounds ingest keeps
    # for every channel (orchestrator/run/ingest.py).  How many such chats are kept: past
    # it, a chat not yet kept has its messages dropped, not stored (counted by the metric
    # orchestrator_unregistered_messages_dropped, logged once per chat) until one is
    # registered.  0: no limit.
    unregistered_chats: Annotated[
        int, Meta(ge=0, description="chats that are no registered group whose messages are kept; 0: no limit")
    ] = 100
    # How many of an unregistered chat's newest messages are kept: each new one deletes
    # the oldest past it, so a chat registered later starts with its recent messages as
    # context.  0: no limit.
    unregistered_chat_messages: Annotated[
        int, Meta(ge=0, description="newest messages kept per unregistered chat; 0: no limit")
    ] = 50
