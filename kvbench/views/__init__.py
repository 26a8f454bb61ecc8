"""What a run folder shows, read without the reporting stack: the paper-average conventions (:mod:`.conventions`),
one run's view for the site, the dashboards and W&B (:mod:`.run_views`, with the memory accessor every view reads)
and the needle-grid heat map (:mod:`.needle_heatmap`).

Low in the layers (run-folder files and plain rows only), so the runner, the tasks and reporting all read runs the
same way without importing each other.
"""
