#!/usr/bin/env bash
# A wheelhouse for an offline GPU node: everything the set-up installs except
# PyTorch, whose installation the node already has.
#
#   make wheelhouse [WHEELHOUSE=wheelhouse] [PYTHON_VERSION=3.12] [CUDA_TOOLKIT=13.0.2]
#   make wheelhouse-mmcv [WHEELHOUSE=wheelhouse]     # --mmcv-only, offline
#
# Run on a machine with network (after `make install`, whose Python reads
# mmcv's source package). Downloads the pinned stack of
# requirements/constraints.txt as wheels for Linux x86-64 and PYTHON_VERSION
# (the node's Python; default: this environment's), mmcv's source (built on
# the node, for its GPUs), and with CUDA_TOOLKIT the registry's CUDA compiler
# of that release (for nodes without one). On the node:
#   WHEELHOUSE=wheelhouse PYTHON=/path/to/python-with-torch make test
#
# mmcv built once per cluster: when this environment's mmcv is one the
# set-up built with CUDA ops (build/mmcv-*/dist, on a GPU machine or with
# FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST=...), its wheel is added with the
# description of what it was built for (PyTorch, CUDA, TORCH_CUDA_ARCH_LIST,
# Python; WHEEL.json) under mmcv-cuda/, and the nodes whose PyTorch, CUDA,
# GPUs and Python match install it instead of building mmcv (5 minutes on 16
# cores). --mmcv-only does only that, offline: on the node whose set-up
# built mmcv, for the others (tools/cuda_setup.py wheelhouse-mmcv).
set -euo pipefail
cd "$(dirname "$0")/.."

MMCV_ONLY=
[ "${1:-}" = "--mmcv-only" ] && { MMCV_ONLY=1; shift; }
DEST=${1:-${WHEELHOUSE:-wheelhouse}}
PY=${PY:-.venv/bin/python}
PYTHON_VERSION=${PYTHON_VERSION:-$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')}
CONSTRAINTS=requirements/constraints.txt
PIP=("$PY" -m pip --disable-pip-version-check)
PLATFORM=()
for tag in manylinux_2_39 manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 \
           manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
  PLATFORM+=(--platform "${tag}_x86_64")
done
BINARY=(--only-binary=:all: --python-version "$PYTHON_VERSION" --implementation cp
        "${PLATFORM[@]}" --platform any)

# the pins, less PyTorch's own stack (torch, torchvision, triton, NVIDIA's
# libraries) and mmcv (a source package, below)
mapfile -t pins < <(grep -E '^[A-Za-z0-9_.-]+==' "$CONSTRAINTS" \
  | grep -v -E '^(torch|torchvision|triton|nvidia-[a-z0-9-]+|cuda-[a-z-]+|mmcv)==')
if [ "${1:-}" = "--list" ]; then
  printf '%s\n' "${pins[@]}" "mmcv==$(sed -n 's/^mmcv==//p' "$CONSTRAINTS") (source)"
  exit 0
fi
mkdir -p "$DEST"
if [ -n "$MMCV_ONLY" ]; then
  "$PY" tools/cuda_setup.py wheelhouse-mmcv "$DEST" "$PYTHON_VERSION"
  exit 0
fi
echo "[wheelhouse] ${#pins[@]} pinned wheels for Python $PYTHON_VERSION into $DEST"
"${PIP[@]}" download -q --no-deps "${BINARY[@]}" -d "$DEST" "${pins[@]}" \
  'setuptools<81' wheel
echo "[wheelhouse] mmcv's source"
"${PIP[@]}" download -q --no-deps --no-binary :all: --no-build-isolation -d "$DEST" \
  "mmcv==$(sed -n 's/^mmcv==//p' "$CONSTRAINTS")"
if [ -n "${CUDA_TOOLKIT:-}" ]; then
  echo "[wheelhouse] the registry's CUDA compiler, cuda-toolkit $CUDA_TOOLKIT"
  "${PIP[@]}" download -q "${BINARY[@]}" -d "$DEST" \
    "cuda-toolkit[nvcc,cccl]==$CUDA_TOOLKIT"
fi
"$PY" tools/cuda_setup.py wheelhouse-mmcv "$DEST" "$PYTHON_VERSION"
echo "[wheelhouse] $(ls "$DEST" | wc -l) files, $(du -sh "$DEST" | cut -f1) in $DEST"
