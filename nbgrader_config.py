# nbgrader configuration of the course: read by `python -m course.grading release|check|grade`
# (the course's front end, see course/grading/) and by nbgrader's own commands run from here.
import os

c = get_config()  # noqa: F821  (provided by traitlets when it loads this file)

# Layout: the instructor's notebooks (solutions and hidden tests) are nbgrader's "source";
# the student notebooks generated from them are its "release" and are committed.
#   solutions/<assignment>/<notebook>.ipynb  ->  exercises/<assignment>/<notebook>.ipynb
# Class submissions: submitted/<student>/<assignment>/<notebook>.ipynb (autograded/, feedback/,
# gradebook.db and course_grades.csv are written next to it; none of them is committed).
c.CourseDirectory.root = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.course_id = "algebra-of-llms"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "exercises"

# nbgrader's exchange with its two open doors closed (course/grading/exchange.py): a submission
# is writable by its student alone, and collect refuses (and logs) a submission whose folder
# belongs to anyone but the student it names, then closes what it collects to the instructor.
# (Named here, not imported: the learner's check reads this file where nbgrader is not installed;
# tests/test_exchange_owner.py checks these are course.grading.exchange.EXCHANGE_CLASSES.)
c.ExchangeFactory.submit = "course.grading.exchange.PrivateSubmit"
c.ExchangeFactory.collect = "course.grading.exchange.OwnerCheckedCollect"

# What a learner sees in place of each solution.
c.ClearSolutions.code_stub = {
    "python": "# YOUR CODE HERE\nraise NotImplementedError('replace this line with your code')",
}

# Grading restores locked cells (the tests) from the source; a deleted test cell is put back too.
c.OverwriteCells.add_missing_cells = True

# Limits of every kernel that runs a notebook (check and grade): no cell of these exercises needs
# more than a few seconds, so a cell past the timeout is interrupted and fails.
c.Execute.timeout = 60
c.Execute.startup_timeout = 120
# Every kernel runs in the course's sandbox (course/grading/sandbox.py: bubblewrap, read-only
# Python, llmcore and llmcheck, an empty working directory, sized tmpfs, no network, own pid
# namespace and user): the bounded Execute below starts its kernels with SandboxedKernelManager,
# here and in plain `nbgrader autograde`. Past the memory limit (everything the kernel's processes
# hold: allocations, memfd and tmpfs files) the sandbox is killed, and a plain allocation raises
# MemoryError first; past the notebook timeout the whole sandbox is killed (loops that ignore
# SIGINT included). Where bwrap cannot
# start, grading refuses; unsandboxed_trusted = True runs trusted notebooks without it.
c.SandboxedKernelManager.memory_limit_mb = 2048
c.SandboxedKernelManager.notebook_timeout = 600
c.SandboxedKernelManager.unsandboxed_trusted = False
# The course's bounded Execute: past the output cap a cell's printing is dropped (the notebook
# stays small); torch and llmcore are imported before the first cell, outside its timeout.
c.BoundedExecute.max_output_chars = 20_000
c.BoundedExecute.preload = ["torch", "llmcore"]
# A released test cell lacks its hidden tests: put them back before nbgrader compares checksums,
# so untouched notebooks raise no "checksum has changed" warning (edited test cells still do).
c.Autograde.sanitize_preprocessors = [
    "nbgrader.preprocessors.ClearOutput",
    "nbgrader.preprocessors.DeduplicateIds",
    "nbgrader.preprocessors.OverwriteKernelspec",
    "course.grading.hidden.RestoreHiddenTests",
    "nbgrader.preprocessors.OverwriteCells",
    "nbgrader.preprocessors.CheckCellMetadata",
]
c.Autograde.autograde_preprocessors = [
    "course.grading.executor.BoundedExecute",
    "nbgrader.preprocessors.IgnorePattern",
    "nbconvert.preprocessors.ClearMetadataPreprocessor",
    "nbgrader.preprocessors.LimitOutput",
    # the trusted verdicts (course/grading/VERDICTS.md): every test cell judged outside the
    # learner's kernel against the solution's records (the same list as course-grade's,
    # course.grading.nbgrader_app.autograde_preprocessors)
    "course.grading.judging.Verdicts",
    "nbgrader.preprocessors.SaveAutoGrades",
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
]
# Feedback shows each test's name, points and message, never the hidden tests' code; its math is
# MathML, written with the page (no MathJax from a CDN, no script), and its styles are cut to what
# it uses: the page course-grade writes, here and in the formgrader's "Generate Feedback"
# (course/grading/feedback.py; course-grade sets the same two, nbgrader_app.course_config).
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
    "course.grading.feedback.HideHiddenTests",
]
c.GenerateFeedback.exporter_class = "course.grading.feedback.FeedbackExporter"
