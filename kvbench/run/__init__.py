"""One benchmark run and its files: the runner (:mod:`.runner`), the run folder (:mod:`.folder`), provenance,
the metrics records (:mod:`.records`) and their crash-safe writers (:mod:`.writers`), the printed table, resume,
the sample cache, the summary, sweeps, termination and W&B logging."""
