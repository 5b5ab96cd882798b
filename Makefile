# The two commands of the README. Both create .venv with the pinned stack
# when it is missing (tools/setup_env.sh) and reuse it when present.
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_COCO := configs/coco/demo_mask_rcnn_xcit_nano_synthetic.py
DEMO_ADE20K := configs/ade20k/demo_upernet_xcit_nano_synthetic.py

.PHONY: install demo demo-coco demo-ade20k test wheelhouse

install:
	@VENV=$(VENV) bash tools/setup_env.sh

# The set-up, unless a Python is given on the command line (PY=python3: that
# Python as it is set up, a GPU machine's image without network, say)
SETUP := $(if $(filter command line,$(origin PY)),,install)

# The main job: train Mask R-CNN XCiT-N12/16 on the synthetic COCO-format
# dataset (on the GPU if there is one, else the CPU) and print its COCO
# bbox / segm mAP.
demo: demo-coco

demo-coco: $(SETUP)
	$(PY) tools/make_synthetic_data.py coco data/synthetic_coco
	$(PY) tools/train.py $(DEMO_COCO) --work-dir work_dirs/demo_coco

# The segmentation demo: UperNet XCiT-N12/16 on the synthetic ADE20K-format
# dataset, reporting aAcc, mIoU and mAcc.
demo-ade20k: $(SETUP)
	$(PY) tools/make_synthetic_data.py ade20k data/synthetic_ade20k
	$(PY) tools/train.py $(DEMO_ADE20K) --work-dir work_dirs/demo_ade20k

# One pytest worker per core, a test file per worker at a time (its fixtures
# shared), the longest files first (tests/conftest.py, LONGEST_FILES), one
# thread each: two workers of two threads oversubscribe a 2-core machine and
# OpenMP's spinning threads slow both.
test: install
	$(VENV)/bin/ruff check .
	OMP_NUM_THREADS=1 $(PY) -m pytest tests -n auto --dist loadfile \
	    --no-loadscope-reorder \
	    --durations=15

# On a machine with an NVIDIA GPU: make gpu-report [STEP=...], its steps and
# variables in benchmarks/gpu_report.mk
include benchmarks/gpu_report.mk

# On a machine with network: the wheels of the stack (PyTorch excluded) and
# mmcv's source, for `WHEELHOUSE=$(WHEELHOUSE) PYTHON=... make test` on an
# offline GPU node whose Python has PyTorch (see tools/make_wheelhouse.sh);
# on a GPU machine also the mmcv it built with CUDA ops, which nodes with the
# same PyTorch, CUDA, GPUs and Python install instead of building it.
WHEELHOUSE ?= wheelhouse
wheelhouse:
	WHEELHOUSE= VENV=$(VENV) bash tools/setup_env.sh
	PY=$(PY) bash tools/make_wheelhouse.sh $(WHEELHOUSE)

# Offline, on the GPU node whose set-up built mmcv with its CUDA ops: add
# that wheel and what it was built for to the wheelhouse, so that the
# cluster's other nodes install it instead of building it.
.PHONY: wheelhouse-mmcv
wheelhouse-mmcv:
	PY=$(PY) bash tools/make_wheelhouse.sh --mmcv-only $(WHEELHOUSE)
