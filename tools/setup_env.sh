#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment with the pinned stack.
#
# Idempotent: a complete environment whose pins have not changed is reused in
# a second or two. The first run on a machine builds mmcv 2.1.0 with its
# compiled ops from source against the pinned torch (about 25 minutes on 2
# cores); pip caches the built wheel, so later environments install in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
CONSTRAINTS=requirements/constraints.txt
STAMP="$VENV/.xcit-dense-stack"
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)

fingerprint=$(cat "$CONSTRAINTS" requirements/runtime.txt requirements/tests.txt requirements/deploy.txt setup.py | sha256sum | cut -c1-16)
if [ -x "$PY" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$fingerprint" ] \
   && "$PY" -c 'import mmcv.ops, mmdet, mmseg, timm, xcit_dense, onnxruntime' 2>/dev/null; then
  exit 0
fi

log() { echo "[setup_env] $*"; }
[ -x "$PY" ] || { log "creating $VENV with $PYTHON"; "$PYTHON" -m venv "$VENV"; }

log "installing torch and torchvision (pinned)"
"${PIP[@]}" install -q -c "$CONSTRAINTS" torch torchvision
# mmcv 2.1.0's setup.py imports pkg_resources (setuptools<81) and builds its
# C++ ops against the torch installed above (--no-build-isolation).
"${PIP[@]}" install -q -c "$CONSTRAINTS" setuptools wheel ninja
if ! "$PY" -c 'import mmcv.ops' 2>/dev/null; then
  log "installing mmcv with compiled ops (a source build the first time: ~25 min on 2 cores)"
  MAX_JOBS=${MAX_JOBS:-$(nproc)} "${PIP[@]}" install -c "$CONSTRAINTS" --no-build-isolation mmcv
  if ! "$PY" -c 'import mmcv.ops' 2>/dev/null; then
    # pip's wheel cache does not key on the torch version: a wheel built
    # against another torch fails to load mmcv._ext. Rebuild it.
    log "cached mmcv wheel does not load with this torch; rebuilding"
    MAX_JOBS=${MAX_JOBS:-$(nproc)} "${PIP[@]}" install -c "$CONSTRAINTS" --no-build-isolation \
      --no-cache-dir --force-reinstall --no-deps mmcv
  fi
fi

log "installing mmengine, mmdet, mmsegmentation, timm, the test tools and the deploy extra (onnx, onnxruntime, openvino)"
"${PIP[@]}" install -q -c "$CONSTRAINTS" -r requirements/runtime.txt -r requirements/tests.txt \
  -r requirements/deploy.txt
"${PIP[@]}" install -q -c "$CONSTRAINTS" --no-deps --no-build-isolation -e .
"$PY" -c 'import mmcv.ops, mmdet, mmseg, timm, xcit_dense'
echo "$fingerprint" > "$STAMP"
log "ready: $VENV"
