"""The model providers' two tables: the host's facts (orchestrator/sandbox/providers.py)
and the runner's builders (container/agent_runner/provider_registry.py).

Every name the protocol allows (``ModelSettings.provider``) has exactly one row on each
side, and what the host does for a provider follows its row: how ``ORCHESTRATOR_MODEL``
spells it, whether it thinks, which gateway upstream it gets, its image variant, its
session folder and whether images go to it as blocks.  On the runner's side, a turn-loop row builds its provider, an
own-loop row is no provider of the built-in loop, and a run goes to its row.
"""

from __future__ import annotations

from pathlib import Path
from typing import get_args, get_type_hints

import msgspec
import pytest

from agent_runner import one_run
from agent_runner import provider_registry as runner
from agent_runner.protocol import ErrorEvent, Event, ModelSettings
from orchestrator.core.errors import ConfigError
from orchestrator.core.settings import Settings
from orchestrator.run.model_choice import model_settings
from orchestrator.run.run_files import sees_images
from orchestrator.sandbox import providers as host
from orchestrator.sandbox.gateway import UPSTREAMS, ModelGateway
from orchestrator.sandbox.image import VARIANTS, model_variant, settings_variant
from orchestrator.sandbox.sessions import keeps_session

NAMES: tuple[str, ...] = get_args(get_type_hints(ModelSettings)["provider"])


def _settings(tmp_path: Path, **kw: object) -> Settings:
    return Settings.load(data_dir=tmp_path / "data", env_file=None, **kw)  # type: ignore[arg-type]


def test_every_provider_has_exactly_one_row_on_each_side() -> None:
    assert NAMES == ("offline", "anthropic", "openai", "claude-code")
    assert get_args(host.ProviderName) == NAMES == get_args(runner.ProviderName)
    # A mapping has one row per key: the keys are the names, each once.
    assert tuple(host.PROVIDERS) == NAMES
    assert tuple(runner.PROVIDERS) == NAMES


def test_each_row_names_an_upstream_and_a_variant_that_exist() -> None:
    assert tuple(UPSTREAMS) == get_args(host.GatewayRoute)
    routes = {facts.gateway for facts in host.PROVIDERS.values()} - {None}
    assert routes == set(UPSTREAMS), "a gateway upstream no provider uses"
    variants = {facts.image_variant for facts in host.PROVIDERS.values()} - {None}
    assert variants == set(VARIANTS), "an image variant no provider runs, or a provider's variant that is not built"


@pytest.mark.parametrize("name", NAMES)
def test_orchestrator_model_spells_each_provider_as_its_row_says(tmp_path: Path, name: str) -> None:
    facts = host.PROVIDERS[name]
    spec = host.model_spec(name, "m-1")
    assert spec == (f"{name}:m-1" if facts.takes_model_id else name)
    assert host.split_spec(spec) == (name, "m-1" if facts.takes_model_id else "")
    chosen = model_settings(_settings(tmp_path, model=spec, max_tokens=2048, thinking_budget=1024))
    assert (chosen.provider, chosen.model, chosen.max_tokens) == (
        name,
        "m-1" if facts.takes_model_id else name,
        2048,
    )
    assert chosen.thinking_budget == (1024 if facts.thinks else msgspec.UNSET)
    wrong = f"{name}:" if facts.takes_model_id else f"{name}:m-1"
    with pytest.raises(ConfigError, match=f"ORCHESTRATOR_MODEL='{wrong}': use 'offline', 'anthropic:<model id>'"):
        model_settings(_settings(tmp_path, model=wrong))


def test_a_word_that_names_no_provider_is_refused_and_has_no_row(tmp_path: Path) -> None:
    assert host.spellings() == "'offline', 'anthropic:<model id>', 'openai:<model id>' or 'claude-code:<model id>'"
    with pytest.raises(ConfigError, match="ORCHESTRATOR_MODEL='gemini:pro'"):
        model_settings(_settings(tmp_path, model="gemini:pro"))
    assert host.provider_named("gemini") is None and host.facts_of("gemini") is None
    assert model_variant("gemini") is None and not keeps_session("gemini")
    assert host.model_spec("gemini", "pro") == "gemini:pro"


