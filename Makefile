# kvprof: the commands the README starts with.
#
#   make demo    kvcached (baseline preset) under load, watched live by `kvprof top` (q quits)
#   make test    the whole suite, then the protocol tests again under ASan+UBSan
#
# Everything goes through scripts/provision.sh first (quick once done). As root
# it all just runs; as an ordinary user only apt/mount (in provision) and the
# BPF tests and the demo use sudo.

VENV   := .venv
PYTEST := $(VENV)/bin/pytest
RUFF   := $(VENV)/bin/ruff
MYPY   := $(VENV)/bin/mypy
ASAN_KVCACHED := server/build-asan/kvcached
SANITIZED_TESTS := tests/test_protocol.py tests/test_bad_input.py
# Run by `make vm-test` (after the guest has run), not by the main pytest run.
VM_TESTS := tests/test_vm.py

ifeq ($(shell id -u),0)
  AS_ROOT :=
else
  # -E keeps KVCACHED_BIN and friends; no cache or bytecode written as root in the user's tree.
  AS_ROOT := sudo -E PYTHONDONTWRITEBYTECODE=1
endif

.PHONY: all setup build wheel install test lint demo clean distclean

all: build

setup:
	bash scripts/provision.sh

build:
	$(MAKE) -C server
	$(MAKE) -C server sanitize

# dist/kvprof-<version>-py3-none-any.whl, offline with the .venv's setuptools; setuptools'
# staging in build/ goes first, so that no file since deleted from kvprof/ reaches the wheel.
wheel: setup
	rm -rf build/lib build/bdist.*
	$(VENV)/bin/pip wheel --no-deps --no-build-isolation -q -w dist .

# kvcached, kvload and kvprof-atomics (kvprof bench's) into $(PREFIX)/bin, where an
# installed kvprof finds them on PATH; needs gcc, make and systemtap-sdt-dev (docs/install.md).
PREFIX ?= /usr/local
install:
	$(MAKE) -C server install PREFIX=$(abspath $(PREFIX))

test: setup build vm-check vm-test
	$(MAKE) -C server check
	$(MAKE) fuzz FUZZ_SECONDS=30
ifeq ($(AS_ROOT),)
	$(PYTEST) tests -v --ignore=$(VM_TESTS)
else
	@echo "make test: BPF tests (-m bpf) run with sudo -E, the rest as $$(id -un)"
	$(PYTEST) tests -v -m 'not bpf' --ignore=$(VM_TESTS)
	$(AS_ROOT) $(PYTEST) tests -v -m bpf -p no:cacheprovider --ignore=$(VM_TESTS) || [ $$? -eq 5 ]  # 5: none collected
endif
	KVCACHED_BIN=$(ASAN_KVCACHED) $(PYTEST) $(SANITIZED_TESTS)

.PHONY: vm-test vm-check fuzz soak

# record and top attached and detached SOAK_CYCLES times (normal end, SIGINT, SIGKILL)
# on a kvcached under kvload --verify; bench/soak.py. Not part of `make test`, which
# runs 5 cycles of it (tests/test_soak.py).
SOAK_CYCLES ?= 50
soak: setup build
	$(AS_ROOT) $(VENV)/bin/python bench/soak.py --cycles $(SOAK_CYCLES)

# libFuzzer on the protocol parser and command processing (server/fuzz/, ASan+UBSan),
# FUZZ_SECONDS long. New inputs go to build/fuzz/corpus, crashes to build/fuzz/crash-*;
# the committed seeds (server/fuzz/corpus) are read, not written. Inputs are kept under
# 20,000 bytes (faster runs); lines past the 64 KB limit are tests/test_bad_input.py's.
FUZZ_SECONDS ?= 300
fuzz: setup
	$(MAKE) -C server fuzz
	mkdir -p build/fuzz/corpus
	server/build-fuzz/fuzz_protocol -max_total_time=$(FUZZ_SECONDS) -max_len=20000 -print_final_stats=1 \
	    -artifact_prefix=build/fuzz/ build/fuzz/corpus server/fuzz/corpus


# A two-socket, two-NUMA-node Debian guest under QEMU TCG records kvcached with
# kvprof; the host then checks the profile it wrote. The guest image is cached
# in build/vm (a few minutes to build on a fresh clone). scripts/vm-test.sh.
vm-test: setup build
	$(AS_ROOT) bash scripts/vm-test.sh --out build/vm/out
	KVPROF_VM_OUT=build/vm/out $(PYTEST) $(VM_TESTS) -v -p no:cacheprovider

# vagrant validate (offline, no box) and shellcheck -S warning on every shell script.
vm-check: setup
	bash scripts/vm-check.sh

.PHONY: vagrant-box vagrant-test

# A local libvirt box of Debian 12 with everything provision.sh installs, added
# to Vagrant as kvprof-local/debian12 (cached in build/vagrant). scripts/vagrant-box.sh.
vagrant-box:
	bash scripts/provision.sh --vagrant
	$(AS_ROOT) bash scripts/vagrant-box.sh

# `vagrant up` of the Vagrantfile with that box under QEMU TCG, in a network
# namespace of its own; doctor, topology and a record inside, then destroy.
# Not part of `make test`: it takes long (README.md gives the times measured).
# scripts/vagrant-test.sh.
vagrant-test: vagrant-box
	$(AS_ROOT) bash scripts/vagrant-test.sh

lint:
	$(RUFF) check .
	$(RUFF) format --check .
	$(MYPY) kvprof
	$(MAKE) -C server B=build-lint WERROR=1

.PHONY: results-page pictures doc-examples

# docs/results.md from bench/results/*.json (the benchmarks write them); tests/test_results_page.py
# fails when the committed page is not what the data gives.
results-page:
	$(VENV)/bin/python scripts/results_page.py

# The pictures in the docs, made from the demo: kvprof top's screens and the flame graphs
# (docs/images/). scripts/pictures.py.
pictures: setup build
	$(AS_ROOT) $(VENV)/bin/python scripts/pictures.py

# The example outputs in docs/*.md (between <!-- output: NAME --> markers), from the commands
# run on the demo server. scripts/doc_examples.py.
doc-examples: setup build
	$(AS_ROOT) $(VENV)/bin/python scripts/doc_examples.py

# `kvprof demo` (no root: the server's own stats, printed) is the way to see it without BPF.
demo: setup build
	$(AS_ROOT) $(VENV)/bin/kvprof top --demo

clean:
	$(MAKE) -C server clean
	rm -rf server/build-lint .pytest_cache .mypy_cache .ruff_cache .hypothesis *.egg-info dist build/lib build/bdist.*
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
