# The two commands of the README. Both create .venv with the pinned stack
# when it is missing (tools/setup_env.sh) and reuse it when present.
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_COCO := configs/coco/demo_mask_rcnn_xcit_nano_synthetic.py
DEMO_ADE20K := configs/ade20k/demo_upernet_xcit_nano_synthetic.py

.PHONY: install demo demo-coco demo-ade20k test

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

test: install
	$(PY) -m pytest tests --durations=15
