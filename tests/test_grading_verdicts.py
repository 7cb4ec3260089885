

def test_plain_nbgrader_and_course_grade_judge_alike():
    """nbgrader_config.py (plain `nbgrader autograde`) names the pipeline course-grade builds."""
    from traitlets.config.loader import PyFileConfigLoader
    from traitlets.utils.importstring import import_item

    from course.grading.nbgrader_app import autograde_preprocessors
    config = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    named = [import_item(p) if isinstance(p, str) else p
             for p in config.Autograde.autograde_preprocessors]
    assert named == autograde_preprocessors()
    assert "Verdicts" in [p.__name__ for p in named]
