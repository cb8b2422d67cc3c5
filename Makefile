# The two commands a newcomer runs (README):
#   make demo   set everything up and run the main job end to end on a local 2-node Slurm cluster
#   make test   set everything up and run the test suite: every test once on Slurm 22.05, and on 26.05 and 24.11
#               the tests of what a release may change (the same command CI runs);
#               `make test-slurm22`, `make test-slurm24` and `make test-slurm26` run every Slurm test on one release
PYTHON ?= python3
DEMO_DIR := .demo
SLURM_DIR := .slurm
# e.g. `make demo CLUSTER_FLAGS=--accounting`: slurmdbd on a MariaDB of the cluster's own (docs/accounting.md)
CLUSTER_FLAGS ?=

.PHONY: setup cluster demo test test-slurm22 test-slurm24 test-slurm26 down

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

# Every test once, on Debian 12's own 22.05, where `make demo` runs and pyxis is built; on the newer releases only the
# tests of what a release may change (pyproject.toml's markers): on 26.05, the newest, `slurm_versions` (each
# difference between releases reproduced outside the launcher and met by it, and what the launcher relies on staying
# the same), the README's main job (`main_job`) and accounting (`accounting`: the release's slurmdbd on its MariaDB);
# on 24.11, between them, `slurm_versions` (its sacct test on that release's slurmdbd among them; the main job and
# accounting's other tests there too would add ~1.7 minutes: RELEASE_TESTS_24="$(RELEASE_TESTS)"). A Slurm test added
# runs once, on 22.05, unless its marker says a release matters to it: the suite grows by its time, not twice it
# (every Slurm test on 26.05 as well took 13.6 of CI's 41.9 minutes). 22.05 in two parts: what keeps both cores busy
# (the tests that need no cluster, containers (pyxis is built against 22.05's libslurm) and nanotron's trainer
# through Slurm, whose 8 ranks need a second release to change nothing) on two workers; then every other Slurm test
# on four (`test-slurm22`). Then 26.05's and 24.11's parts at once: each waits on its Slurm more than it computes
# (3:06 and 3:10 side by side, 4:51 in a row), each in a network namespace of its own; 24.11's output is printed
# after. The root filesystems those parts and the S3 tests run from (built once a machine: scripts/slurm_root.sh,
# scripts/s3_root.sh) are built meanwhile, from the start, in the background (logs/roots.log): on a bare machine
# (CI's) their downloads were minutes of waiting on the way (the S3 server's, ~2.5, inside a host test; the releases'
# before their parts); a part that needs one before it is there waits on the builder's lock. CI is to take under 35
# minutes on 2 quiet cores (bench/README.md: the design, its runs).
HOST_MARK = not slurm or containers or nanotron_cpu
RELEASE_TESTS = slurm_versions or main_job or accounting
RELEASE_TESTS_24 = slurm_versions

# A test file at a time to each pytest-xdist worker, handed out in the order tests/timeline.py sets (the long files
# first: xdist's own order, by number of tests, had the 8-rank files last); each part writes where its time went to
# logs/timeline-<part>.tsv. Two workers where the tests keep both cores busy (the host part: 21 min, 23 with four,
# when they still ran two OpenMP threads a process); four where a Slurm test waits for Slurm (a queue, a requeue's
# delay, a paced run) much of its time and another worker's test takes the CPU meanwhile (every Slurm test on 26.05:
# 21 min with two, the CPU idle a fifth of it; 17 with four, busy 97 %).
# The Slurm parts collect only the files marked `slurm` (tests/marks.py): collecting all of them cost each worker ~6
# CPU s of imports for the tests the part deselects.
XDIST = --dist loadfile --no-loadscope-reorder
CLUSTER_FILES = $(shell $(PYTHON) tests/marks.py slurm)
HOST_WORKERS = -n 2
SLURM_WORKERS = -n 4
TIMELINE = mkdir -p logs && rm -f logs/timeline-$(1).tsv && LAUNCHER_TEST_TIMELINE=logs/timeline-$(1).tsv

test: setup
	mkdir -p logs; (nice -n 10 bash scripts/s3_root.sh && nice -n 10 bash scripts/slurm_root.sh $(RELEASE_26) && \
	  nice -n 10 bash scripts/slurm_root.sh $(RELEASE_24)) > logs/roots.log 2>&1 &
	$(call TIMELINE,22.05-host) $(PYTHON) -m pytest -q $(HOST_WORKERS) $(XDIST) --durations=25 -m "$(HOST_MARK)"
	$(MAKE) --no-print-directory -o setup test-slurm22 SLURM22_MARK="slurm and not containers and not nanotron_cpu"
	mkdir -p logs; $(MAKE) --no-print-directory -o setup test-slurm24 SLURM_TESTS="$(RELEASE_TESTS_24)" \
	  > logs/test-24.11.log 2>&1 & \
	  $(MAKE) --no-print-directory -o setup test-slurm26 SLURM_TESTS="$(RELEASE_TESTS)"; on26=$$?; \
	  wait $$!; on24=$$?; cat logs/test-24.11.log; exit $$((on26 || on24))

# Every Slurm test on Debian 12's 22.05, the host's own cluster (`make test`: those the host part has not run)
SLURM22_MARK ?= slurm
test-slurm22: setup
	$(call TIMELINE,22.05) $(PYTHON) -m pytest -q $(SLURM_WORKERS) $(XDIST) --durations=15 -m "$(SLURM22_MARK)" \
	  $(CLUSTER_FILES)

# The tests that use the local cluster (-m slurm) on a newer Slurm release (docs/slurm-versions.md): Debian 13's
# 24.11 or Debian forky's 26.05. scripts/slurm_root.sh builds the release's root filesystem once (a minute or two),
# then runs pytest inside it, accounting included (the release's slurmdbd on its MariaDB). Containers and nanotron's
# trainer through Slurm run on the 22.05 cluster only.
SLURM_TESTS ?= slurm
SLURM_MARK = ($(SLURM_TESTS)) and not containers and not nanotron_cpu
RELEASE_24 := 24.11
RELEASE_26 := 26.05

test-slurm24 test-slurm26: test-slurm%: setup
	$(call TIMELINE,$(RELEASE_$*)) PYTHON=$(PYTHON) bash scripts/slurm_root.sh $(RELEASE_$*) $(PYTHON) -m pytest -q \
	  $(SLURM_WORKERS) $(XDIST) --durations=15 -m "$(SLURM_MARK)" $(CLUSTER_FILES)

down:
	$(PYTHON) -m launcher.localcluster down --dir $(SLURM_DIR)
