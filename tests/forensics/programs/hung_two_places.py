"""A Python program that hangs in one of two places, alternately from run to run (a counter
in the file named by argv[1]): `wait_for_lock` on odd runs, `wait_for_reply` on even ones.
Two stuck locations of one item: each must get one full collection, repeats a summary."""
import sys
import threading
from pathlib import Path


def wait_for_lock():
    threading.Event().wait()  # odd runs hang here


def wait_for_reply():
    threading.Event().wait()  # even runs hang here


def main():
    counter = Path(sys.argv[1])
    n = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(n))
    print(f"HZ_HANG run {n}", flush=True)
    (wait_for_lock if n % 2 else wait_for_reply)()


if __name__ == "__main__":
    main()
