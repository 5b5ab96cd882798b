# The two commands of the README. Both create .venv with the pinned stack
# when it is missing (tools/setup_env.sh) and reuse it when present.
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_COCO := configs/coco/demo_mask_rcnn_xcit_nano_synthetic.py

.PHONY: install demo demo-coco test

install:
	@VENV=$(VENV) bash tools/setup_env.sh

# The main job: train Mask R-CNN XCiT-N12/16 on the synthetic COCO-format
# dataset on the CPU and print its COCO bbox / segm mAP.
demo: demo-coco

demo-coco: install
	$(PY) tools/make_synthetic_data.py coco data/synthetic_coco
	$(PY) tools/train.py $(DEMO_COCO) --work-dir work_dirs/demo_coco

test: install
	$(PY) -m pytest tests
