"""The layered MoE decode megakernel's Python side (family `megakernel_layers`).

Submodules: `model` (the kernel's shapes, weight hash, schedule and sync layout, in plain
Python; no torch), `reference` (the torch reference and the silent-corruption
mishandlings), `calibration` (the tolerance table), `explain` (what a hang's tripwire
snapshot says about the configured hazard class). Importing this package imports nothing
heavy.
"""
