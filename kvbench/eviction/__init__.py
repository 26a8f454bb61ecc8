"""The machinery every eviction method builds on (issue #57): the pieces and the recipe (``base``), a method's
class and its knobs (``family``, ``recipe``, ``knobs``, ``params``), what a score reads (``observation``,
``token_scores``, ``prerope``), the wrappers over any scorer and their pieces (``wrappers``,
``head_allocation``, ``layer_schedules``, ``selection``, ``critical``, ``kvpress_*``), the sample state and
the plug-in loader.  The methods themselves are ``kvbench/methods/``, one file per family.
"""
