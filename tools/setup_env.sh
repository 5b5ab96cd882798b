#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment with the pinned stack.
#
# Idempotent: a complete environment whose pins have not changed is reused in
# a second or two. The first run on a machine builds mmcv 2.1.0 with its
# compiled ops from source against the pinned torch (about 25 minutes on 2
# cores); pip caches the built wheel, so later environments install in seconds.
#
# With an NVIDIA GPU (tools/cuda_setup.py decides): mmcv is built with its CUDA
# ops for the GPUs present (TORCH_CUDA_ARCH_LIST), by the system's CUDA
# compiler when its version matches PyTorch's, else by the registry's
# (cuda-toolkit, the release PyTorch was built with). The build lives in
# build/mmcv-*, so an interrupted one resumes. Then RoIAlign and NMS must run
# on a CUDA tensor, or the set-up stops saying what is missing.
# FORCE_CUDA=0 sets up for the CPU; FORCE_CUDA=1 with TORCH_CUDA_ARCH_LIST
# builds the CUDA ops on a machine without a GPU.
#
# Offline: WHEELHOUSE=DIR installs from a folder made by `make wheelhouse` on
# a machine with network, against the PyTorch of $PYTHON (SYSTEM_TORCH=1 does
# that online too); that PyTorch must be in requirements/runtime.txt's range
# and stays as it is (pinned at its installed version). $PYTHON may itself
# be a virtual environment's (tools/cuda_setup.py venv). On a GPU node, an
# mmcv built once for the cluster and added to the wheelhouse (`make
# wheelhouse`, or `make wheelhouse-mmcv` offline on the node that built it)
# is installed instead of the build when its description matches PyTorch,
# CUDA, the GPUs and Python here, and its ops pass the check.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
CONSTRAINTS=requirements/constraints.txt
STAMP="$VENV/.xcit-dense-stack"
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)
WHEELHOUSE=${WHEELHOUSE:-}
SYSTEM_TORCH=${SYSTEM_TORCH:-}
[ -n "$WHEELHOUSE" ] && SYSTEM_TORCH=1
SOURCES=()
[ -n "$WHEELHOUSE" ] && SOURCES=(--no-index --find-links "$WHEELHOUSE")

# the GPUs present are part of what was set up (a CPU build of mmcv has no
# CUDA ops)
gpus=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null \
       | sort -u | tr '\n' ' ' || true)
fingerprint=$( (cat "$CONSTRAINTS" requirements/runtime.txt requirements/tests.txt \
  requirements/deploy.txt setup.py
  echo "gpus=$gpus system_torch=$SYSTEM_TORCH${SYSTEM_TORCH:+ python=$PYTHON} force_cuda=${FORCE_CUDA:-}") \
  | sha256sum | cut -c1-16)
