"""Runtime and simulated Spyre device.

Knows PyTorch's c10 (through the C++ extension `_C`) but nothing of Inductor.
"""
