"""A group's profile: what it is in effect, the checks of a change, and the change.

A group's profile is what its row says of it besides its cursors: its name, trigger
rule and assistant name, its sandbox (``container_config``) and quotas, and its own
model (``provider:model`` as ``ORCHESTRATOR_MODEL`` spells it), output cap, thinking
budget, trigger names and optional tools, each of the last five None for the
installation's setting.  A group's trigger names replace the installation's
(``ORCHESTRATOR_ASSISTANT_NAME`` and ``ORCHESTRATOR_TRIGGER_ALIASES``) for that group;
its assistant name wakes it either way (``run/router.py``).

One function changes a profile for the API (``PATCH /api/groups/{chat_jid}``) and the
command line (``orchestrator groups set``), :func:`change_profile`:

* every value is checked first (:func:`check_changes`); a refusal is a ``BadInput``
  naming the field, and nothing changes.  A model must be spelled as
  ``ORCHESTRATOR_MODEL`` is, name a provider this installation is configured for
  (the setting its gateway upstream needs: ``sandbox/gateway/upstream.py``), and, for a
  provider that runs in an image variant (``claude-code``), that image must be on
  this host's engine already: it is never built from a request;
* the change is stored with one host message in the chat saying what changed (old
  -> new), in one transaction (``store/groups.py``: ``store_profile``), so every
  channel of the group delivers it as any other message;
* a change of the model in effect (provider or model id) starts the group's session
  afresh, as ``orchestrator groups reset`` does (``sandbox/sessions.py``), and the
  message says so.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import docker
from docker.errors import DockerException
from pydantic import BaseModel, Field

from agent_runner.protocol import OPTIONAL_TOOLS
from orchestrator.core import secrets
from orchestrator.core.errors import BadInput, ContainerConfigError, MountRefused, OrchestratorError, SandboxError
from orchestrator.core.settings import Settings
from orchestrator.model.messages import StoredMessage
from orchestrator.run.model_choice import MIN_THINKING_BUDGET, parse_model
from orchestrator.run.router import group_names
from orchestrator.sandbox.config import check_container_config
from orchestrator.sandbox.containers import docker_client
from orchestrator.sandbox.gateway import missing_setting
from orchestrator.sandbox.image import image_name, image_present
from orchestrator.sandbox.providers import PROVIDERS, spellings
from orchestrator.sandbox.sessions import reset_session
from orchestrator.store.db import Database
from orchestrator.store.groups import (
    GROUP_QUOTAS,
    MAX_QUOTA,
    PROFILE_COLUMNS,
    Group,
    GroupProfile,
    ProfileNote,
    get_group,
    group_profile,
    store_profile,
)

log = logging.getLogger(__name__)

# No whitespace or control character, spelled out: "\s" is another set in JSON Schema's ECMA
# regexes than in Python's and pydantic's Rust ones (U+0085, U+FEFF), so a client (or a fuzzer)
# reading the API's document would send what the server refuses.
SPACE_OR_CONTROL = r"\x00-\x20\x7f-\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
# A name the agent answers to is the trigger word after "@": no spaces or control characters, no "@".
NAME_PATTERN = rf"^[^@{SPACE_OR_CONTROL}]{{1,64}}$"
# A model as ORCHESTRATOR_MODEL spells it: no spaces or control characters (its words are
# checked by run/model_choice.py).
MODEL_PATTERN = rf"^[^{SPACE_OR_CONTROL}]{{1,200}}$"
MAX_NAME_CHARS = 200
# The trigger names a group may have of its own.
MAX_TRIGGER_NAMES = 16
_NAME = re.compile(NAME_PATTERN)
# Who may answer a group's questions: sender ids as channels give them.
MAX_APPROVERS = 64
IDENTITY_PATTERN = rf"^[^{SPACE_OR_CONTROL}]{{1,256}}$"
_IDENTITY = re.compile(IDENTITY_PATTERN)
_MODEL = re.compile(MODEL_PATTERN)

# How a change's host message names each field, in the order it lists them.
_LABELS = {
    "name": "name",
    "requires_trigger": "trigger required",
    "assistant_name": "assistant name",
    "trigger_names": "trigger names",
    "model": "model",
    "max_tokens": "max tokens",
    "thinking_budget": "thinking budget",
    "tools": "tools",
    "approvers": "approvers",
    "container_config": "sandbox",
    "runs_per_hour": "runs per hour",
    "tokens_per_day": "tokens per day",
}
assert set(_LABELS) == PROFILE_COLUMNS


# -- what is in effect ------------------------------------------------------------------------


class InEffect(BaseModel):
    """A group's model, names and tools as its runs get them: its own, or the installation's."""

    model: str = Field(description="The model, as ORCHESTRATOR_MODEL spells it (provider:model).")
    model_is_own: bool = Field(description="The model is the group's own (false: ORCHESTRATOR_MODEL).")
    max_tokens: int = Field(description="Output tokens of one model answer.")
    thinking_budget: int = Field(description="Tokens each answer may think with; 0: off, or the model does not think.")
    trigger_names: list[str] = Field(
        description="The names whose @Name wakes the group when it requires the trigger: its assistant name, "
        "then its own trigger names or the installation's."
    )
    tools: list[str] = Field(description="The optional tools its agent has.")


class Installation(BaseModel):
    """The installation's settings a group has while its own field is null (the web page shows
    them as each field's default)."""

    model: str = Field(description="ORCHESTRATOR_MODEL.")
    max_tokens: int = Field(description="ORCHESTRATOR_MAX_TOKENS.")
    thinking_budget: int = Field(description="ORCHESTRATOR_THINKING_BUDGET (0: off).")
    trigger_names: list[str] = Field(
        description="ORCHESTRATOR_ASSISTANT_NAME, then ORCHESTRATOR_TRIGGER_ALIASES: the names a group "
        "without its own trigger names wakes on (besides its own assistant name)."
    )
    tools: list[str] = Field(description="Every optional tool: a group without its own list has them all.")
    runs_per_hour: int = Field(description="ORCHESTRATOR_GROUP_RUNS_PER_HOUR (0: no limit).")
    tokens_per_day: int = Field(description="ORCHESTRATOR_GROUP_TOKENS_PER_DAY (0: no limit).")


