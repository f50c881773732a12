# pretrain_exp -- `make help` lists the targets. Every target installs what it needs into .venv first.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DOCS_STAMP := $(VENV)/.docs-installed
# pytest-xdist workers for `make test` / `make test-fast`: one more than the cores (on 2 cores, 2 workers left a
# fifth of the CPU idle while a test waited on SLURM, a child's event or a sleep); `worksteal` hands a worker that
# ran out the tests queued for another, so no worker idles while the last slow tests run
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n < 15 ? n + 1 : 16 )))
TEST_DIST ?= worksteal
# tcmalloc makes CPU training ~2x faster (fewer page faults on the big LM-head buffers); used when present
PRELOAD = LD_PRELOAD=$$(ls /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 2>/dev/null || true)

.PHONY: help install demo test test-fast lint docs reference docs-images bench mutation gpu-test gpu-bench dry-run clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

# torch is pinned through a constraint file so that nothing pulls a newer torch with GBs of CUDA wheels here;
# pyproject.toml keeps the range (torch>=2.10,<2.14) that GPU users install against.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	echo "torch==2.13.0" > $(VENV)/torch-constraint.txt
	$(PY) -m pip install -q -c $(VENV)/torch-constraint.txt torch==2.13.0 2>&1 | grep -v "is ignored" || true
	$(PY) -m pip install -q -c $(VENV)/torch-constraint.txt -e '.[dev,olmo]' 2>&1 | grep -v "is ignored" || true
	# every module the tests import from the extras (a broken import deep inside one fails here, not as a skip)
	$(PY) -c "import torch, transformers, hydra, lm_eval, olmo_core, olmo_core.data.data_loader, \
	  olmo_core.distributed.checkpoint, olmo_core.nn.hf.convert, olmo_core.nn.transformer, olmo_core.optim, \
	  olmo_core.train.callbacks, olmo_core.train.train_module, moto.server, hypothesis, psutil" && touch $(STAMP)

install: $(STAMP) ## create .venv and install the project (idempotent); tcmalloc via apt when root
	@if ! ls /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] \
	    && command -v apt-get >/dev/null; then \
	  (apt-get install -y -q libtcmalloc-minimal4 || (apt-get update -q && apt-get install -y -q libtcmalloc-minimal4)) \
	    >/dev/null 2>&1 || echo "note: libtcmalloc-minimal4 not installed (optional, ~2x faster CPU training)"; fi

demo: install ## run the embedded default experiment (python -m pretrain_exp): SmolLM2-135M on Shakespeare
	$(PRELOAD) $(PY) -m pretrain_exp $(ARGS)

test: install $(DOCS_STAMP) ## run all tests except GPU ones (what CI runs; it builds the docs too)
	$(PRELOAD) $(PY) -m pytest -m "not gpu" -q -n $(TEST_JOBS) --dist $(TEST_DIST) $(ARGS)

test-fast: install ## run the tests not marked slow, gpu or network (under 3 minutes)
	$(PRELOAD) $(PY) -m pytest -m "not slow and not gpu and not network" -q -n $(TEST_JOBS) --dist $(TEST_DIST) $(ARGS)

lint: install ## flake8 + isort check
	$(PY) -m flake8 pretrain_exp frameworks evals tests benchmarks docs
	$(PY) -m isort --check-only --diff pretrain_exp frameworks evals tests benchmarks docs

# the docs extra goes into the same .venv (autodoc imports the package), once per change of pyproject.toml
$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install -q -c $(VENV)/torch-constraint.txt -e '.[docs]' 2>&1 | grep -v "is ignored" || true
	$(PY) -c "import sphinx, myst_parser, furo" && touch $(DOCS_STAMP)

docs: $(DOCS_STAMP) ## build the docs site into docs/_build/html (Sphinx, warnings as errors)
	$(PY) -m sphinx -W --keep-going -n -q -b html docs docs/_build/html $(ARGS)
	@echo "docs: $(CURDIR)/docs/_build/html/index.html"

reference: install ## regenerate the committed config and command reference pages (docs/reference_pages.py)
	$(PY) docs/reference_pages.py $(ARGS)

docs-images: install ## regenerate the docs' figures (runs the demo and experiment=tiny; see docs/make_images.py)
	$(PRELOAD) $(PY) docs/make_images.py $(ARGS)

bench: install ## plan-building and Plan.apply benchmark (prints times, memory and ratios)
	$(PY) benchmarks/plan_build.py $(ARGS)

# mutmut (the mutation extra) with the [mutmut] settings of setup.cfg; it works in mutants/ (git-ignored) and starts
# afresh each time. Not run by CI: about 15 minutes on two cores (docs/development/mutation.md)
mutation: install ## mutation score of the insertion engine and the data order (mutmut; prints the score per file)
	$(PY) -c "import mutmut" 2>/dev/null || $(PY) -m pip install -q -c $(VENV)/torch-constraint.txt -e '.[mutation]' \
	  2>&1 | grep -v "is ignored" || true
	rm -rf mutants
	$(PY) -m mutmut run --max-children $(TEST_JOBS) $(ARGS)
	$(PY) -m tests.mutation_score

# The GPU targets run in the environment that holds CUDA torch: `make gpu-test PY=python` uses that interpreter as it
# is (nothing installed; the project installed there or run from this checkout); without PY= they use .venv.
GPU_DEPS := $(if $(filter command line,$(origin PY)),,install)

gpu-test: $(GPU_DEPS) ## run the GPU tests (tests/gpu: OLMo-core bf16, exact continuation vs OLMo-core, hf bf16 sdpa, evals)
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(PY) -m pytest -m gpu tests/gpu -v $(ARGS)

gpu-bench: $(GPU_DEPS) ## tokens/s/GPU, MFU and memory of the OLMo-2 1B shape: olmo_core, hf, bare OLMo-core, insertion on/off
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(PY) benchmarks/gpu_throughput.py $(ARGS)

dry-run: install ## print the composed config of the default run (add ARGS="key=value ...")
	$(PY) -m pretrain_exp --cfg job $(ARGS)

clean: ## delete runs/ and caches in the checkout (not .venv, not ~/.cache/pretrain_exp)
	rm -rf runs outputs multirun .pytest_cache docs/_build
