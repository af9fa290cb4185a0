# The orchestrator's own service image (api, worker, flower in compose.yaml).
# Not the agent sandbox: that is container/Dockerfile.
#
# BASE_IMAGE: any Debian-like image with Python >= 3.11 and pip.  PIP_NO_INDEX,
# PIP_FIND_LINKS: pip's own settings, for a build with no PyPI from a
# wheelhouse in the base (scripts/compose-standins.sh); unset, pip uses PyPI.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}
ARG PIP_NO_INDEX
ARG PIP_FIND_LINKS
WORKDIR /app
COPY pyproject.toml README.md ./
COPY orchestrator/ orchestrator/
COPY workers/ workers/
COPY container/ container/
# Editable, so the worker finds container/ to build the agent image from; the
# otlp extra, so OTEL_TRACES_EXPORTER=otlp works in compose.
RUN pip install --no-cache-dir -e '.[otlp]'
ENV PYTHONUNBUFFERED=1
ENTRYPOINT ["orchestrator"]
