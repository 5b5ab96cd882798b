# make gpu-report: the measurements of a machine with an NVIDIA GPU, included
# by the Makefile (which sets PY and SETUP).
.PHONY: gpu-report gpu-report-tests gpu-report-probe gpu-report-tiles \
	gpu-report-backbone gpu-report-graphs gpu-report-heads \
	gpu-report-compiled gpu-report-demos gpu-report-table

# On a machine with an NVIDIA GPU, in steps that each fit 10 minutes on one
# H100 (STEP=tests, probe, tiles, backbone, graphs, heads, compiled or
# table, or several: STEP='tests backbone'; default: all, in that order),
# each writing its rows under $(GPU_REPORT)/ as they come; a step that fails
# (a failed test, a row that errs) does not stop the next ones, and make
# names the failed steps at the end and exits non-zero:
#   tests     tests/test_cuda.py, every traceback and duration (tests.log;
#             printed: each test's outcome, the calls over a second, the
#             summary), in GPU_TESTS_WORKERS processes sharing the GPU (default 4:
#             Triton's and Inductor's compilations, and the tools the tests
#             start, are work for the CPU's cores); interrupted after
#             GPU_TESTS_S seconds (default 480: a cold machine's 75 s set-up
#             and the summary fit a 10-minute command), when pytest still
#             prints what passed and failed so far (a test deaf to the
#             interrupt is killed 30 s later)
#   probe     where the time goes: each part's fast path on and off alone,
#             eagerly (in 3 rounds of rotated order: in one process the order
#             weighs) and replayed from the backbone's CUDA graphs (the GPU's
#             time alone; also XCA's second-moments route in place of its
#             kernels) (policy_probe.json, the CUDA column of the policy),
#             kernel launches against GPU time, CUDA graphs (inference and
#             training steps) (launch_probe.jsonl), the host's time of a
#             tiny eager call and of one Triton launch against one
#             PyTorch operator's (host_time.jsonl)
#   tiles     the Triton kernels' tile sizes and warps: XCA's and LPI's
#             forward and backward at XCiT-S12's shapes under each
#             candidate, fp32, bf16 and fp16 (tile_sweep.jsonl)
#   backbone  tools/benchmark.py --device cuda, XCiT-S12/16 at 800x1344:
#             straightforward and default (on CUDA every fast path but the
#             up-sampler's, XCA's and LPI's Triton kernels; '@always',
#             which differs in the up-sampler alone, is left to the probe);
#             fp32, fp16 AMP and bf16 autocast; inference at batch 1
#             (backbone/), training steps at batch 2 (backbone_train/): 12
#             processes, about 20 s each on an H200
#   graphs    the same backbone's inference replayed from CUDA graphs
#             (backbone_graphs/), and its AMP training steps
#             (backbone_graphs_train/), beside their straightforward rows
#             (and the eager default's, training); then the graphed
#             training step split into its phases, CPU and GPU time
#             (graphs_probe.jsonl); about 5.5 min on an H200
#   heads     the Mask R-CNN (against Swin-T's) and UperNet AMP training
#             steps as the recipes run them (the backbone's fast paths and
#             cuda_graphs='auto': a fixed size is replayed from its third
#             step), without CUDA graphs (@eager) and against their
#             fast_path=False eager baselines; then whole iterations
#             (@iter: mmengine's train_step, the recipe's AmpOptimWrapper
#             and its optimizer step included, as a user's log times them),
#             and those iterations split by part, CPU and GPU time, one
#             more step of each under PyTorch's profiler
#             (iteration_probe.jsonl, *_profile.txt, and under ade20k/)
#   compiled  the backbone compiled (Inductor, static shapes), whose
#             compilations take longest: its inference and training rows
#             (backbone_compiled/), then the probe's compiled rows
#             (launch_probe_compiled.jsonl)
#   demos     the Mask R-CNN, Cascade, Mask2Former (COCO, ADE20K) and
#             UperNet demos trained on the GPU as the recipes run:
#             tools/dist_train.sh CONFIG 1 --amp with SyncBN, all at once
#             (benchmarks/gpu/demos.sh; demos/NAME.log each), then their
#             wall times and final metrics; GPU_DEMOS='CONFIG ...' names
#             which; then the gradients of a COCO Mask2Former demo step
#             (the trained one's, where it trained) under fp16 autocast
#             against fp32's, by part, with mmdet's pixel decoder (fp16
#             under autocast) and with it in fp32 (amp_gradients.jsonl)
#   table     the README's GPU table from the rows above (table.md)
GPU_REPORT ?= work_dirs/gpu_report
GPU_STEPS := tests probe tiles backbone graphs heads compiled demos table
GPU_TESTS_S ?= 480
GPU_TESTS_WORKERS ?= 4
# the demos' configs (default: the five of benchmarks/gpu/demos.sh; on
# an H200 the five with a sixth training did not finish in 480 s, so a
# 10-minute command may take a few at a time)
GPU_DEMOS ?=
STEP ?= all
# a measurement that hangs is stopped (an error row) before the step's 10
# minutes are gone
GPU_BENCH := $(PY) tools/benchmark.py --device cuda --repeat 20 --warmup 3 \
    --timeout 300 $(if $(GPU_PUBLISHED),--published-code $(GPU_PUBLISHED))
