"""Hypothesis strategies of the static checks' property tests (asm blocks, barrier layouts).

A runtime family's strategy over its run-time parameters lives in its family module
(`Family.strategy`, `hazards/families/<family>.py`).
"""
