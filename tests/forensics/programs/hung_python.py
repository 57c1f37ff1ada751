"""A Python program that hangs on the CPU: the main thread waits for an event nobody sets,
from a function of its own (`wait_for_result`), while a worker thread sleeps in a loop.
The host-stack dump must name the waiting line."""
import threading
import time


def background_poll(stop):
    while not stop.is_set():
        time.sleep(0.05)


def wait_for_result(done):
    done.wait()  # nobody ever sets it: the hang


def main():
    stop, done = threading.Event(), threading.Event()
    threading.Thread(target=background_poll, args=(stop,), name="poller", daemon=True).start()
    print("HZ_HANG waiting", flush=True)
    wait_for_result(done)


if __name__ == "__main__":
    main()
