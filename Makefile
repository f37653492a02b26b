# The README's two commands: `make demo` and `make test`. Both set up .venv first (a no-op when current).
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.evalstop-installed

.PHONY: demo test check lint bench reproduce clean setup chromium postgres slurm

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e '.[train,dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(PY) scripts/demo.py

# Three pytest-xdist workers: most tests wait on servers, children, leases, Ray and Slurm, so three at
# a time fill 2 cores (BENCHMARKS.md has the times); TEST_WORKERS=1 runs them one at a time.
TEST_WORKERS ?= 3
test: $(STAMP) chromium postgres slurm
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal

# The fast tier, at most 2 minutes on 2 cores: the pure core, the contract's embedded half, the
# architecture and packaging rules and the doctests (no server, no PostgreSQL, no trainer).
CHECK_TESTS := tests/core tests/clients/test_contract.py tests/test_architecture.py tests/test_packaging.py \
	evalstop_trl platform_sim
check: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -k "not postgres and not http" $(CHECK_TESTS)

# The dashboard's browser tests drive the Debian chromium through Playwright (Playwright's own
# browser download does not work here); install it when it is missing.
chromium:
	@command -v chromium >/dev/null 2>&1 || { echo "installing chromium for the browser tests"; \
	  $$( [ "$$(id -u)" = 0 ] || echo sudo ) env DEBIAN_FRONTEND=noninteractive sh -c 'apt-get update -qq && apt-get install -y -qq chromium' >/dev/null; }

# The store and replica tests start a throwaway PostgreSQL cluster (initdb + pg_ctl, as the postgres
# user when root); install the server binaries when they are missing.
postgres:
	@command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  echo "installing postgresql for the store tests"; \
	  $$( [ "$$(id -u)" = 0 ] || echo sudo ) env DEBIAN_FRONTEND=noninteractive sh -c 'apt-get update -qq && apt-get install -y -qq postgresql' >/dev/null; }

# The Slurm backend's tests start a single-host Slurm (munged, slurmctld, slurmd, by hand as root, no
# systemd or cgroups: tests/slurm_cluster.py); install the Debian packages when they are missing.
slurm:
	@command -v slurmctld >/dev/null 2>&1 || ls /usr/sbin/slurmctld >/dev/null 2>&1 || { \
	  echo "installing slurm for the Slurm backend's tests"; \
	  $$( [ "$$(id -u)" = 0 ] || echo sudo ) env DEBIAN_FRONTEND=noninteractive sh -c 'apt-get update -qq && apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge' >/dev/null; }

lint: $(STAMP)
	$(VENV)/bin/ruff check evalstop_trl platform_sim tests scripts

bench: $(STAMP)
	$(PY) scripts/bench_sim.py

reproduce: $(STAMP)
	$(VENV)/bin/platform-sim reproduce --seeds 30 --out results

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
