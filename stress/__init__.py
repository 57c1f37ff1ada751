"""The engine: targets, watchdog, classification, statistics and the results store.

Installed as `hazards.engine` (the folder stays `stress/` at the repository's top level).
The engine never imports the rest of `hazards` and never imports a GPU library: the
supervisor must survive any hang or sticky CUDA error of the children it starts.
"""
