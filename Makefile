# The two commands of the quick start: `make demo` and `make test`. Each installs what it needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Most tests wait on processes and sshd, not on a core: more workers than the 2 cores CI has.
TEST_WORKERS ?= 4

.PHONY: demo test lint sshd-deps bench clean

$(STAMP): pyproject.toml Makefile  # the install recipe is part of what was installed
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# compat: the tree on sys.path by a plain .pth line, as a wheel's files are. The default editable finder is an
	@# import hook that site.py runs at every interpreter start: 17 ms of pathlib/re/fnmatch imports each time
	@# (python -c pass: 28.6 → 11.3 ms here), paid by each CLI call and each probe in the test containers.
	$(PY) -m pip install -q --disable-pip-version-check -e '.[trainer,dev,hf]' --config-settings editable_mode=compat
	@# The paper authors' reference DFlash code, for the interop tests (tests/trainer_hf/test_reference_interop.py).
	@# --no-deps: its requirements pin tqdm/datasets/requests (and its `local` extra torch/transformers) at
	@# versions we must not take; its model code needs only torch and transformers, which are installed above.
	$(PY) -m pip install -q --disable-pip-version-check --no-deps dflash==0.1.0
	@touch $@

# The real-sshd tests need OpenSSH's server. As root we install it when missing; otherwise those
# tests skip and say why (CI runs as root, so there they run).
sshd-deps:
	@if ! command -v sshd >/dev/null && [ ! -x /usr/sbin/sshd ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing openssh-server (needed by the loopback sshd tests)"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server) >/dev/null; \
	  else echo "openssh-server missing and not root: sshd tests will skip"; fi; \
	fi
	@if [ "$$(id -u)" = 0 ]; then mkdir -p /run/sshd; fi
	@# The end-to-end tests' containers are real LXC system containers (tests/harness/bin/pct): as root, lxc is
	@# installed like openssh-server; without root the namespace stand-in (bin/pct-ns) runs and the summary says so.
	@if ! command -v lxc-start >/dev/null || [ ! -x /usr/sbin/init.lxc ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing lxc (the end-to-end tests' containers)"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends lxc) >/dev/null; \
	  else echo "lxc missing and not root: the end-to-end tests use the namespace stand-in"; fi; \
	fi
	@# `gpus --watch` is tested in a real terminal: tmux sends its keys and reads its screen.
	@if ! command -v tmux >/dev/null && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing tmux (the live view's terminal test)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux) >/dev/null; \
	fi

test: $(STAMP) sshd-deps
	$(VENV)/bin/ruff check dflashctl trainer tests benchmarks
	@# As root the sshd tests must run: a missing sshd is then a failure, not a skip. The Hugging Face
	@# suite must run too (its stack was installed above), and py-spy's tests (its wheel from pip's local sources,
	@# unpacked into a temp dir, never into the venv). Tests are independent: $(TEST_WORKERS) processes.
	@# As root LXC must work too: a missing or failing LXC fails the tests (DFLASHCTL_REQUIRE_LXC).
	if [ "$$(id -u)" = 0 ]; then export DFLASHCTL_REQUIRE_SSHD=1 DFLASHCTL_REQUIRE_LXC=1; fi; export DFLASHCTL_REQUIRE_HF=1; \
	  export DFLASHCTL_REQUIRE_PYSPY=1; \
	  $(PY) -m pytest -p no:cacheprovider -n $(TEST_WORKERS)

demo: $(STAMP)
	@bash scripts/demo.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check dflashctl trainer tests benchmarks

clean:
	rm -rf $(VENV) .dflash .pytest_cache
