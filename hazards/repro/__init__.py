"""Support for `hazards repro`: the run context and Xid evidence it keeps."""
