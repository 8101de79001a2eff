# Benchmarks (issue #5); figures and method in docs/benchmarks.md.
PYTHON ?= .venv/bin/python

.PHONY: bench bench-smoke setup simulate

setup:
	bash -c 'source scripts/setup.sh'

# Full: 1M records in 32 partitions, medians of 3 runs, and the aggregate at 4M and 10M; rewrites
# docs/benchmarks.md and docs/benchmarks.png.
bench: setup
	$(PYTHON) -m bench.run --records 1000000 --partitions 32 --runs 3 --historic 1000,100000,1000000 --sizes 4000000,10000000

# Reduced (what CI runs through tests/bench): leaves docs/ alone.
bench-smoke: setup
	$(PYTHON) -m bench.run --records 20000 --partitions 4 --runs 1 --historic 100,1000 --latency-repeats 1 --scaling-repeats 2 --sizes 40000 --docs bench/results/smoke

# The simulation of the ledger (tests/simulation, docs/development.md): random histories checked against the
# model for MINUTES, going on past a failing one; its seeds replay with LEDGERBATCH_SIM_SEED.
MINUTES ?= 10
simulate: setup
	PYTHONPATH=plugins:. $(PYTHON) -m tests.simulation.run --minutes $(MINUTES) --keep-going
