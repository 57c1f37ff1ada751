"""Barrier layout checker: which words of a barrier share a cache line, and with whom.

A layout is a list of slots (offset and size in bytes, how the word is written, which
barrier it belongs to). Line sizes: 64 B on AMD (gfx9 L2 line); 128 B lines made of 32 B
sectors on NVIDIA. More in docs/static-checks.md.
"""
from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path
from typing import Any, Iterable, Literal

from hazards.static import checks
from hazards.static.findings import Finding
from hazards.engine.errors import UserError

Access = Literal["atomic", "write_through", "plain"]
ACCESSES: tuple[str, ...] = ("atomic", "write_through", "plain")
PLATFORMS: dict[str, tuple[int, int | None]] = {"amd": (64, None), "nvidia": (128, 32)}


@dataclasses.dataclass(frozen=True)
class Slot:
    """One word of a barrier: where it is, how it is written, whose it is."""

    name: str
    offset: int
    size: int
    access: Access
    barrier: str = "barrier"

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclasses.dataclass(frozen=True)
class Layout:
    """Slots plus the platform whose line size applies."""

    slots: tuple[Slot, ...]
    platform: str = "amd"
    name: str = ""
    line_size: int | None = None
    sector_size: int | None = None
    base_align: int | None = None

    @property
    def line(self) -> int:
        return self.line_size or PLATFORMS[self.platform][0]

    @property
    def sector(self) -> int | None:
        return self.sector_size if self.sector_size is not None else PLATFORMS[self.platform][1]


def _expand(entry: dict[str, Any], k: int) -> list[Slot]:
    missing = [f for f in ("name", "offset", "size", "access") if f not in entry]
    if missing:
        raise UserError(f"layout slot #{k} lacks {', '.join(missing)}: {entry}")
    if entry["access"] not in ACCESSES:
        raise UserError(f"layout slot {entry['name']!r}: access must be one of "
                        f"{', '.join(ACCESSES)}, not {entry['access']!r}")
    try:
        count, stride = int(entry.get("count", 1)), int(entry.get("stride", entry["size"]))
        offset, size = int(entry["offset"]), int(entry["size"])
    except (TypeError, ValueError) as e:
        raise UserError(f"layout slot {entry['name']!r}: offset/size/count/stride must be "
                        f"integers ({e})") from None
    if size <= 0 or offset < 0 or count < 1:
        raise UserError(f"layout slot {entry['name']!r}: need size > 0, offset >= 0, count >= 1")
    out = []
    for i in range(count):
        name = f"{entry['name']}[{i}]" if count > 1 else entry["name"]
        barrier = str(entry.get("barrier", "barrier")).replace("{i}", str(i))
        out.append(Slot(name, offset + i * stride, size, entry["access"], barrier))
    return out


def layout_from_dict(data: dict[str, Any]) -> Layout:
    """A layout from its TOML/JSON form: `platform`, optional `line_size`, `sector_size`,
    `base_align`, `name`, and `slot` (or `slots`): a list of {name, offset, size, access,
    barrier, count, stride} (a slot with `count` expands to name[i] at offset + i*stride;
    `{i}` in its barrier name is replaced by i)."""
    if not isinstance(data, dict):
        raise UserError("a layout must be a table/object with a `slot` list")
    entries = data.get("slot", data.get("slots"))
    if not isinstance(entries, list) or not entries:
        raise UserError("a layout needs a non-empty `slot` (or `slots`) list")
    platform = data.get("platform", "amd")
    if platform not in PLATFORMS:
        raise UserError(f"layout platform must be one of {', '.join(PLATFORMS)}, not {platform!r}")
    slots = tuple(s for k, e in enumerate(entries) for s in _expand(e, k))
    return Layout(slots, platform, str(data.get("name", "")), data.get("line_size"),
                  data.get("sector_size"), data.get("base_align"))


def load_layout(path: Path) -> Layout:
    """Read a layout from a .toml or .json file (UserError on anything malformed)."""
    try:
        raw = Path(path).read_bytes()
        data = tomllib.loads(raw.decode()) if Path(path).suffix == ".toml" else json.loads(raw)
    except FileNotFoundError:
        raise UserError(f"no such layout file: {path}") from None
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"cannot parse layout {path}: {e}") from None
    return layout_from_dict(data)