# the published backbone's file (detection/backbone/xcit.py of
# github.com/facebookresearch/xcit; not part of this package): where given,
# the backbone and graphs steps measure it beside ours, in the same run
# (@published rows, the baseline of the issue's targets)
GPU_PUBLISHED ?=
PUBLISHED = $(if $(GPU_PUBLISHED),$(foreach v,$(1),xcit_small_12_p16@$(v)))
# the issue's targets: inference at batch 1, training steps at batch 2;
# straightforward and default; fp32, fp16 autocast (AMP as
# mmengine's AmpOptimWrapper runs it) and the backbone's own bf16 autocast
# (straightforward too: on the H200 the default's training step took 49.5 ms
# under it against 35.8 under fp16)
GPU_BACKBONE_ROWS := xcit_small_12_p16@reference xcit_small_12_p16 \
    xcit_small_12_p16@reference+amp xcit_small_12_p16@amp \
    xcit_small_12_p16@reference+bf16 xcit_small_12_p16@bf16

gpu-report: $(SETUP)
	@$(PY) -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "make gpu-report: PyTorch sees no CUDA device on this machine")'
	@steps="$(if $(filter all,$(STEP)),$(GPU_STEPS),$(STEP))"; \
	for step in $$steps; do case " $(GPU_STEPS) " in *" $$step "*) ;; \
	    *) echo "make gpu-report: STEP=$$step is not a step; steps: $(GPU_STEPS) (or all)"; exit 2;; esac; done; \
	failed=; for step in $$steps; do \
	    echo "[gpu-report] $$step -> $(GPU_REPORT)"; \
	    $(MAKE) --no-print-directory gpu-report-$$step || failed="$$failed $$step"; \
	done; \
	if [ -n "$$failed" ]; then echo "[gpu-report] failed:$$failed"; exit 1; fi

gpu-report-tests:
	@mkdir -p $(GPU_REPORT)
	PYTHONUNBUFFERED=1 timeout -k 30 -s INT $(GPU_TESTS_S) $(PY) -m pytest \
	    tests/test_cuda.py -n $(GPU_TESTS_WORKERS) --dist worksteal \
	    -rA --durations=0 -p no:cacheprovider \
	    > $(GPU_REPORT)/tests.log 2>&1; status=$$?; \
	    grep -E '^(PASSED|FAILED|ERROR|SKIPPED)|^[0-9.]+s call|^=+ .* in [0-9.]+s' \
	        $(GPU_REPORT)/tests.log | grep -vE '^0\.[0-9]+s call'; \
	    exit $$status

gpu-report-probe:
	@mkdir -p $(GPU_REPORT)
	$(PY) -m benchmarks.gpu.policy_probe --repeat 5 --rounds 3 \
	    --graphs --out $(GPU_REPORT)/policy_probe.json
	$(PY) -m benchmarks.gpu.launch_probe --out $(GPU_REPORT) --no-compile
	$(PY) -m benchmarks.probes.host_time --device cuda --out $(GPU_REPORT)

