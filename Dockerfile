# The orchestrator's own service image (api, worker, flower in compose.yaml).
# Not the agent sandbox: that is container/Dockerfile.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY orchestrator/ orchestrator/
COPY workers/ workers/
COPY container/ container/
# Editable, so the worker finds container/ to build the agent image from.
RUN pip install --no-cache-dir -e .
ENV PYTHONUNBUFFERED=1
ENTRYPOINT ["orchestrator"]