def _lines_of(s: Slot, line: int) -> range:
    return range(s.offset // line, (s.end - 1) // line + 1)


def _may_share(a: Slot, b: Slot, unit: int, align: int) -> bool:
    """Whether some `align`-aligned base puts a byte of `a` and one of `b` in one unit."""
    for shift in range(0, unit, align) if align < unit else (0,):
        la = range((a.offset + shift) // unit, (a.end - 1 + shift) // unit + 1)
        lb = range((b.offset + shift) // unit, (b.end - 1 + shift) // unit + 1)
        if la.start <= lb.stop - 1 and lb.start <= la.stop - 1:
            return True
    return False


def check_layout(layout: Layout, path: str = "<layout>") -> list[Finding]:
    """Every layout check; findings point at `path` (line 0: a layout has no lines). A
    line hazard is reported once per pair of barriers (or of barrier and writer kind),
    naming the slot pairs it covers, not once per pair of slots."""
    line, sector = layout.line, layout.sector
    align = layout.base_align or line
    nvidia = layout.platform == "nvidia"
    out: list[Finding] = []
    slots = sorted(layout.slots, key=lambda s: s.offset)
    for s in slots:
        if s.access == "atomic" and (s.offset % s.size or len(_lines_of(s, line)) > 1):
            out.append(checks.LAYOUT_MISALIGNED.finding(
                path, 0, f"atomic slot {s.name} at {s.offset} (+{s.size}) is not naturally "
                         f"aligned or crosses a {line}-B line"))
    wt_groups: dict[tuple[str, str, str], list[tuple[Slot, Slot]]] = {}
    shared_groups: dict[tuple[str, str], list[tuple[Slot, Slot, bool]]] = {}
    for i, a in enumerate(slots):
        for b in slots[i + 1:]:
            if a.offset < b.end and b.offset < a.end:
                out.append(checks.LAYOUT_OVERLAP.finding(path, 0, f"slots {a.name} and {b.name} share bytes"))
                continue
            if not _may_share(a, b, line, align):
                continue
            kinds = {a.access, b.access}
            if "write_through" in kinds and kinds & {"atomic", "plain"}:
                wt, other = (a, b) if a.access == "write_through" else (b, a)
                wt_groups.setdefault((wt.barrier, other.barrier, other.access), []).append((wt, other))
            if a.barrier != b.barrier:
                key = tuple(sorted((a.barrier, b.barrier)))
                same_sector = sector is not None and _may_share(a, b, sector, align)
                shared_groups.setdefault(key, []).append((a, b, same_sector))
    for (_, _, access), pairs in wt_groups.items():
        wt, other = pairs[0]
        out.append(checks.LAYOUT_WT_L2_LINE.finding(
            path, 0,
            f"{wt.name} (write-through, offset {wt.offset}) shares a {line}-B line with "
            f"{other.name} ({access}, offset {other.offset}){_more(pairs)}: an L2 write-back of "
            f"that line can revert the write-through value (the lost release of the MoE "
            f"barrier report)" + ("; on NVIDIA the L2 is the point of coherence, so this is the "
                                  "AMD mechanism - separate lines stay portable" if nvidia else ""),
            severity="warning" if nvidia else None))
    for (ba, bb), pairs in shared_groups.items():
        a, b, _ = pairs[0]
        where = f"one {line}-B line" + (", and one 32-B sector" if any(p[2] for p in pairs) else "")
        out.append(checks.LAYOUT_FALSE_SHARING.finding(
            path, 0,
            f"{a.name} ({a.barrier}) and {b.name} ({b.barrier}) of unrelated barriers share "
            f"{where}{_more(pairs)}: every arrival or release of one invalidates the other",
            severity="perf" if nvidia else None))
    return out


def _more(pairs: list) -> str:
    """`` (and N more slot pairs: x/y, ...)`` for a group of more than one pair."""
    if len(pairs) <= 1:
        return ""
    shown = ", ".join(f"{p[0].name}/{p[1].name}" for p in pairs[1:4])
    return f" (and {len(pairs) - 1} more slot pair(s): {shown}{', ...' if len(pairs) > 4 else ''})"


def check_layout_file(path: Path) -> list[Finding]:
    """Load and check one layout file."""
    return check_layout(load_layout(path), str(path))


def layout_from_table(entries: Iterable[tuple[int, int, int, int]], platform: str,
                      name: str = "") -> Layout:
    """A layout from `(offset, size, access code, barrier id)` rows, the form the
    barrier_layout kernel embeds in its binary (access codes: 0 atomic, 1 write-through,
    2 plain)."""
    slots = tuple(Slot(f"b{bid}.w{off}", off, size, ACCESSES[code], f"barrier{bid}")
                  for off, size, code, bid in entries)
    return Layout(slots, platform, name)


def table_from_amdgcn(listing: str, symbol: str = "hz_barrier_layout") -> list[tuple[int, ...]]:
    """The `.long` rows of `symbol` (possibly mangled, e.g. `_ZL17hz_barrier_layout`) in an
    AMDGCN listing, grouped by four."""
    import re

    values: list[int] = []
    lines = listing.split("\n")
    for k, line in enumerate(lines):
        if re.match(rf"^(_Z\w*?\d+)?{symbol}:", line):
            for nxt in lines[k + 1:]:
                m = re.match(r"^\s*\.long\s+(-?\w+)", nxt)
                if not m:
                    break
                values.append(int(m.group(1), 0))
            break
    return [tuple(values[i:i + 4]) for i in range(0, len(values) - 3, 4)]


def table_from_ptx(ptx: str, symbol: str = "hz_barrier_layout") -> list[tuple[int, ...]]:
    """The initializer of `symbol` in PTX (`.b8` bytes little-endian, or `.b32` words)."""
    import re

    m = re.search(rf"\.(b8|b32|u32)\s+{symbol}\[\d+\]\s*=\s*\{{([^}}]*)\}}", ptx)
    if not m:
        return []
    nums = [int(x.strip(), 0) for x in m.group(2).split(",") if x.strip()]
    if m.group(1) == "b8":
        nums = [int.from_bytes(bytes(nums[i:i + 4]), "little") for i in range(0, len(nums), 4)]
    return [tuple(nums[i:i + 4]) for i in range(0, len(nums) - 3, 4)]
