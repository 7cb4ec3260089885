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

# JupyterLab on the course: chapters/*.md open as notebooks (jupytext).
lab: $(STAMP)
	$(BIN)/jupyter lab --notebook-dir=.

# Train the shipped tiny model again from scratch (about 15 minutes on 2 CPU cores).
train: $(STAMP)
	$(BIN)/python -m llmcore.train

# Instructor: regenerate exercises/ (student notebooks) from solutions/.
exercises: $(STAMP)
	$(BIN)/python -m llmcore.grading release

# Learner: check one notebook against its visible tests, e.g. make check NB=exercises/01_matmul/matmul.ipynb
check: $(STAMP)
	$(BIN)/python -m llmcore.grading check $(NB)

# Instructor: grade every submission in submitted/<student>/<assignment>/, write feedback and grades.csv.
grade: $(STAMP)
	$(BIN)/python -m llmcore.grading grade

clean:
	rm -rf _build
