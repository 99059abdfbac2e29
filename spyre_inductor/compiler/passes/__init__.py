"""Planning passes, in order: layout -> fusion -> tiling -> scratchpad -> division -> verify -> emit.

Each pass is one module whose result is a frozen dataclass with ``describe()``
(a JSON-able dict), so every stage can be dumped and unit-tested alone.
"""
