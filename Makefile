# gcis-etl: `make demo` runs the main job on the embedded default, `make test` runs the test suite.
# Both install what they need first (Debian packages as root, a project virtualenv in .venv/, MinIO),
# idempotently: a second run only checks.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TOOLS_BIN ?= $(HOME)/.cache/gcis-etl/bin
MINIO_VERSION := v0.0.0-20260212201848-7aac2a2c5b7c
MINIO := $(TOOLS_BIN)/minio
TEST_WORKERS ?= $(shell n=$$(nproc); echo $$(( n < 4 ? n + 1 : 5 )))  # pytest processes (see test:)
# Go builds MinIO: the one on PATH, else the machine image's (not on PATH under sudo or cron).
GO ?= $(or $(shell command -v go 2>/dev/null),$(wildcard /usr/local/go/bin/go))
export GCIS_MINIO_BIN := $(MINIO)

# Debian 12 packages: libvips + its headers (pyvips is built against them), exiftool, LittleCMS tools,
# JPEG 2000 encoders, ImageMagick and libvips' CLI (benchmarks), sqlite3 (the ledger recovery the README advises), Redis (Celery broker), iipsrv + lighttpd
# (with mod_magnet, for deploy/iipsrv/region-guard.lua), Chromium (Mirador in the consumer tests), libmagic (the IIIF Image API validator).
SYSTEM_PACKAGES := build-essential pkg-config python3-venv python3-dev libvips-dev libvips-tools \
	libimage-exiftool-perl liblcms2-utils libopenjp2-tools grokj2k-tools imagemagick \
	sqlite3 redis-server rabbitmq-server iipimage-server lighttpd lighttpd-modules-lua chromium libmagic1

.PHONY: demo test bench serve worker system-deps python-deps minio mirador clean

demo: system-deps python-deps
	$(VENV)/bin/gcis-etl demo

# The suite runs one pytest process more than the cores (at most 5), a test file in one process (its fixtures are
# shared): it is mostly end-to-end runs that wait on servers and child processes, and with one per core about a
# fifth of the cores' time went idle (TEST_WORKERS=N to choose). Compiled first: it starts hundreds of Python processes
# (CLI runs, conversion children, Celery workers), and where PYTHONDONTWRITEBYTECODE is set each would compile
# the project's modules again. It ends with its 25 slowest tests, where to look when it nears its 20-minute budget.
# One file alone: `.venv/bin/python -m pytest tests/test_X.py`.
test: system-deps python-deps minio mirador
	$(PY) -m compileall -q gcis_etl connectors migrations tests
	$(PY) -m pytest --numprocesses $(TEST_WORKERS) --dist loadfile --durations 25

# The consumer on loopback: sync the cache, then lighttpd + iipsrv (and Mirador at /viewer/) until Ctrl-C.
serve: system-deps python-deps mirador
	deploy/iipsrv/serve

bench: system-deps python-deps
	$(PY) bench/convert.py
	$(PY) bench/jp2.py
	$(PY) bench/celery.py
	$(PY) bench/overlap.py

# One worker of the Celery pool on this machine (reads ./config.yaml or $GCIS_CONFIG; needs the broker).
worker: system-deps python-deps
	$(VENV)/bin/celery -A gcis_etl.worker worker --loglevel INFO

system-deps:
	@missing=$$(for p in $(SYSTEM_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:" $$missing; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
		systemctl disable --now rabbitmq-server.service epmd.socket epmd.service 2>/dev/null || true; \
	fi

python-deps: $(VENV)/.installed

$(VENV)/.installed: requirements.txt setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $@

# MinIO for the S3 tests, built once per machine (about 5 minutes the first time) and cached.
minio: $(MINIO)

$(MINIO):
	@test -n "$(GO)" || { echo "Go 1.24 or newer (the pinned MinIO's go.mod) is needed to build MinIO for the tests: none on PATH nor at /usr/local/go/bin/go (or set GO=/path/to/go)"; exit 1; }
	mkdir -p $(TOOLS_BIN)
	GOBIN=$(TOOLS_BIN) $(GO) install github.com/minio/minio@$(MINIO_VERSION)

# Mirador (npm registry, pinned by version and integrity) for the consumer tests and `make serve`.
# npm comes with Node.js; Debian's npm package only when there is none (it conflicts with NodeSource's nodejs).
mirador:
	@command -v npm >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm; }
	deploy/iipsrv/install-mirador

clean:
	rm -rf $(VENV) var build *.egg-info
