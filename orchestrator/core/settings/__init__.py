"""The settings: the only place that reads the environment.

Every value comes from an ``ORCHESTRATOR_*`` environment variable (a few of
OpenTelemetry's standard ``OTEL_*`` ones for traces) or an optional ``.env``
file in the working directory (:meth:`Settings.load`).
Everything the program writes lives under ``data_dir`` unless configured
otherwise, so one folder is the whole state of an embedded install.

``Settings`` holds the installation's own fields and a section per room
(``settings.gateway``, ``settings.sandbox``, ``settings.slack``, ...; ``whole.py``),
each a Struct of its module here; a component takes its section.  The variables keep
their flat names (``ORCHESTRATOR_GATEWAY_MAX_CONNECTIONS`` is ``gateway.max_connections``:
``section.py``), and docs/settings.md is made from these definitions (name, default,
bounds and each field's one line of meaning: ``scripts/settings_doc.py``).

Msgspec Structs, not pydantic-settings: every CLI command starts by loading
the settings, and importing pydantic-settings with pydantic and building this
model cost about 0.45 s of CPU, where msgspec costs about 0.06 s
(docs/performance.md, "CLI start-up").  msgspec converts the environment's
strings to the declared types and checks the bounds; python-dotenv reads the
``.env`` file.  Settings made in code (``Settings(...)``) are not converted,
like any Struct; :meth:`Settings.load` is the checked way in.
"""

from orchestrator.core.settings.channels import DeliverySettings, SlackSettings, TelegramSettings, WebhookSettings
from orchestrator.core.settings.env import ENV_PREFIX
from orchestrator.core.settings.fleet import FleetSettings
from orchestrator.core.settings.provider import GatewaySettings, ProviderSettings
from orchestrator.core.settings.runs import ContextSettings, QuotaSettings, RunSettings
from orchestrator.core.settings.sandbox import EgressSettings, SandboxSettings
from orchestrator.core.settings.section import Section
from orchestrator.core.settings.service import ApiSettings, FileSettings, TelemetrySettings
from orchestrator.core.settings.whole import Settings

__all__ = [
    "ENV_PREFIX",
    "ApiSettings",
    "ContextSettings",
    "DeliverySettings",
    "EgressSettings",
    "FileSettings",
    "FleetSettings",
    "GatewaySettings",
    "ProviderSettings",
    "QuotaSettings",
    "RunSettings",
    "SandboxSettings",
    "Section",
    "Settings",
    "SlackSettings",
    "TelegramSettings",
    "TelemetrySettings",
    "WebhookSettings",
]
