"""Hypothesis strategies over the run-time parameters of the runtime families.

Each returns dicts with a `variant` key plus explicit overrides, ready to be sent as a
server request; the family's `static_model` judges the resolved point.
"""