class ProfileView(GroupProfile):
    """A group's profile as stored (its own settings; null: the installation's) and in effect."""

    in_effect: InEffect = Field(description="What the group's runs get: its own settings, else the installation's.")
    installation: Installation = Field(description="What each null field of the group's own gives.")


def installation(settings: Settings) -> Installation:
    """The installation's settings, as a group without its own has them."""
    return Installation(
        model=settings.provider.model.strip(),
        max_tokens=settings.provider.max_tokens,
        thinking_budget=settings.provider.thinking_budget,
        trigger_names=settings.trigger_names,
        tools=list(OPTIONAL_TOOLS),
        runs_per_hour=settings.quotas.group_runs_per_hour,
        tokens_per_day=settings.quotas.group_tokens_per_day,
    )


def in_effect(settings: Settings, group: Group) -> InEffect:
    own = group.model is not None
    spec = group.model if group.model is not None else settings.provider.model.strip()
    parsed = parse_model(spec)
    thinks = parsed is not None and PROVIDERS[parsed[0]].thinks
    thinking = settings.provider.thinking_budget if group.thinking_budget is None else group.thinking_budget
    return InEffect(
        model=spec,
        model_is_own=own,
        max_tokens=settings.provider.max_tokens if group.max_tokens is None else group.max_tokens,
        thinking_budget=thinking if thinks else 0,
        trigger_names=group_names(settings.trigger_names, group.assistant_name, group.trigger_names),
        tools=list(OPTIONAL_TOOLS) if group.tools is None else group.tools,
    )


def profile_view(db: Database, settings: Settings, chat_jid: str) -> ProfileView:
    """The group's profile with what is in effect; UnknownGroup for a chat that is no group."""
    profile = group_profile(db, chat_jid)
    return ProfileView(
        **profile.model_dump(), in_effect=in_effect(settings, profile), installation=installation(settings)
    )


# -- checking a change --------------------------------------------------------------------------

ImageCheck = Callable[[str], bool]


def docker_image_check(settings: Settings) -> ImageCheck:
    """Whether an image variant is on this host's engine (a client is made on first use)."""

    def present(variant: str) -> bool:
        return image_present(docker_client(settings), settings, variant)

    return present


def check_changes(
    settings: Settings, group: Group, changes: Mapping[str, object], *, image_exists: ImageCheck
) -> dict[str, object]:
    """``changes`` to ``group``'s profile as they are stored, each value checked; raises
    BadInput naming the first field refused.  ``image_exists`` says whether an image
    variant is on this host (asked only for a model that runs in one)."""
    checked: dict[str, object] = {}
    for key, value in changes.items():
        if key not in PROFILE_COLUMNS:
            raise BadInput(key, f"{key}: a group's {key} cannot be changed")
        checked[key] = _checked(settings, group, key, value, image_exists)
    if {"model", "max_tokens", "thinking_budget"} & set(changes):
        _check_thinking(settings, group.model_copy(update=checked), changes)
    return checked


