"""Planning passes. Pointwise, in order: layout -> fusion (the tile kernel) -> tiling -> scratchpad
-> verify -> division -> emit; reductions: reduction_lowering -> reduction_plan -> reduction_division
-> emit. Every family's kept program goes through keep.py (the validator, then the independent
verifier of the finished program, verify.verify_program) before it is emitted.

The skeleton every family plugs into: tiles.py (the tile kernel: tiles with a role and a space,
steps, phases, combine), allocate.py (scratchpad allocation with live ranges and the placement
check), search.py (the candidate search against the timing model) and plans.py (one Plans per
kernel, what emit.py writes and the summary template renders).

Each pass is one module whose result is a frozen dataclass with ``describe()`` (a JSON-able dict),
so every stage can be dumped and unit-tested alone.
"""
