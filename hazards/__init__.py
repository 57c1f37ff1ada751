"""The hazard catalog (families, strategies, oracles, static checkers) and the `hazards` CLI.

Builds on the `stress` engine; `stress` never imports this package.
"""
__version__ = "0.1.0"
