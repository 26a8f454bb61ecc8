"""Running a model with eviction: the eviction session (:mod:`.eviction`), the one prefill (:mod:`.prefill`),
greedy generation (:mod:`.generate`) and the hooks behind :func:`kvbench.press` (:mod:`.press`)."""