def _checked(settings: Settings, group: Group, key: str, value: object, image_exists: ImageCheck) -> object:
    if key == "name":
        if not isinstance(value, str) or not value.strip() or len(value) > MAX_NAME_CHARS or "\x00" in value:
            raise BadInput(key, f"name: a group's name is 1 to {MAX_NAME_CHARS} characters, not empty")
        return value
    if key == "requires_trigger":
        if not isinstance(value, bool):
            raise BadInput(key, "requires_trigger: true or false")
        return value
    if key == "container_config":
        return _container_config(settings, group, value)
    if value is None:
        return None  # back to the installation's
    if key == "assistant_name":
        return _name(key, value)
    if key in GROUP_QUOTAS:
        return _whole(key, value, 0, "0 (no limit)")
    if key == "model":
        return _model(settings, value, image_exists)
    if key == "max_tokens":
        return _whole(key, value, 1, "1")
    if key == "thinking_budget":
        return _whole(key, value, 0, "0 (off)")
    if key == "trigger_names":
        return _trigger_names(value)
    if key == "approvers":
        return _approvers(value)
    assert key == "tools"
    return _tools(value)


def _container_config(settings: Settings, group: Group, value: object) -> object:
    """The sandbox's checks (sandbox/config.py), their refusals named by the field they are about."""
    raw: Any = value
    try:
        return check_container_config(settings, group, raw)
    except ContainerConfigError as exc:
        raise BadInput("container_config", str(exc)) from exc
    except MountRefused as exc:
        raise BadInput("container_config.extra_mounts", str(exc)) from exc


