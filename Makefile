# The course's commands. Each creates (once) and reuses the virtual environment in .venv.
#   make book   build the HTML book into _build/html (strict: any warning or failing cell fails)
#   make test   run every test (unit tests, the strict book build, browser and grading checks)
# Install one audience's packages only: make learner, make instructor, make dev (README).
# Others: make lab, make lab-instructor, make bench, make exercises, make check NB=..., make grade,
# make learner-edition, make hub, make clean.

PYTHON ?= python3
VENV   := .venv
BIN    := $(abspath $(VENV))/bin
STAMP  := $(VENV)/.installed
export PATH := $(BIN):$(PATH)

# Learners on Linux take torch from PyTorch's CPU wheel index (about 0.7 GB instead of several GB
# of CUDA libraries); `make learner TORCH_INDEX=` takes the plain pin instead (CUDA on Linux).
# macOS has only one build (Apple's MPS GPU included), so the plain pin is right there.
TORCH_VERSION := $(shell sed -n 's/^torch==//p' requirements/constraints.txt)
ifeq ($(shell uname -s),Linux)
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
endif
# Python compiles what a learner imports when it is first imported; compiling all of it at
# install time doubles the time and adds 0.2 GB.
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check

.PHONY: help venv learner instructor dev book book-instructor book-cache test test-fast browser bench lab \
	lab-instructor sandbox exercises check grade learner-edition train hub clean

help:
	@sed -n '1,6p' Makefile | sed 's/^# \{0,1\}//'

new_venv = $(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "Python 3.10 or newer is needed, found " + sys.version.split()[0]' \
	&& { test -x $(BIN)/python || $(PYTHON) -m venv $(VENV); }

# $(call has_profile,PROFILE): .venv already holds PROFILE (this checkout's llmcore and every
# requirement of the extra, at pinned versions: course/installed.py). An environment installed by
# hand (the README's pip lines, which write no stamp) is then stamped, not installed again.
has_profile = test -x $(BIN)/python && (cd $(CURDIR) && $(BIN)/python -m course.installed $(1) 2>/dev/null)

# The full install (every extra: dev includes instructor, which includes learner).
$(STAMP): pyproject.toml requirements/constraints.txt
	@if $(call has_profile,dev); then echo "the dev profile is installed in $(VENV) already"; else \
	  $(new_venv) && $(PIP) -c requirements/constraints.txt -e ".[dev]"; fi
	@touch $(STAMP)

# One audience's install (learner or instructor). An environment that has the full install, or
# the profile installed by hand, has it already, so it is only stamped, never installed again.
$(VENV)/.installed-%: pyproject.toml requirements/constraints.txt
	@if [ -f $(STAMP) ]; then touch $@; \
	elif $(call has_profile,$*); then echo "the $* profile is installed in $(VENV) already"; touch $@; else \
	  $(new_venv) && \
	  $(if $(and $(filter learner,$*),$(TORCH_INDEX)),$(PIP) --no-compile torch==$(TORCH_VERSION) --index-url $(TORCH_INDEX) && ) \
	  $(PIP) $(if $(filter learner,$*),--no-compile) -c requirements/constraints.txt -e ".[$*]" && \
	  touch $@; fi

venv dev: $(STAMP)
learner: $(VENV)/.installed-learner
instructor: $(VENV)/.installed-instructor

# The strict build, into the output folder $(1). A failed strict build must fail again when re-run
# unchanged: Sphinx only re-reads changed pages and would not repeat the warnings, so the saved
# environment is dropped on failure.
strict_build = $(BIN)/jupyter-book build . -W -n --keep-going --path-output $(1) $(2) \
	  || { rm -f $(1)/_build/.doctrees/environment.pickle; exit 1; }

book: $(VENV)/.installed-instructor book-cache
	$(call strict_build,.)

# The same site with the solution notebooks included (for instructors; never publish it).
book-instructor: $(VENV)/.installed-instructor book-cache
	$(BIN)/python -m course.site instructor-toc _build/_toc_instructor.yml
	$(call strict_build,_build/instructor,--toc _build/_toc_instructor.yml)

# The execution cache keys a chapter on its own code only, but chapters run llmcore and the
# figures: when either (or the shipped model) changes, every chapter must run again, so the cache
# is dropped (course/site.py: drop_stale_cache; the tests' build does the same). The grader, the
# benchmarks and the tests are not part of the key.
# (Its targets install the instructor profile first: it needs the course's Python.)
book-cache:
	@$(BIN)/python -m course.site drop-stale-cache

# Two tiers (README, "Tests"): test-fast is the developer's loop (no grading, no book, no servers,
# no installs: the tests not marked slow), test the whole house; both print their slowest tests.
test: $(STAMP) browser sandbox book-cache hub
	$(BIN)/python -m pytest --durations=25

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" -q --durations=10

# The environment every JupyterHub user's server runs in (deploy/README.md, tests/test_hub.py):
# the hub profile of the course's learner edition (written to $(HUB_ENV)/course: no solutions, no
# hidden tests), from a Python every user can run, with JupyterHub's proxy from npm. It needs no
# install of the course in .venv: course.hub runs on a bare Python 3.10+. torch comes from the
# same index as make learner's (PyTorch's CPU wheels on Linux; `make hub HUB_TORCH_INDEX=` takes
# the plain pin, the CUDA build). A change to the course's code writes the edition again
# (seconds; the packages are reinstalled only when the pins change). Without npm it is not built
# and the hub test is skipped with the reason; any other failure fails the target.
HUB_ENV := $(VENV)/hub
HUB_TORCH_INDEX ?= $(TORCH_INDEX)
NPM ?= npm
HUB_SOURCES := $(shell find llmcore llmcheck course deploy exercises -type f -not -path '*/__pycache__/*' 2>/dev/null) nbgrader_config.py
hub: $(HUB_ENV)/.installed
$(HUB_ENV)/.installed: pyproject.toml requirements/constraints.txt requirements/npm.txt $(HUB_SOURCES)
	@if command -v $(NPM) >/dev/null 2>&1; then \
	  $(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "Python 3.10 or newer is needed, found " + sys.version.split()[0]' && \
	  $(PYTHON) -m course.hub env $(HUB_ENV) $(if $(HUB_TORCH_INDEX),--torch-index $(HUB_TORCH_INDEX)) && \
	  touch $@; \
	else echo "note: npm is not installed; the hub test will be skipped"; fi

# $(call apt_install,COMMAND,PACKAGE,WHAT HAPPENS WITHOUT IT): install a Debian package when its
# command is missing and we are root with apt-get; otherwise say what is lost.
apt_install = command -v $(1) >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(2) >/dev/null) \
	    || echo "warning: could not install $(2); $(3)"; \
	  else echo "note: $(2) is not installed; $(3)"; fi; }

