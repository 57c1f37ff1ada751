#!/usr/bin/env python3
"""A debugger that answers like gdb until `attach PID`, then ptrace-attaches to PID and
never answers again: a wedged debugger. With HZ_FAKE_PIDFILE set it records its pid."""
import ctypes
import os
import sys
import time

if os.environ.get("HZ_FAKE_PIDFILE"):
    with open(os.environ["HZ_FAKE_PIDFILE"], "a") as f:
        f.write(f"{os.getpid()}\n")
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_ATTACH = 16
for line in sys.stdin:
    if line.startswith("echo "):
        print(line[5:].rstrip("\n").replace("\\n", "\n"), end="", flush=True)
    elif line.startswith("attach "):
        libc.ptrace(PTRACE_ATTACH, int(line.split()[1]), None, None)
        time.sleep(3600)
