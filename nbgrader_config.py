# nbgrader configuration of the course: read by `python -m llmcore.grading release|check|grade`
# (the course's front end, see llmcore/grading.py) and by nbgrader's own commands run from here.
import os

c = get_config()  # noqa: F821  (provided by traitlets when it loads this file)

# Layout: the instructor's notebooks (solutions and hidden tests) are nbgrader's "source";
# the student notebooks generated from them are its "release" and are committed.
#   solutions/<assignment>/<notebook>.ipynb  ->  exercises/<assignment>/<notebook>.ipynb
# Class submissions: submitted/<student>/<assignment>/<notebook>.ipynb (autograded/, feedback/,
# gradebook.db and grades.csv are written next to it; none of them is committed).
c.CourseDirectory.root = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.course_id = "algebra-of-llms"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "exercises"

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
# llmcore.grading's bounded Execute: past the memory limit an allocation raises MemoryError (the
# machine stays up); past the output cap a cell's printing is dropped (the notebook stays small);
# torch and llmcore are imported before the first cell, outside its timeout.
c.BoundedExecute.memory_limit_mb = 2048
c.BoundedExecute.max_output_chars = 20_000
c.BoundedExecute.preload = ["torch", "llmcore"]
