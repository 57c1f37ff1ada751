"""A Python program whose worker thread is stuck and whose main thread only joins it: the
worker (`fetch_forever`) reads a pipe nobody ever writes to, the main thread waits in
Thread.join. The host summary must name the worker's function, not the join."""
import os
import threading


def fetch_forever(pipe):
    return os.read(pipe, 1)  # the write end stays open and silent: the hang


def main():
    read_end, _write_end = os.pipe()
    worker = threading.Thread(target=fetch_forever, args=(read_end,), name="fetcher")
    worker.start()
    print("HZ_HANG joining", flush=True)
    worker.join()


if __name__ == "__main__":
    main()
