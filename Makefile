# The README's commands. Each target creates (once) and reuses the virtual environment in .venv.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo example zoo test test-slow test-all lint bench clean

# uv (from PyPI) resolves and installs the same versions as pip in about a quarter of the time
# (11 s against 45 s on an empty cache); pip does it if uv cannot be installed.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip uv || $(BIN)/pip install --quiet --upgrade pip
	if [ -x $(BIN)/uv ]; then $(BIN)/uv pip install --quiet --python $(BIN)/python -e ".[dev,fpga,cluster]"; \
	else $(BIN)/pip install --quiet -e ".[dev,fpga,cluster]"; fi
	touch $(STAMP)

## main job: the perception/planning preemption demo on the RTL core (Verilator)
demo: $(STAMP)
	$(BIN)/npu demo

## the example GEMM program, assembled and run on the golden model
example: $(STAMP)
	mkdir -p out
	$(BIN)/npu asm examples/gemm_requant_relu.s -o out/gemm_requant_relu.bin
	$(BIN)/npu run examples/gemm_requant_relu.s

## the model zoo's ONNX files, calibration and test inputs, in models/out/
zoo: $(STAMP)
	$(BIN)/python -m npu.models -o models/out

# one pytest worker per core: each keeps numpy's BLAS and onnxruntime to one thread (their spinning
# thread pools, two per core, slowed the real-model tests by about a quarter: docs/testing.md)
ONE_THREAD := OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

## the test suite (what CI runs): every feature and every RTL suite, fewer random seeds
test: $(STAMP)
	$(BIN)/ruff check .
	$(ONE_THREAD) $(BIN)/pytest -q -n auto --dist loadgroup --durations=15

## the long sweeps only: 1000 random programs per preset on the RTL against the model (tests marked slow)
test-slow: $(STAMP)
	$(ONE_THREAD) $(BIN)/pytest -q -n auto --dist loadgroup -m slow --rtl-sweep 1000

## everything: the suite with the full random seeds plus the long sweeps
test-all: $(STAMP)
	$(BIN)/ruff check .
	$(ONE_THREAD) $(BIN)/pytest -q -n auto --dist loadgroup -m "" --rtl-seeds 100 --rtl-sweep 1000 --durations=30

bench: $(STAMP)
	$(BIN)/npu bench model --json

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) out build *.egg-info .pytest_cache .hypothesis
