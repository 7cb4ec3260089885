"""Figures for the book, computed from data with matplotlib when a chapter executes.

One module per topic; import the one you need (``import llmcore`` never imports matplotlib)::

    from course.figures.architecture import plot_architecture   # the model with shapes, ch. 1, 5
    from course.figures.matrices import plot_matrices           # small matrices, numbers written in
    from course.figures.memory import plot_layout               # storage, strides and views
    from course.figures.heatmaps import plot_attention          # attention weights per head
    from course.figures.timing import plot_timings              # measured timings against size
    from course.figures.sampling import plot_distributions      # next-token distributions, ch. 6
    from course.figures.masks import plot_masks                 # attention masks, padding, ch. 8
    from course.figures.paging import plot_paged_cache, plot_timeline   # paged KV cache, ch. 9
    from course.figures.dataflow import plot_data_flow, plot_step_costs # the data flow, ch. 10

Every plotting function returns a matplotlib Figure (or draws into an ``ax`` it is given) and
leaves nothing open in pyplot's registry, so a notebook cell shows the figure exactly once, as
the cell's value.
"""
