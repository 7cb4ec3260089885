"""Figures for the book, computed from data with matplotlib when a chapter executes.

One module per topic; import the one you need (``import llmcore`` never imports matplotlib)::

    from llmcore.figures.architecture import plot_architecture   # the model with shapes, ch. 1, 5
    from llmcore.figures.matrices import plot_matrices           # small matrices, numbers written in
    from llmcore.figures.memory import plot_layout               # storage, strides and views
    from llmcore.figures.heatmaps import plot_attention          # attention weights per head
    from llmcore.figures.timing import plot_timings              # measured timings against size
    from llmcore.figures.sampling import plot_distributions      # next-token distributions, ch. 6
    from llmcore.figures.masks import plot_masks                 # attention masks, padding, ch. 8
    from llmcore.figures.paging import plot_paged_cache, plot_timeline   # paged KV cache, ch. 9
    from llmcore.figures.dataflow import plot_data_flow, plot_step_costs # the data flow, ch. 10

Every plotting function returns a matplotlib Figure (or draws into an ``ax`` it is given) and
leaves nothing open in pyplot's registry, so a notebook cell shows the figure exactly once, as
the cell's value.
"""
