# The two commands a newcomer runs (README):
#   make demo   set everything up and run the main job end to end on a local 2-node Slurm cluster
#   make test   set everything up and run the test suite on Slurm 22.05, then its Slurm tests on Slurm 26.05, then
#               the tests of the differences between releases on Slurm 24.11 (the same command CI runs);
#               `make test-slurm26` and `make test-slurm24` run the Slurm tests on one release
PYTHON ?= python3
DEMO_DIR := .demo
SLURM_DIR := .slurm
# e.g. `make demo CLUSTER_FLAGS=--accounting`: slurmdbd on a MariaDB of the cluster's own (docs/accounting.md)
CLUSTER_FLAGS ?=

.PHONY: setup cluster demo test test-slurm24 test-slurm26 down

setup:
	PYTHON=$(PYTHON) bash scripts/setup.sh

cluster: setup
	$(PYTHON) -m launcher.localcluster up --nodes 2 --gpus_per_node 2 --dir $(SLURM_DIR) $(CLUSTER_FLAGS)

demo: cluster
	$(PYTHON) -m launcher.localcluster.demo_data $(DEMO_DIR)
	SLURM_CONF=$(CURDIR)/$(SLURM_DIR)/etc/slurm.conf $(PYTHON) slurm_launcher.py --run_name demo \
	  --nodes 2 --gpus_per_node 2 --model_size tiny --dataset $(DEMO_DIR)/dataset --tokenizer $(DEMO_DIR)/tokenizer \
	  --train_steps 40 --warmup_steps 4 --learning_rate 3e-3 --min_lr 3e-4 --grad_accum_steps 1 --save_interval 10 \
	  --time_limit 10:00 --wandb_disabled true --show_logs

test: setup
	$(PYTHON) -m pytest -q -n 2 --dist loadfile --durations=25
	$(MAKE) --no-print-directory -o setup test-slurm26
	$(MAKE) --no-print-directory -o setup test-slurm24 SLURM_TESTS=slurm_versions

# The tests that use the local cluster (-m slurm), again on a newer Slurm release (docs/slurm-versions.md): Debian
# 13's 24.11 or Debian forky's 26.05. scripts/slurm_root.sh builds the release's root filesystem once (a minute or
# two), then runs pytest inside it, accounting included (the release's slurmdbd on its MariaDB). Containers (pyxis
# built against 22.05's libslurm) and nanotron's trainer on CPU through Slurm (nothing of it depends on the release)
# run on the 22.05 cluster only.
# `make test`: the whole suite on 22.05 (~40 min on 2 cores), every Slurm test on 26.05, the newest (~22 min), and on
# 24.11, between the two, only the tests of what differs between releases (SLURM_TESTS=slurm_versions: each
# reproduces a difference outside the launcher and tests how the launcher meets it, ~3 min) rather than all of them
# again (~20 min more). `make test-slurm24` alone runs them all.
SLURM_TESTS ?= slurm
SLURM_MARK = $(SLURM_TESTS) and not containers and not nanotron_cpu
RELEASE_24 := 24.11
RELEASE_26 := 26.05

test-slurm24 test-slurm26: test-slurm%: setup
	PYTHON=$(PYTHON) bash scripts/slurm_root.sh $(RELEASE_$*) $(PYTHON) -m pytest -q -n 2 --durations=15 \
	  --dist loadfile -m "$(SLURM_MARK)"

down:
	$(PYTHON) -m launcher.localcluster down --dir $(SLURM_DIR)
