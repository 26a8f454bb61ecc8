"""One benchmark run: the runner (:mod:`.runner`), the metrics records (:mod:`.records`), the printed table,
resume, the summary, sweeps, batched decoding and W&B logging.  The files a run writes and reads back (folder, writers,
termination, provenance, sample cache) live one layer down, in :mod:`kvbench.storage`."""
