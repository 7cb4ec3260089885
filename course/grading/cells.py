"""nbgrader's cell metadata and its executor's settings, read without nbgrader.

The learner's check (:mod:`.check`) runs a notebook through nbclient (nbconvert's
``ExecutePreprocessor``) with the grader's limits, so the learner's install needs no nbgrader (its
gradebook, database and server extensions weigh about 70 MB; README, "Install"). What the check
needs of nbgrader's format is here, with nbgrader's meaning (nbgrader 0.9: ``nbgrader.utils`` and
``nbgrader.preprocessors.Execute``); tests/test_check_cells.py holds both side by side on every
cell of the course's notebooks, where nbgrader is installed.

A cell's nbgrader metadata (``cell.metadata.nbgrader``): ``grade`` (it is worth ``points``),
``solution`` (the learner writes it), ``locked`` (read-only), ``grade_id`` (its name). A *test
cell* is a grade cell that is not a solution cell.
"""

from __future__ import annotations

import functools


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def is_grade(cell) -> bool:
    """Whether the cell is worth points (nbgrader's ``is_grade``)."""
    return bool(_meta(cell).get("grade", False))


def is_solution(cell) -> bool:
    """Whether the learner writes the cell (nbgrader's ``is_solution``)."""
    return bool(_meta(cell).get("solution", False))


def is_locked(cell) -> bool:
    """Whether the cell is read-only (nbgrader's ``is_locked``: a grade cell that is not a
    solution is locked whatever its flag says)."""
    if not _meta(cell) or is_solution(cell):
        return False
    return is_grade(cell) or bool(_meta(cell).get("locked", False))


def is_test(cell) -> bool:
    """Whether the cell is a test cell: a code cell worth points that the learner does not
    write."""
    return cell.get("cell_type") == "code" and is_grade(cell) and not is_solution(cell)


def test_score(cell) -> tuple[float, float]:
    """(score, points) of an executed test cell, as nbgrader scores it: 0 at the first error or
    stderr output, the number an ``execute_result`` shows (partial credit, between 0 and the
    points; anything else counts as full), else full points."""
    if not is_test(cell):
        raise ValueError(f"test_score: expected a test cell (a code grade cell that is not a "
                         f"solution), got a {cell.get('cell_type')} cell with nbgrader metadata "
                         f"{dict(_meta(cell))}")
    points = float(_meta(cell)["points"])
    for out in cell.get("outputs", []):
        kind = out.get("output_type")
        if kind == "error" or (kind == "stream" and out.get("name") == "stderr"):
            return 0.0, points
        if kind == "execute_result":
            return _partial(out, points), points
    return points, points


def _partial(output, points: float) -> float:
    text = output.get("data", {}).get("text/plain", "")
    if isinstance(text, list):
        if len(text) != 1:
            return points
        text = text[0]
    try:
        value = float(text)
    except (TypeError, ValueError):
        return points
    if value > points:
        raise ValueError(f"a test cell's partial credit is {value}, more than its {points:g} "
                         "points")
    return value if value >= 0 else points


def metadata_problems(nb) -> list[str]:
    """What nbgrader's metadata validator refuses in a notebook, each a sentence: a graded,
    solution or read-only cell without a grade_id, a grade cell without points, and a grade_id
    used twice (a copied cell keeps the original's name)."""
    problems, seen = [], set()
    for index, cell in enumerate(nb.cells):
        meta = _meta(cell)
        if not (meta.get("grade") or meta.get("solution") or meta.get("locked")):
            continue
        grade_id = meta.get("grade_id")
        if not grade_id:
            problems.append(f"cell {index} is an nbgrader cell without a grade_id")
            continue
        if meta.get("grade") and "points" not in meta:
            problems.append(f"the grade cell {grade_id} has no points")
        if grade_id in seen:
            problems.append(f"the grade_id {grade_id} appears more than once (a copied cell?)")
        seen.add(grade_id)
    return problems


def type_changes(nb) -> list[tuple[str, str]]:
    """(released type, type now) of every nbgrader cell whose type was changed (a code cell made
    markdown hides its code from the grader)."""
    changed = []
    for cell in nb.cells:
        meta = _meta(cell)
        if not (is_grade(cell) or is_solution(cell) or is_locked(cell)):
            continue
        if meta.get("cell_type") and meta["cell_type"] != cell.cell_type:
            changed.append((meta["cell_type"], cell.cell_type))
    return changed


EXECUTE_DEFAULTS = {
    "timeout": 30,
    "interrupt_on_timeout": True,
    "allow_errors": True,
    "raise_on_iopub_timeout": True,
    "error_on_timeout": {"ename": "CellTimeoutError", "evalue": "",
                         "traceback": ["\x1b[0;31mCellTimeoutError\x1b[0m: No reply from kernel "
                                       "before timeout"]},
    "extra_arguments": [],
}
"""nbgrader's Execute settings that differ from nbconvert's (nbgrader_config.py's
``c.Execute.*`` overrides them, for both classes)."""


@functools.cache
def execute_class() -> type:
    """An nbconvert ``ExecutePreprocessor`` named ``Execute`` with nbgrader's settings: a cell
    past its timeout is interrupted and gets a ``CellTimeoutError``, an error does not stop the
    notebook, a kernel's error reply without an error output gets one (nbgrader 0.9's
    ``on_cell_executed``). ``c.Execute.*`` configuration applies to it as to nbgrader's."""
    from jupyter_client.manager import AsyncKernelManager
    from nbconvert.preprocessors import ExecutePreprocessor
    from nbformat.notebooknode import NotebookNode
    from traitlets import Bool, Dict, Integer, List

    class Execute(ExecutePreprocessor):
        timeout = Integer(EXECUTE_DEFAULTS["timeout"], allow_none=True,
                          help=ExecutePreprocessor.timeout.help).tag(config=True)
        interrupt_on_timeout = Bool(EXECUTE_DEFAULTS["interrupt_on_timeout"]).tag(config=True)
        allow_errors = Bool(EXECUTE_DEFAULTS["allow_errors"])
        raise_on_iopub_timeout = Bool(EXECUTE_DEFAULTS["raise_on_iopub_timeout"]).tag(config=True)
        error_on_timeout = Dict(EXECUTE_DEFAULTS["error_on_timeout"]).tag(config=True)
        extra_arguments = List(EXECUTE_DEFAULTS["extra_arguments"]).tag(config=True)

        def __init__(self, *args, **kwargs):
            kwargs.setdefault("kernel_manager_class", AsyncKernelManager)
            super().__init__(*args, **kwargs)
            self.enabled = True

        def on_cell_executed(self, **kwargs):
            cell, reply = kwargs["cell"], kwargs["execute_reply"]
            content = reply["content"]
            if content["status"] != "error":
                return
            if any(out.output_type == "error" and out.ename == content["ename"]
                   for out in cell.outputs):
                return
            cell.outputs.append(NotebookNode(
                output_type="error", ename=content["ename"], evalue=content["evalue"],
                traceback=content["traceback"] or ["ERROR: An error occurred while showtraceback "
                                                   "was disabled"]))

    return Execute
