# The two set-up commands of the README: `make demo` (the main job) and `make test` (the tests).
# Each creates .venv with a pinned torch (+ torchvision, which ComfyUI needs) when it is missing.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.14.1 torchvision==0.29.1
# the OCR reward's engine; --no-deps because its wheel asks for the non-headless opencv-python
RAPIDOCR ?= rapidocr-onnxruntime==1.4.4

COMFYUI ?= .comfyui
# The floor environment: every requirement at the lowest version requirements.txt admits
# (scripts/floor_pins.py), the same torch, ComfyUI's own requirements with those pins taking precedence.
# Its torch and CUDA libraries are hard links to .venv's (scripts/share_packages.py): not 5 GB twice.
FLOOR_VENV ?= .venv-floor
FPY        := $(FLOOR_VENV)/bin/python
# What it runs: the stored images, scores and LoRA (test_same_outputs), the embedded model, the rewards
# on tiny models, LoRA files, the headless trainer, and the nodes (picking included) in a real ComfyUI server.
FLOOR_TESTS ?= tests/test_same_outputs.py tests/test_versions.py tests/test_embedded_base.py \
               tests/test_clip_rewards.py tests/test_imagereward.py tests/test_scene_reward.py \
               tests/test_reward_mix.py tests/test_lora_formats.py tests/test_diffusers_models.py \
               tests/test_ocr_reward.py tests/test_train.py tests/test_comfyui.py \
               tests/test_comfyui_picks.py

.PHONY: venv comfyui browser test test-floor lint demo workflows thumbnails check-ui
venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-cache-dir $(TORCH)
	$(PY) -m pip install --quiet -r requirements.txt -e ".[test,ocr,tensorboard]"
	$(PY) -m pip install --quiet --no-deps $(RAPIDOCR)
	touch $@

# A real ComfyUI (git-ignored) for the node pack's tests: scripts/install_comfyui.py says how.
comfyui: $(COMFYUI)/main.py

$(COMFYUI)/main.py: | $(VENV)/.installed
	$(PY) scripts/install_comfyui.py --dest $(COMFYUI)

# Headless Chromium for tests/test_ui_frontend.py (the workflows in ComfyUI's real frontend; skipped
# without one): Debian's chromium-headless-shell, installed when none is found and we may (root, apt-get)
# A Debian whose last package install was cut off is repaired first (dpkg --configure -a, apt-get -f).
browser: venv
	@if ! $(PY) scripts/check_ui_workflows.py --find-browser >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing chromium-headless-shell (apt-get) for tests/test_ui_frontend.py"; \
	    log=$$(mktemp); export DEBIAN_FRONTEND=noninteractive; \
	    pkgs="chromium-headless-shell fonts-liberation"; \
	    { dpkg --configure -a && apt-get update -qq && \
	      { apt-get install -y -qq --no-install-recommends $$pkgs || \
	        { apt-get install -y -qq -f && apt-get install -y -qq --no-install-recommends --reinstall $$pkgs; }; }; \
	    } >"$$log" 2>&1 || { cat "$$log"; rm -f "$$log"; exit 1; }; \
	    rm -f "$$log"; \
	  else \
	    echo "no Chromium found, and installing one needs root and apt-get: tests/test_ui_frontend.py" \
	         "(the workflows in the real frontend) will be skipped; apt-get install chromium-headless-shell"; \
	  fi; \
	fi

test: venv comfyui browser
	$(PY) -m ruff check .
	$(PY) -m pytest
	$(MAKE) test-floor

$(FLOOR_VENV)/.installed: pyproject.toml requirements.txt scripts/floor_pins.py scripts/share_packages.py | $(COMFYUI)/main.py $(VENV)/.installed
	$(PYTHON) -m venv $(FLOOR_VENV)
	$(FPY) -m pip install --quiet --upgrade pip
	$(PY) scripts/floor_pins.py --extras tensorboard ocr > $(FLOOR_VENV)/pins.txt
	$(PY) scripts/share_packages.py --into $(FLOOR_VENV) --skip-pinned $(FLOOR_VENV)/pins.txt torch torchvision
	$(FPY) -m pip install --quiet --no-cache-dir $(TORCH)
	$(FPY) -m pip install --quiet -r $(FLOOR_VENV)/pins.txt -c $(FLOOR_VENV)/pins.txt \
	    pytest hypothesis open_clip_torch
	$(FPY) -m pip install --quiet --no-deps $(RAPIDOCR)
	$(FPY) -m pip install --quiet --no-deps -e .
	$(FPY) scripts/install_comfyui.py --dest $(COMFYUI) --deps-only --pins $(FLOOR_VENV)/pins.txt
	touch $@

# The fast tests again at the floor of every supported range (part of `make test`, so CI runs both ends)
test-floor: $(FLOOR_VENV)/.installed
	$(FPY) -m pip list --format=freeze | grep -iE '^(transformers|tokenizers|diffusers|peft|huggingface.hub)=='
	$(FPY) -m pytest -p no:cacheprovider $(FLOOR_TESTS)

demo: venv
	$(PY) -m dynamic_treerpo.trainer train configs/default.yaml --out runs/demo --resume

lint: venv
	$(PY) -m ruff check .

# Regenerate the UI-format workflows from their API-format sources (after a node's inputs change)
workflows: venv comfyui
	$(PY) scripts/api_to_ui.py workflows/api/*.api.json
	$(PY) scripts/node_labels.py

# The template browser's thumbnails (runs the CPU templates; about 8 minutes on 2 cores)
thumbnails: venv comfyui
	$(PY) scripts/make_thumbnails.py

# Open every UI workflow in ComfyUI's real web frontend (headless Chromium; on Debian:
# apt-get install chromium-headless-shell) and compare it with its API file, then the pack's templates in
# the template browser; PNGs of each with: .venv/bin/python scripts/check_ui_workflows.py --templates
# --screenshots DIR (`make test` runs this with screenshots: tests/test_ui_frontend.py)
check-ui: venv comfyui
	$(PY) scripts/check_ui_workflows.py --templates
