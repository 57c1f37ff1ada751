"""A descendant that records its pid and blocks forever (used by the hanging fakes)."""
import time

from fakelib import record_pid

record_pid()
while True:
    time.sleep(3600)
