# The course's commands. Each creates (once) and reuses the virtual environment in .venv.
#   make book   build the HTML book into _build/html (strict: any warning or failing cell fails)
#   make test   run every test (unit tests, the strict book build, browser and grading checks)
# Others: make lab, make bench, make exercises, make check NB=..., make grade, make clean.

PYTHON ?= python3
VENV   := .venv
BIN    := $(abspath $(VENV))/bin
STAMP  := $(VENV)/.installed
export PATH := $(BIN):$(PATH)

.PHONY: help venv book book-instructor test browser bench lab exercises check grade train clean

help:
	@sed -n '1,5p' Makefile | sed 's/^# \{0,1\}//'

$(STAMP): pyproject.toml requirements/constraints.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "Python 3.10 or newer is needed, found " + sys.version.split()[0]'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check \
		-c requirements/constraints.txt -e ".[book,grader,dev]"
	@touch $(STAMP)

venv: $(STAMP)

book: $(STAMP)
	$(BIN)/jupyter-book build . -W -n --keep-going

# The same site with the solution notebooks included (for instructors; not for publishing).
book-instructor: $(STAMP)
	LLMCORE_BOOK_SOLUTIONS=1 $(BIN)/jupyter-book build . -W -n --keep-going --path-output _build/instructor

test: $(STAMP) browser
	$(BIN)/python -m pytest

# Debian's Chromium for the real-browser checks of the built site (installed only if missing).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	    || echo "warning: could not install chromium; the browser checks will be skipped"; \
	  else echo "note: chromium is not installed; the browser checks will be skipped"; fi; }

bench: $(STAMP)
	$(BIN)/python -m llmcore.bench

lab: $(STAMP)
	$(BIN)/jupyter lab --notebook-dir=.

clean:
	rm -rf _build
