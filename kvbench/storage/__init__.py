"""What a run keeps on disk, below everything that computes: the run-folder layout and crash-safe writers
(:mod:`.writers`), the one reader that verifies every file read back (:mod:`.reader`), where a run's files go
(:mod:`.paths`), the results folder and its lock (:mod:`.folder`) with the check before every write that it is still
held (:mod:`.ownership`), deferred termination (:mod:`.termination`), provenance of the code and data
(:mod:`.provenance`) and the sample cache (:mod:`.sample_cache`).

A foundation package: it imports only the lowest modules (errors, checks, sample, resources), so tasks, validation
and the runner all build on it without importing one another.
"""
