# The two commands a newcomer runs (README):
#   make demo   set everything up and run the main job end to end on a local 2-node Slurm cluster
#   make test   set everything up and run the test suite on Slurm 22.05, then its Slurm tests on Slurm 24.11 (the
#               same command CI runs); `make test-slurm24` runs only the second part
PYTHON ?= python3
DEMO_DIR := .demo
SLURM_DIR := .slurm
# e.g. `make demo CLUSTER_FLAGS=--accounting`: slurmdbd on a MariaDB of the cluster's own (docs/accounting.md)
CLUSTER_FLAGS ?=

.PHONY: setup cluster demo test test-slurm24 down

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
	$(PYTHON) -m pytest -q -n 2 --dist loadfile
	$(MAKE) --no-print-directory -o setup test-slurm24

# The tests that use the local cluster (-m slurm), again on Debian 13's Slurm 24.11 (docs/slurm-versions.md):
# scripts/slurm24.sh builds its root filesystem once (about a minute), then runs pytest inside it. Accounting
# (Debian 12's slurmdbd), containers (pyxis built against 22.05's libslurm) and nanotron's trainer on CPU through
# Slurm (nothing of it depends on the release) run on the 22.05 cluster only.
test-slurm24: setup
	PYTHON=$(PYTHON) bash scripts/slurm24.sh $(PYTHON) -m pytest -q -n 2 --dist loadfile \
	  -m "slurm and not accounting and not containers and not nanotron_cpu"

down:
	$(PYTHON) -m launcher.localcluster down --dir $(SLURM_DIR)