def _whole(key: str, value: object, low: int, shown: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_QUOTA:
        raise BadInput(key, f"{key}: a whole number from {shown} to {MAX_QUOTA}, or null for the installation's")
    return value


def _name(key: str, value: object) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise BadInput(key, f"{key}: a name is 1 to 64 characters, no spaces, control characters or '@'")
    return value


def _trigger_names(value: object) -> list[str]:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_TRIGGER_NAMES:
        raise BadInput(
            "trigger_names",
            f"trigger_names: a list of 1 to {MAX_TRIGGER_NAMES} names, or null for the installation's",
        )
    names: dict[str, str] = {}
    for name in value:
        # The trigger ignores case: "Bee" and "bee" are one name, kept as first written.
        names.setdefault(_name("trigger_names", name).casefold(), name)
    return list(names.values())


def _approvers(value: object) -> list[str]:
    """Who may answer the group's questions: platform identities (the sender ids its channels
    give: slack:<user id>, tg:<user id>), each once."""
    if (
        not isinstance(value, list)
        or not 1 <= len(value) <= MAX_APPROVERS
        or not all(isinstance(v, str) and _IDENTITY.fullmatch(v) for v in value)
    ):
        raise BadInput(
            "approvers",
            f"approvers: a list of 1 to {MAX_APPROVERS} sender ids (no spaces or control characters), "
            "or null for anyone in the chat",
        )
    return list(dict.fromkeys(value))


def _tools(value: object) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise BadInput("tools", f"tools: a list of {', '.join(OPTIONAL_TOOLS)} (any of them), or null for all")
    unknown = [t for t in value if t not in OPTIONAL_TOOLS]
    if unknown:
        raise BadInput(
            "tools", f"tools: {unknown[0]!r} is no optional tool; the optional tools are {', '.join(OPTIONAL_TOOLS)}"
        )
    return [t for t in OPTIONAL_TOOLS if t in value]


def _model(settings: Settings, value: object, image_exists: ImageCheck) -> str:
    spec = value.strip() if isinstance(value, str) else ""
    parsed = parse_model(spec) if _MODEL.fullmatch(spec) else None
    if parsed is None:
        raise BadInput("model", f"model: {value!r} is not a model; use {spellings()}")
    provider = parsed[0]
    facts = PROVIDERS[provider]
    if facts.gateway is not None and (missing := missing_setting(settings.provider, facts.gateway)) is not None:
        raise BadInput("model", f"model: {provider} is not configured on this installation ({missing} is not set)")
    if facts.image_variant is not None:
        image = image_name(settings, facts.image_variant)
        try:
            present = image_exists(facts.image_variant)
        except (SandboxError, DockerException) as exc:
            raise BadInput("model", f"model: cannot tell whether the image {image} is built: {exc}") from exc
        if not present:
            raise BadInput(
                "model",
                f"model: {provider} runs in the image {image}, which is not built on this host; run "
                f"`orchestrator image build --variant {facts.image_variant}` first",
            )
    return spec


def _check_thinking(settings: Settings, after: Group, changes: Mapping[str, object]) -> None:
    """The model, output cap and thinking budget in effect after a change fit together."""
    view = in_effect(settings, after)
    parsed = parse_model(view.model)
    thinks = parsed is not None and PROVIDERS[parsed[0]].thinks
    if changes.get("thinking_budget") and not thinks:
        thinkers = ", ".join(name for name, facts in PROVIDERS.items() if facts.thinks)
        raise BadInput(
            "thinking_budget",
            f"thinking_budget: the group's model {view.model} does not think; a thinking budget is for {thinkers}",
        )
    budget = view.thinking_budget
    if budget and not MIN_THINKING_BUDGET <= budget < view.max_tokens:
        field = next(k for k in ("thinking_budget", "max_tokens", "model") if k in changes)
        raise BadInput(
            field,
            f"{field}: a thinking budget of {budget} with max tokens {view.max_tokens}: the budget must be at "
            f"least {MIN_THINKING_BUDGET} and below max tokens, which bounds thinking and answer together",
        )


# -- what a change tells the chat ---------------------------------------------------------------


def _installation(settings: Settings, key: str) -> str:
    """The installation's setting of ``key``, as a change's message shows it."""
    values: dict[str, object] = {
        "assistant_name": settings.assistant_name,
        "trigger_names": settings.trigger_names,
        "model": settings.provider.model.strip(),
        "max_tokens": settings.provider.max_tokens,
        "thinking_budget": settings.provider.thinking_budget,
        "tools": list(OPTIONAL_TOOLS),
        "approvers": "anyone in the chat",
        "container_config": None,
        "runs_per_hour": settings.quotas.group_runs_per_hour,
        "tokens_per_day": settings.quotas.group_tokens_per_day,
    }
    if key == "container_config":
        return "the installation's"
    return f"the installation's ({_shown(key, values[key])})"


def _shown(key: str, value: object) -> str:
    if key == "requires_trigger":
        return "yes" if value else "no"
    if key == "trigger_names" and isinstance(value, list):
        return ", ".join(f"@{name}" for name in value) or "none"
    if key in ("tools", "approvers") and isinstance(value, list):
        return ", ".join(str(t) for t in value) or "none"
    if key in GROUP_QUOTAS and value == 0:
        return "no limit"
    if key == "thinking_budget" and value == 0:
        return "off"
    if key == "container_config":
        return json.dumps(value, sort_keys=True)
    if key == "name":
        return json.dumps(value, ensure_ascii=False)
    return f"{value:,}" if isinstance(value, int) else str(value)


def profile_note(settings: Settings, before: Group, after: Group) -> ProfileNote:
    """The host message of a change of a group's profile (``before`` -> ``after``): each
    field that changed, old -> new; a change of the model in effect forgets the session."""
    changed = []
    for key, label in _LABELS.items():
        old, new = getattr(before, key), getattr(after, key)
        if old == new:
            continue
        old_text = _installation(settings, key) if old is None else _shown(key, old)
        new_text = _installation(settings, key) if new is None else _shown(key, new)
        changed.append(f"{label} {old_text} -> {new_text}")
    if not changed:
        return ProfileNote(None)
    fresh = in_effect(settings, before).model != in_effect(settings, after).model
    text = "⚙️ This group's settings changed: " + "; ".join(changed) + "."
    if fresh:
        text += " The model changed: the group's session starts afresh."
    return ProfileNote(secrets.redact(text), forget_session=fresh)


# -- the change ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProfileChanged:
    group: Group  # as changed
    message: StoredMessage | None  # the host message (None: nothing changed)
    new_session: bool  # the model changed: the session was forgotten
    stopped: int  # the group's warm containers stopped with it


def change_profile(
    db: Database,
    settings: Settings,
    chat_jid: str,
    changes: Mapping[str, object],
    *,
    image_exists: ImageCheck | None = None,
    client: docker.DockerClient | None = None,
    signal_delivery: Callable[[str], object] | None = None,
) -> ProfileChanged:
    """Check and make ``changes`` to the group's profile, with its host message (see the
    module's doc).  Raises UnknownGroup, or BadInput (nothing changed).

    ``image_exists``: whether an image variant is on this host (default: asked of Docker);
    ``client``: the Docker client a new session's reset stops the warm container with
    (default: made then); ``signal_delivery``: signals a deliverer for the chat after the
    commit (a signal that cannot be sent is left to the sweeper)."""
    group = get_group(db, chat_jid)
    checked = check_changes(settings, group, changes, image_exists=image_exists or docker_image_check(settings))
    stored = store_profile(db, chat_jid, checked, note=lambda before, after: profile_note(settings, before, after))
    stopped = 0
    if stored.note.forget_session:
        try:
            # As `orchestrator groups reset`: the warm container stopped, the session folder
            # removed (the session id went with the change, in its transaction).
            stopped = reset_session(db, settings, chat_jid, client)
        except (OrchestratorError, DockerException) as exc:
            # The id is gone already: the next run starts a new session whatever is left.
            log.warning("%s: the model changed, but its warm container or session folder stays: %s", chat_jid, exc)
    if stored.message is not None and signal_delivery is not None:
        try:
            signal_delivery(chat_jid)
        except Exception as exc:  # noqa: BLE001 - the sweeper signals due deliveries
            log.warning("could not signal a deliverer for %s (%s); the sweeper will", chat_jid, exc)
    return ProfileChanged(stored.group, stored.message, stored.note.forget_session, stopped)
