#!/usr/bin/env bash
# Start a real vLLM (CPU build) on loopback with every observability output turned on.
# Runs in the foreground (exec); start it with `setsid scripts/vllm/serve.sh &` and stop it
# by killing its process group.
#
#   VLLM_VENV            venv made by setup.sh              (default /opt/vllm-venv)
#   VLLM_MODEL_DIR       tiny model made by setup.sh        (default /opt/vllm-tiny-model)
#   VLLM_PORT            HTTP port on 127.0.0.1             (default 18000)
#   VLLM_BLOCK_SIZE      KV block size in tokens            (default 128)
#   VLLM_NUM_BLOCKS      --num-gpu-blocks-override          (default 128 = ample; ~24 starves)
#   VLLM_MAX_MODEL_LEN   --max-model-len                    (default 2560; must fit in NUM_BLOCKS*BLOCK_SIZE)
#   VLLM_OTLP_ENDPOINT   --otlp-traces-endpoint             (default http://127.0.0.1:14317; '' = off)
#   VLLM_OTLP_PROTOCOL   grpc | http/protobuf               (default grpc; for http use
#                        VLLM_OTLP_ENDPOINT=http://127.0.0.1:14318/v1/traces)
#   VLLM_KV_EVENTS_ENDPOINT  ZMQ endpoint of the KV-event publisher (default
#                        tcp://127.0.0.1:15557: no '*', so vLLM *connects* to a SUB that binds
#                        there, as capture.py does by default; 'tcp://*:PORT' makes vLLM bind)
#   VLLM_KV_EVENTS_TOPIC topic string                        (default kv-events)
#   VLLM_SERVED_NAME     --served-model-name                 (default tiny-llama)
#   VLLM_CMD_OUT         if set, the full command line + env is written to this file
#   VLLM_EXTRA_ARGS      appended verbatim
set -euo pipefail
VLLM_VENV="${VLLM_VENV:-/opt/vllm-venv}"
VLLM_MODEL_DIR="${VLLM_MODEL_DIR:-/opt/vllm-tiny-model}"
VLLM_PORT="${VLLM_PORT:-18000}"
VLLM_BLOCK_SIZE="${VLLM_BLOCK_SIZE:-128}"
VLLM_NUM_BLOCKS="${VLLM_NUM_BLOCKS:-128}"
VLLM_MAX_MODEL_LEN="${VLLM_MAX_MODEL_LEN:-2560}"
VLLM_OTLP_ENDPOINT="${VLLM_OTLP_ENDPOINT-http://127.0.0.1:14317}"
VLLM_OTLP_PROTOCOL="${VLLM_OTLP_PROTOCOL:-grpc}"
VLLM_KV_EVENTS_ENDPOINT="${VLLM_KV_EVENTS_ENDPOINT:-tcp://127.0.0.1:15557}"
VLLM_KV_EVENTS_TOPIC="${VLLM_KV_EVENTS_TOPIC:-kv-events}"
VLLM_SERVED_NAME="${VLLM_SERVED_NAME:-tiny-llama}"

export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
# Stable block hashes across restarts (NONE_HASH is seeded from PYTHONHASHSEED).
export PYTHONHASHSEED="${PYTHONHASHSEED:-0}"
export OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="$VLLM_OTLP_PROTOCOL"

args=(
  "$VLLM_VENV/bin/python" -m vllm.entrypoints.openai.api_server
  --model "$VLLM_MODEL_DIR"
  --served-model-name "$VLLM_SERVED_NAME"
  --host 127.0.0.1 --port "$VLLM_PORT"
  --max-model-len "$VLLM_MAX_MODEL_LEN"
  --enable-prompt-tokens-details
  --block-size "$VLLM_BLOCK_SIZE"
  --num-gpu-blocks-override "$VLLM_NUM_BLOCKS"
  --kv-cache-metrics --kv-cache-metrics-sample 1.0
  --kv-events-config "{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", \"endpoint\": \"$VLLM_KV_EVENTS_ENDPOINT\", \"topic\": \"$VLLM_KV_EVENTS_TOPIC\"}"
)
if [ -n "$VLLM_OTLP_ENDPOINT" ]; then
  args+=(--otlp-traces-endpoint "$VLLM_OTLP_ENDPOINT")
fi
# shellcheck disable=SC2206
[ -n "${VLLM_EXTRA_ARGS:-}" ] && args+=($VLLM_EXTRA_ARGS)

if [ -n "${VLLM_CMD_OUT:-}" ]; then
  {
    echo "# env"
    for v in VLLM_CPU_KVCACHE_SPACE HF_HUB_OFFLINE TRANSFORMERS_OFFLINE PYTHONHASHSEED OTEL_EXPORTER_OTLP_TRACES_PROTOCOL; do
      echo "$v=${!v}"
    done
    echo "# command"
    printf '%q ' "${args[@]}"; echo
    echo "# versions"
    "$VLLM_VENV/bin/python" -c 'import importlib.metadata as m
for p in ("vllm-cpu","torch","transformers","opentelemetry-sdk","opentelemetry-exporter-otlp-proto-grpc","pyzmq","msgspec","prometheus_client"):
    print(p, m.version(p))' 2>/dev/null || true
  } > "$VLLM_CMD_OUT"
fi
echo "[serve] ${args[*]}" >&2
exec "${args[@]}"
