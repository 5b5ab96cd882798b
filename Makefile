# The two commands of the README. Both create .venv with the pinned stack
# when it is missing (tools/setup_env.sh) and reuse it when present.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install demo test

install:
	@VENV=$(VENV) bash tools/setup_env.sh

demo: install
	$(PY) tools/demo_backbone.py

test: install
	$(PY) -m pytest tests
