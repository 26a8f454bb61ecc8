"""What a run keeps on disk, below everything that computes: the run-folder layout and crash-safe writers
(:mod:`.writers`), the results folder and its lock (:mod:`.folder`), deferred termination (:mod:`.termination`),
provenance of the code and data (:mod:`.provenance`) and the sample cache (:mod:`.sample_cache`).

A foundation package: it imports only the lowest modules (errors, checks, sample, resources), so tasks, validation
and the runner all build on it without importing one another.
"""
