"""A PyTorch program that hangs: a kernel that spins forever, launched on torch's current
stream, then `torch.cuda.synchronize()` waits for it. The forensics should name both the
Python line (the synchronize call in `wait_for_step`) and the device line of the spin.

Usage: python3 hung_torch.py LIBHUNG.so [MODE]   (the library: hung_kernels.cu built with
-DHZ_HANG_LIBRARY -shared). With HZ_HANG_GO_FILE set, it initialises CUDA first and waits
for that file to exist before launching (so a test can overlap torch's slow import).
"""
import ctypes
import os
import sys
import time

import torch


def launch(lib, mode):
    grid = ctypes.c_int(0)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    rc = lib.hz_hang_launch(mode.encode(), stream, ctypes.byref(grid))
    if rc:
        sys.exit(f"hz_hang_launch({mode}) failed: {rc}")
    print(f"HZ_HANG launched mode={mode} grid={grid.value} (torch)", flush=True)


def wait_for_step():
    torch.cuda.synchronize()  # the spinning kernel never lets this return


def main():
    lib = ctypes.CDLL(sys.argv[1])
    lib.hz_hang_launch.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    x = torch.ones(4, device="cuda")
    print(f"HZ_HANG ready {float(x.sum())}", flush=True)
    go = os.environ.get("HZ_HANG_GO_FILE")
    while go and not os.path.exists(go):
        time.sleep(0.02)
    launch(lib, sys.argv[2] if len(sys.argv) > 2 else "spin")
    wait_for_step()
    print("HZ_HANG finished (unexpected)", flush=True)


if __name__ == "__main__":
    main()
