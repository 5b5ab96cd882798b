# The two commands of the README. Both create .venv with the pinned stack
# when it is missing (tools/setup_env.sh) and reuse it when present.
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_COCO := configs/coco/demo_mask_rcnn_xcit_nano_synthetic.py
DEMO_ADE20K := configs/ade20k/demo_upernet_xcit_nano_synthetic.py

.PHONY: install demo demo-coco demo-ade20k test gpu-report wheelhouse

install:
	@VENV=$(VENV) bash tools/setup_env.sh

# The main job: train Mask R-CNN XCiT-N12/16 on the synthetic COCO-format
# dataset on the CPU and print its COCO bbox / segm mAP.
demo: demo-coco

demo-coco: install
	$(PY) tools/make_synthetic_data.py coco data/synthetic_coco
	$(PY) tools/train.py $(DEMO_COCO) --work-dir work_dirs/demo_coco

# The segmentation demo: UperNet XCiT-N12/16 on the synthetic ADE20K-format
# dataset, reporting aAcc, mIoU and mAcc.
demo-ade20k: install
	$(PY) tools/make_synthetic_data.py ade20k data/synthetic_ade20k
	$(PY) tools/train.py $(DEMO_ADE20K) --work-dir work_dirs/demo_ade20k

# One pytest worker per core, a test file per worker at a time (its fixtures
# shared), one thread each: two workers of two threads oversubscribe a
# 2-core machine and OpenMP's spinning threads slow both.
test: install
	$(VENV)/bin/ruff check .
	OMP_NUM_THREADS=1 $(PY) -m pytest tests -n auto --dist loadfile \
	    --durations=15

# On a machine with an NVIDIA GPU: the CUDA tests, the per-part probe behind
# the fast-path policy, then tools/benchmark.py --device cuda for the backbone
# (eager, compiled, fast_path=False; fp32 and AMP; inference and training) and
# the Mask R-CNN / UperNet training steps; tables in $(GPU_REPORT).
GPU_REPORT ?= work_dirs/gpu_report
gpu-report: install
	@$(PY) -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "make gpu-report: PyTorch sees no CUDA device on this machine")'
	$(PY) -m pytest tests/test_cuda.py -rs --durations=10
	$(PY) docs/benchmark/gpu/policy_probe.py --compile --out $(GPU_REPORT)/probe.json
	$(PY) tools/benchmark.py --device cuda --out-dir $(GPU_REPORT)/backbone \
	    --models xcit_small_12_p16@reference xcit_small_12_p16 \
	    xcit_small_12_p16@always xcit_small_12_p16@always+amp \
	    xcit_small_12_p16@compile xcit_small_12_p16@reference+amp \
	    xcit_small_12_p16@amp xcit_small_12_p16@compile+amp \
	    --sizes 512x512 800x1344 1600x2688 --batch 1 2 --modes infer train \
	    --repeat 20 --warmup 3
	$(PY) tools/benchmark.py --device cuda --out-dir $(GPU_REPORT)/heads \
	    --models mask_rcnn_xcit_s12@reference+amp mask_rcnn_xcit_s12@amp \
	    --sizes 800x1344 --batch 2 --modes train --repeat 20 --warmup 5
	$(PY) tools/benchmark.py --device cuda --out-dir $(GPU_REPORT)/heads_ade20k \
	    --models upernet_xcit_s12@reference+amp upernet_xcit_s12@amp \
	    --sizes 512x512 --batch 2 --modes train --repeat 20 --warmup 5

# On a machine with network: the wheels of the stack (PyTorch excluded) and
# mmcv's source, for `WHEELHOUSE=$(WHEELHOUSE) PYTHON=... make test` on an
# offline GPU node whose Python has PyTorch (see tools/make_wheelhouse.sh).
WHEELHOUSE ?= wheelhouse
wheelhouse:
	WHEELHOUSE= VENV=$(VENV) bash tools/setup_env.sh
	PY=$(PY) bash tools/make_wheelhouse.sh $(WHEELHOUSE)
