"""Figures for the book, computed from data with matplotlib when a chapter executes.

One module per topic; import the one you need (``import llmcore`` never imports matplotlib)::

    from llmcore.figures.architecture import plot_architecture   # the model with shapes, ch. 1, 5
    from llmcore.figures.matrices import plot_matrices           # small matrices, numbers written in
    from llmcore.figures.memory import plot_layout               # storage, strides and views
    from llmcore.figures.heatmaps import plot_attention          # attention weights per head
    from llmcore.figures.timing import plot_timings              # measured timings against size

Every plotting function returns a matplotlib Figure (or draws into an ``ax`` it is given) and
leaves nothing open in pyplot's registry, so a notebook cell shows the figure exactly once, as
the cell's value.
"""
