# One command for each job; each installs what it needs into .venv first (fast when done).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fleetlite-installed
PYTEST_ARGS ?=
# Paddle installs a `fleetrun` command of its own; reinstalling fleetlite last makes it ours.
CLAIM_FLEETRUN := $(PY) -m pip install -q --no-deps --force-reinstall -e .
# The compiled CPU kernels (MSTopK, the copy-free bucket views, the sub-group collectives, the
# timeline's timestamps) build on first use; building them
# here keeps that out of the tests' time (without a C++ compiler: a warning each, and the Paddle-op
# and concat/split paths run).
BUILD_KERNELS := $(PY) -c 'from fleetlite.compression import mstopk_kernel; \
	from fleetlite.compile import bucket_views, group_collectives, step_stamps; \
	mstopk_kernel.load_error(); bucket_views.load_error(); group_collectives.load_error(); step_stamps.load_error()'

.PHONY: install test demo proto docs bench clean

$(STAMP): setup.cfg setup.py pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[cpu,test]'
	$(CLAIM_FLEETRUN)
	$(BUILD_KERNELS)
	@touch $@

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS) tests

demo: $(STAMP)
	$(VENV)/bin/fleetrun --nproc_per_node 2 --log_dir log/demo \
		examples/train_digits.py --strategy configs/cpu_gloo.yaml --epochs 8

proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -I. --python_out=. fleetlite/proto/strategy.proto

docs: $(STAMP)
	$(PY) -m fleetlite.strategy.reference_doc > docs/strategy_reference.md

BENCH_STAMP := $(VENV)/.fleetlite-bench-installed
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[cpu,test,bench]'
	$(CLAIM_FLEETRUN)
	@touch $@

bench: $(BENCH_STAMP)
	mkdir -p log
	$(PY) -m benchmarks.gradsync.gradsync --json log/bench_gradsync.json
	$(PY) -m benchmarks.step_overhead.resnet50_step --json log/bench_resnet50_step.json
	$(PY) -m benchmarks.step_overhead.step_overhead --json log/bench_step_overhead.json
	$(PY) -m benchmarks.data.data_loading --json log/bench_data_loading.json
	$(PY) -m benchmarks.pto.pto --json log/bench_pto.json
	$(PY) -m benchmarks.data.data_cache --json log/bench_data_cache.json
	$(PY) -m benchmarks.amp.amp_bf16 --json log/bench_amp_bf16.json
	$(PY) -m benchmarks.topk.topk_select --json log/bench_topk_select.json
	$(PY) -m benchmarks.topk.topk_wire_bytes --json log/bench_topk_wire_bytes.json
	$(PY) -m benchmarks.topk.topk_throttled --json log/bench_topk_throttled.json
	$(PY) -m benchmarks.topk.topk_accuracy --json log/bench_topk_accuracy.json
	$(PY) -m benchmarks.multihost.multihost --json log/bench_multihost.json

clean:
	rm -rf $(VENV) build *.egg-info log
