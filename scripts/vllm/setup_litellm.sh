#!/usr/bin/env bash
# Create the LiteLLM proxy virtualenv (outside the repo) used by e2e.py's `litellm` config. Idempotent.
#
#   LITELLM_VENV     venv path             (default /opt/litellm-venv)
#   LITELLM_SPEC     pip requirement        (default 'litellm[proxy]')
#
# The OpenTelemetry SDK and OTLP exporters are installed beside it: LiteLLM's `otel` callback
# imports them but `litellm[proxy]` does not pull them.
set -euo pipefail
LITELLM_VENV="${LITELLM_VENV:-/opt/litellm-venv}"
LITELLM_SPEC="${LITELLM_SPEC:-litellm[proxy]}"
PY="$LITELLM_VENV/bin/python"
t0=$(date +%s)
[ -x "$PY" ] || python3 -m venv "$LITELLM_VENV"
if ! "$PY" -c 'import litellm.proxy.proxy_server, opentelemetry.sdk, opentelemetry.exporter.otlp.proto.http' 2>/dev/null; then
  echo "[setup_litellm] installing $LITELLM_SPEC + OpenTelemetry SDK into $LITELLM_VENV (a few minutes)" >&2
  "$PY" -m pip install -q "$LITELLM_SPEC" opentelemetry-sdk opentelemetry-exporter-otlp-proto-http \
      opentelemetry-exporter-otlp-proto-grpc
fi
"$PY" -c 'import importlib.metadata as m; print("[setup_litellm] litellm", m.version("litellm"), "opentelemetry-sdk", m.version("opentelemetry-sdk"))' >&2
echo "[setup_litellm] $(( $(date +%s) - t0 ))s" >&2
