# The course's commands. Each creates (once) and reuses the virtual environment in .venv.
#   make book   build the HTML book into _build/html (strict: any warning or failing cell fails)
#   make test   run every test (unit tests, the strict book build, browser and grading checks)
# Others: make lab, make bench, make exercises, make check NB=..., make grade, make learner-edition,
# make clean.

PYTHON ?= python3
VENV   := .venv
BIN    := $(abspath $(VENV))/bin
STAMP  := $(VENV)/.installed
LAB_SETTINGS := $(VENV)/etc/jupyter/labconfig/default_setting_overrides.json
export PATH := $(BIN):$(PATH)

.PHONY: help venv book book-instructor book-cache test browser sandbox bench lab exercises check grade learner-edition train clean

help:
	@sed -n '1,5p' Makefile | sed 's/^# \{0,1\}//'

$(STAMP): pyproject.toml requirements/constraints.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "Python 3.10 or newer is needed, found " + sys.version.split()[0]'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check \
		-c requirements/constraints.txt -e ".[book,grader,dev]"
	@touch $(STAMP)

venv: $(STAMP)

# The strict build, into the output folder $(1). A failed strict build must fail again when re-run
# unchanged: Sphinx only re-reads changed pages and would not repeat the warnings, so the saved
# environment is dropped on failure.
strict_build = $(BIN)/jupyter-book build . -W -n --keep-going --path-output $(1) $(2) \
	  || { rm -f $(1)/_build/.doctrees/environment.pickle; exit 1; }

book: $(STAMP) book-cache
	$(call strict_build,.)

# The same site with the solution notebooks included (for instructors; never publish it).
book-instructor: $(STAMP) book-cache
	$(BIN)/python -m course.site instructor-toc _build/_toc_instructor.yml
	$(call strict_build,_build/instructor,--toc _build/_toc_instructor.yml)

# The execution cache keys a chapter on its own code only, but chapters run llmcore and the
# figures: when either (or the shipped model) changes, every chapter must run again, so the cache
# is dropped. The grader, the benchmarks and the tests are not part of the key.
book-cache:
	@mkdir -p _build
	@hash=$$(find llmcore course/figures -type f \( -name '*.py' -o -name '*.safetensors' -o -name '*.json' \) \
	    -not -path '*/__pycache__/*' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16); \
	  if [ "$$(cat _build/.llmcore-hash 2>/dev/null)" != "$$hash" ]; then \
	    rm -rf _build/.jupyter_cache; echo "$$hash" > _build/.llmcore-hash; fi

test: $(STAMP) $(LAB_SETTINGS) browser sandbox book-cache
	$(BIN)/python -m pytest

# JupyterLab opens the .md chapters as notebooks on double-click (jupytext's default viewer).
$(LAB_SETTINGS): $(STAMP)
	$(BIN)/jupytext-config --settings-file $@ set-default-viewer markdown myst

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

bench: $(STAMP)
	$(BIN)/python -m course.bench

# JupyterLab on the course: chapters/*.md open as notebooks (jupytext).
lab: $(STAMP) $(LAB_SETTINGS)
	$(BIN)/jupyter lab --notebook-dir=. $(if $(filter 0,$(shell id -u)),--allow-root)

# Train the shipped tiny model again from scratch (about 12 minutes on 2 idle CPU cores; on a
# machine shared with other work, OMP_WAIT_POLICY=PASSIVE make train keeps the threads from spinning).
train: $(STAMP)
	$(BIN)/python -m course.ship

# Instructor: regenerate exercises/ (student notebooks) from solutions/.
exercises: $(STAMP)
	$(BIN)/python -m course.grading release $(ARGS)

# Learner: check one notebook against its visible tests, e.g. make check NB=exercises/01_matmul/matmul.ipynb
check: $(STAMP)
	$(BIN)/python -m course.grading check $(NB)

# Instructor: grade every submission in submitted/<student>/<assignment>/ (each notebook in the
# sandbox, in parallel), write feedback and course_grades.csv. Pass options with ARGS="--force ...".
grade: $(STAMP) sandbox
	$(BIN)/python -m course.grading grade $(ARGS)

# Instructor: the learner edition (book sources, exercises, llmcore; no solutions/, no hidden tests,
# no grading data) in OUT (default: learner-edition/).
learner-edition: $(STAMP)
	$(BIN)/python -m course.grading edition $(or $(OUT),learner-edition)

clean:
	rm -rf _build