if [ -x "$PY" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$fingerprint" ] \
   && "$PY" -c 'import mmcv.ops, mmdet, mmseg, timm, xcit_dense, onnxruntime' 2>/dev/null; then
  exit 0
fi

log() { echo "[setup_env] $*"; }
if [ -n "$SYSTEM_TORCH" ]; then
  # pip must not replace the PyTorch that is there: its stack's pins go
  "$PYTHON" -c 'import torch' 2>/dev/null || {
    log "$PYTHON has no PyTorch. With WHEELHOUSE or SYSTEM_TORCH=1 the set-up" \
        "installs against the PyTorch of PYTHON (the wheelhouse holds none):" \
        "point PYTHON at the Python of your PyTorch installation."
    exit 1; }
  # `$PYTHON -m venv --system-site-packages` when $PYTHON is a system or
  # conda Python; when it is a virtual environment's, that would not see its
  # packages, and a .pth file adds them (see make_venv in setup_env/venv.py)
  "$PYTHON" tools/cuda_setup.py venv "$VENV"
  "$PY" tools/cuda_setup.py torch
  # the pins less PyTorch's stack, and torch, torchvision and triton at the
  # versions installed: pip keeps them, or fails, but never replaces them
  "$PY" tools/cuda_setup.py system-constraints "$CONSTRAINTS" \
    "$VENV/constraints-system-torch.txt"
  CONSTRAINTS="$VENV/constraints-system-torch.txt"
else
  [ -x "$PY" ] || { log "creating $VENV with $PYTHON"; "$PYTHON" -m venv "$VENV"; }
  log "installing torch and torchvision (pinned)"
  "${PIP[@]}" install -q "${SOURCES[@]}" -c "$CONSTRAINTS" torch torchvision
fi
# mmcv 2.1.0's setup.py imports pkg_resources (setuptools<81) and builds its
# C++ ops against the torch installed above (--no-build-isolation).
"${PIP[@]}" install -q "${SOURCES[@]}" -c "$CONSTRAINTS" setuptools wheel ninja

plan=$("$PY" tools/cuda_setup.py plan) || exit 1
ARCHS='' TORCH_CUDA='' CUDA_WHEELS=''
eval "$plan"
mmcv_version=$(sed -n 's/^mmcv==//p' requirements/constraints.txt)

# An mmcv wheel with CUDA ops in place of any mmcv there (a CPU build has the
# same version), then its dependencies (mmengine, opencv, ...): mmcv.ops, and
# so the check, imports them, and the stack's install comes later.
install_mmcv_wheel() {
  "${PIP[@]}" install -q --no-deps --force-reinstall "$1" &&
    "${PIP[@]}" install -q "${SOURCES[@]}" -c "$CONSTRAINTS" "$1"
}

# A prebuilt mmcv with CUDA ops from the wheelhouse (below mmcv-cuda/, made
# by `make wheelhouse` where it was built): the first whose description
# (WHEEL.json) is for this PyTorch, CUDA, GPUs and Python, if its ops pass
# the check. Otherwise one line says why not, and mmcv is built.
install_prebuilt() {
  [ -n "$WHEELHOUSE" ] || return 1
  local wheel reason
  wheel=$("$PY" tools/cuda_setup.py prebuilt "$WHEELHOUSE") || return 1
  log "installing the prebuilt $wheel"
  install_mmcv_wheel "$wheel" || return 1
  reason=$("$PY" tools/cuda_setup.py check 2>&1) && return 0
  reason=${reason##*$'\n'} reason=${reason%%. *}  # last line, first sentence
  log "the prebuilt $wheel fails the check (${reason#\[setup_env\] }):" \
      "building mmcv"
  return 1
}

if [ -n "$ARCHS" ]; then
  if ! "$PY" tools/cuda_setup.py check >/dev/null 2>&1 && ! install_prebuilt; then
    if [ -n "$CUDA_WHEELS" ]; then
      log "no system CUDA compiler matches PyTorch's CUDA $TORCH_CUDA;" \
          "installing $CUDA_WHEELS from the package registry"
      "${PIP[@]}" install -q "${SOURCES[@]}" -c "$CONSTRAINTS" "$CUDA_WHEELS"
      CUDA_HOME=$("$PY" tools/cuda_setup.py cuda-home)
      export LIBRARY_PATH="$CUDA_HOME/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
    fi
    export CUDA_HOME
    src="build/mmcv-$mmcv_version-cuda$TORCH_CUDA-arch${ARCHS//[.; ]/_}"
    if [ ! -f "$src/setup.py" ]; then
      "${PIP[@]}" download -q "${SOURCES[@]}" --no-deps --no-binary :all: \
        --no-build-isolation -d build/sdist "mmcv==$mmcv_version"
      mkdir -p "$src"
      tar xzf "build/sdist/mmcv-$mmcv_version.tar.gz" -C "$src" --strip-components=1
    fi
    log "building mmcv $mmcv_version with CUDA ops for TORCH_CUDA_ARCH_LIST=$ARCHS" \
        "with $CUDA_HOME/bin/nvcc, in $src (an interrupted build resumes there)"
    py_abs="$(cd "$VENV/bin" && pwd)/python"
    (cd "$src" && FORCE_CUDA=1 MMCV_WITH_OPS=1 TORCH_CUDA_ARCH_LIST="$ARCHS" \
       MAX_JOBS=${MAX_JOBS:-$(nproc)} "$py_abs" setup.py -q bdist_wheel -d dist)
    wheel=$(ls "$src"/dist/mmcv-*.whl)
    # what it is built for, in $wheel.json: `make wheelhouse` adds both to
    # the wheelhouse, for the cluster's other nodes
    "$PY" tools/cuda_setup.py describe "$wheel" "$ARCHS" >/dev/null
    install_mmcv_wheel "$wheel"
  fi
  if "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
    "$PY" tools/cuda_setup.py check || exit 1
  else
    log "FORCE_CUDA=1 without a GPU: mmcv's CUDA ops built for $ARCHS, not run here"
  fi
elif ! "$PY" -c 'import mmcv.ops' 2>/dev/null; then
  log "installing mmcv with compiled ops (a source build the first time: ~25 min on 2 cores)"
  MAX_JOBS=${MAX_JOBS:-$(nproc)} "${PIP[@]}" install "${SOURCES[@]}" -c "$CONSTRAINTS" \
    --no-build-isolation mmcv
  if ! "$PY" -c 'import mmcv.ops' 2>/dev/null; then
    # pip's wheel cache does not key on the torch version: a wheel built
    # against another torch fails to load mmcv._ext. Rebuild it.
    log "cached mmcv wheel does not load with this torch; rebuilding"
    MAX_JOBS=${MAX_JOBS:-$(nproc)} "${PIP[@]}" install "${SOURCES[@]}" -c "$CONSTRAINTS" \
      --no-build-isolation --no-cache-dir --force-reinstall --no-deps mmcv
  fi
fi

log "installing mmengine, mmdet, mmsegmentation, timm, the test tools and the deploy extra (onnx, onnxruntime, openvino)"
"${PIP[@]}" install -q "${SOURCES[@]}" -c "$CONSTRAINTS" -r requirements/runtime.txt \
  -r requirements/tests.txt -r requirements/deploy.txt
"${PIP[@]}" install -q "${SOURCES[@]}" -c "$CONSTRAINTS" --no-deps --no-build-isolation -e .
"$PY" -c 'import mmcv.ops, mmdet, mmseg, timm, xcit_dense'
echo "$fingerprint" > "$STAMP"
log "ready: $VENV"