@pytest.mark.parametrize("name", NAMES)
def test_the_sandbox_reads_each_providers_row(tmp_path: Path, name: str) -> None:
    facts = host.PROVIDERS[name]
    assert model_variant(name) == facts.image_variant
    assert settings_variant(_settings(tmp_path, model=host.model_spec(name, "m-1"))) == facts.image_variant
    assert keeps_session(name) is facts.keeps_session
    settings = _settings(
        tmp_path,
        model=host.model_spec(name, "m-1"),
        anthropic_base_url="http://127.0.0.1:1/anthropic",
        anthropic_api_key="a-key",
        openai_base_url="http://127.0.0.1:1/openai",
        openai_api_key="o-key",
    )
    sock = tmp_path / "g" / "model.sock"
    if facts.gateway is None:
        with pytest.raises(ValueError, match=f"no model gateway for provider '{name}'"):
            ModelGateway.for_provider(sock, settings, name)
        return
    upstream = UPSTREAMS[facts.gateway]
    with ModelGateway.for_provider(sock, settings, name) as gw:
        assert gw.config.base_url == f"http://127.0.0.1:1/{facts.gateway}"
        assert (gw.config.paths, gw.config.model) == (upstream.paths, "m-1")
        assert upstream.api_key(settings.provider) == {"anthropic": "a-key", "openai": "o-key"}[facts.gateway]


@pytest.mark.parametrize("name", NAMES)
def test_the_runner_builds_each_provider_as_its_row_says(name: str) -> None:
    row = runner.PROVIDERS[name]
    settings = ModelSettings(provider=name, model="m-1", socket_path="/run/gateway/model.sock")  # type: ignore[arg-type]
    if isinstance(row, runner.OwnLoop):
        with pytest.raises(ValueError, match="not a provider of the built-in loop"):
            runner.make_provider(settings, assistant_name="Andy")
        return
    built = runner.make_provider(settings, assistant_name="Andy")
    assert type(built).__module__.startswith("agent_runner.providers.") and callable(built.complete)


def test_a_run_goes_to_its_providers_row(tmp_path: Path) -> None:
    # The offline model answers through the runner's turn loop; claude-code's own loop
    # is reached (it refuses an input with no way to the model before it needs its SDK).
    def run_with(provider: str) -> tuple[int, list[Event]]:
        doc = {
            "run_id": "run-1",
            "chat_jid": "chat@test",
            "group_folder": "g",
            "assistant_name": "Andy",
            "messages": [{"role": "user", "content": "hello"}],
            "model": {"provider": provider, "model": "m-1"},
        }
        events: list[Event] = []
        code = one_run.run(msgspec.json.encode(doc), events.append, tmp_path)
        return code, events

    code, events = run_with("offline")
    assert code == one_run.EXIT_OK
    assert [type(e).__name__ for e in events] == ["AssistantEvent", "ResultEvent"]
    code, events = run_with("claude-code")
    assert code == one_run.EXIT_BAD_INPUT
    [error] = events
    assert isinstance(error, ErrorEvent) and "the claude-code provider needs the gateway's socket_path" in error.message


@pytest.mark.parametrize("name", NAMES)
def test_images_go_as_blocks_to_the_providers_whose_row_takes_them(tmp_path: Path, name: str) -> None:
    chosen = ModelSettings(provider=name, model="m-1")  # type: ignore[arg-type]
    assert sees_images(_settings(tmp_path, vision_models="m-*"), chosen) is host.PROVIDERS[name].image_blocks
    assert not sees_images(_settings(tmp_path, vision_models="other-*"), chosen)
