"""The tripwire as a progress source: a worker's position or barrier state moving is
progress, its spin count alone is not (a deadlocked kernel keeps spinning), and a stall names
the least advanced worker's layer, phase and barrier by the family's names."""
from __future__ import annotations

import sys
from pathlib import Path

from tw_synth import Image

from hazards.engine.loop import WorkItem, default_target_factory
from hazards.engine.progress import Progress, tripwire_poller
from hazards.engine.tripwire.names import Names
from hazards.engine.tripwire.session import ENV_PATH

NAMES = Names(phases={3: "ATTN"}, barriers={7: "ATTN_RELEASE"})


def test_positions_move_progress_and_spins_do_not(tmp_path):
    path = tmp_path / "tw.bin"
    img = Image(workers=2).pos(0, 1, 3).wait(1, 7, observed=0, expected=1, spins=10, layer=2, phase=3)
    path.write_bytes(img.tobytes())
    progress = Progress()
    poll = tripwire_poller(progress, str(path), NAMES)
    assert progress.events == 0  # how the file was when the run began is not an event
    img.wait(1, 7, observed=0, expected=1, spins=999_999, layer=2, phase=3)  # spinning in place
    path.write_bytes(img.tobytes())
    poll()
    assert progress.events == 0
    img.pos(0, 2, 3)  # worker 0 moved on to layer 2
    path.write_bytes(img.tobytes())
    poll()
    assert progress.events == 1
    assert progress.last_label() == "launch 1, layer 2, phase ATTN, barrier ATTN_RELEASE"
    progress.beat("batch 0.30 s, heartbeat 3")  # a heartbeat after it says less than the tripwire
    assert progress.last_label().startswith("launch 1, layer 2, phase ATTN")


def test_a_family_server_item_gets_a_private_tripwire_file_removed_with_its_target(tmp_path):
    fake_server = Path(__file__).resolve().parent.parent / "fakes" / "fake_server.py"
    names = tmp_path / "names.h"
    names.write_text("#define PHASE_ATTN 3\n#define BARRIER_ATTN_RELEASE 7\n")
    item = WorkItem(target="fam", kind="server", argv=(sys.executable, str(fake_server)),
                    tripwire_names=str(names))
    target = default_target_factory(item, {})
    try:
        path = target.tw.path
        assert path.exists() and target.inner.env[ENV_PATH] == str(path)
        r = target.run({}, timeout=30)
        assert r.outcome.value == "clean", r.reason
        assert path.exists()  # a server's file is never reset or removed between runs
    finally:
        target.close()
    assert not path.exists()


def test_a_new_writer_at_the_same_place_is_progress(tmp_path):
    # a respawned server that hangs where the last one did writes the same positions: its
    # pid and launch time in the header still move (seen on the GPU: the second hang of a
    # canary was labelled 'started' before this)
    import struct

    path = tmp_path / "tw.bin"
    raw = bytearray(Image(workers=1).wait(0, 7, observed=0, expected=1, layer=0, phase=3).tobytes())
    path.write_bytes(bytes(raw))
    progress = Progress()
    poll = tripwire_poller(progress, str(path), NAMES)
    struct.pack_into("<Q", raw, 32, 99)  # the snapshot counter alone: no progress
    path.write_bytes(bytes(raw))
    poll()
    assert progress.events == 0
    struct.pack_into("<QQ", raw, 40, 4321, 123456789)  # another pid, another launch time
    path.write_bytes(bytes(raw))
    poll()
    assert progress.events == 1 and progress.last_label().endswith("barrier ATTN_RELEASE")