# Debian's Chromium for the real-browser checks of the built site (installed only if missing).
browser:
	@$(call apt_install,chromium,chromium,the browser checks will be skipped)

# Debian's bubblewrap, the sandbox every graded notebook's kernel runs in (installed only if
# missing; without it grading refuses to run and the sandbox tests are skipped with the reason).
sandbox:
	@$(call apt_install,bwrap,bubblewrap,grading will refuse to run)

bench: $(VENV)/.installed-instructor
	$(BIN)/python -m course.bench

# JupyterLab on the course: chapters/*.md open as notebooks (jupytext); where nbgrader is installed
# (instructor, hub) exercises have its Validate button, and the learner's lab leaves out its
# instructor tools (formgrader, Create Assignment, course list); lab-instructor keeps them
# (course/lab.py). A learner checks an exercise with course-check (make check).
lab: $(VENV)/.installed-learner
	$(BIN)/python -m course.lab

lab-instructor: $(VENV)/.installed-instructor
	$(BIN)/python -m course.lab --instructor

# Train the shipped tiny model again from scratch (about 12 minutes on 2 idle CPU cores; on a
# machine shared with other work, OMP_WAIT_POLICY=PASSIVE make train keeps the threads from spinning).
train: $(VENV)/.installed-instructor
	$(BIN)/python -m course.ship

# Instructor: regenerate exercises/ (student notebooks) from solutions/.
exercises: $(VENV)/.installed-instructor
	$(BIN)/python -m course.grading release $(ARGS)

# Learner: check one notebook against its visible tests, e.g. make check NB=exercises/01_matmul/matmul.ipynb
check: $(VENV)/.installed-learner
	$(BIN)/course-check $(NB)

# Instructor: grade every submission in submitted/<student>/<assignment>/ (each notebook in the
# sandbox, in parallel), write feedback and course_grades.csv. Pass options with ARGS="--force ...".
grade: $(VENV)/.installed-instructor sandbox
	$(BIN)/python -m course.grading grade $(ARGS)

# Instructor: the learner edition (book sources, exercises, llmcore; no solutions/, no hidden tests,
# no grading data) in OUT (default: learner-edition/).
learner-edition: $(VENV)/.installed-instructor
	$(BIN)/python -m course.grading edition $(or $(OUT),learner-edition)

clean:
	rm -rf _build
