"""A descendant that records its pid and blocks forever (used by the hanging fakes).

`--record FILE` names the pid file when the environment (HZ_FAKE_PIDFILE) was cleared."""
import os
import sys
import time

from fakelib import record_pid

if len(sys.argv) == 3 and sys.argv[1] == "--record" and sys.argv[2]:
    os.environ["HZ_FAKE_PIDFILE"] = sys.argv[2]
record_pid()
while True:
    time.sleep(3600)