gpu-report-tiles:
	@mkdir -p $(GPU_REPORT)
	$(PY) -m benchmarks.gpu.tile_sweep --out $(GPU_REPORT)

gpu-report-backbone:
	$(GPU_BENCH) --out-dir $(GPU_REPORT)/backbone --sizes 800x1344 \
	    --models $(call PUBLISHED,published published+amp) \
	    $(GPU_BACKBONE_ROWS) --batch 1 --modes infer
	$(GPU_BENCH) --out-dir $(GPU_REPORT)/backbone_train --sizes 800x1344 \
	    --models $(call PUBLISHED,published published+amp) \
	    $(GPU_BACKBONE_ROWS) --batch 2 --modes train

gpu-report-graphs:
	$(GPU_BENCH) --out-dir $(GPU_REPORT)/backbone_graphs --sizes 800x1344 \
	    --models $(call PUBLISHED,published published+amp) \
	    xcit_small_12_p16@reference xcit_small_12_p16@graphs \
	    xcit_small_12_p16@reference+amp xcit_small_12_p16@amp+graphs \
	    --batch 1 2 --modes infer
	$(GPU_BENCH) --out-dir $(GPU_REPORT)/backbone_graphs_train \
	    --sizes 800x1344 --models $(call PUBLISHED,published+amp) \
	    xcit_small_12_p16@reference+amp \
	    xcit_small_12_p16@amp xcit_small_12_p16@amp+graphs \
	    --batch 2 --modes train
	$(PY) -m benchmarks.gpu.graphs_probe --out $(GPU_REPORT) --repeat 10

gpu-report-heads:
	$(GPU_BENCH) --out-dir $(GPU_REPORT)/heads --sizes 800x1344 \
	    --models mask_rcnn_xcit_s12@reference+amp \
	    mask_rcnn_xcit_s12@amp+eager mask_rcnn_xcit_s12@amp \
	    mask_rcnn_swin_t@amp mask_rcnn_xcit_s12@reference+amp+iter \
	    mask_rcnn_xcit_s12@amp+iter mask_rcnn_swin_t@amp+iter \
	    --batch 2 --modes train
	$(GPU_BENCH) --out-dir $(GPU_REPORT)/heads_ade20k --sizes 512x512 \
	    --models upernet_xcit_s12@reference+amp upernet_xcit_s12@amp+eager \
	    upernet_xcit_s12@amp upernet_xcit_s12@reference+amp+iter \
	    upernet_xcit_s12@amp+iter --batch 2 --modes train
	$(PY) -m benchmarks.gpu.iteration_probe --out $(GPU_REPORT) \
	    --models mask_rcnn_xcit_s12@amp+iter mask_rcnn_swin_t@amp+iter \
	    --profile
	$(PY) -m benchmarks.gpu.iteration_probe --out $(GPU_REPORT)/ade20k \
	    --models upernet_xcit_s12@amp+iter --size 512x512 --profile

gpu-report-compiled:
	$(GPU_BENCH) --out-dir $(GPU_REPORT)/backbone_compiled --sizes 800x1344 \
	    --models xcit_small_12_p16@reference xcit_small_12_p16@compile \
	    --batch 1 2 --modes infer train
	$(PY) -m benchmarks.gpu.launch_probe --out $(GPU_REPORT) \
	    --compile-only

M2F_DEMO_CHECKPOINT := \
    work_dirs/gpu_demos/coco_demo_mask2former_xcit_nano_synthetic/iter_800.pth
gpu-report-demos:
	PYTHON=$(PY) bash benchmarks/gpu/demos.sh $(GPU_REPORT)/demos \
	    $(GPU_DEMOS); status=$$?; \
	$(PY) -m benchmarks.gpu.amp_gradients --out $(GPU_REPORT) \
	    $$([ -f $(M2F_DEMO_CHECKPOINT) ] && \
	       echo --checkpoint $(M2F_DEMO_CHECKPOINT)) --cfg-options \
	    model.panoptic_head.pixel_decoder.type=mmdet.MSDeformAttnPixelDecoder \
	    && exit $$status

gpu-report-table:
	$(PY) -m benchmarks.gpu.table $(GPU_REPORT) \
	    --out $(GPU_REPORT)/table.md
