"""The engine: targets, watchdog, classification, statistics and the results store.

`stress` never imports `hazards` and never imports a GPU library: the supervisor must
survive any hang or sticky CUDA error of the children it starts.
"""
