"""Hypothesis strategies that generate inputs for the static checkers, with model oracles.

- `asm_blocks()`: multi-load AMDGCN asm blocks - how many loads, which outputs are
  early-clobber, and how the addresses are derived (`inputs`: one address operand per load;
  `base`: one base operand plus `offset:` immediates; `derived`: the block itself computes
  each address from a base into temporary outputs). `block_hazard(spec)` is the oracle,
  worked out from the structure of the block rather than from its text.
- `layouts()`: barrier layouts (slots with offset, size, access kind, barrier) and a line
  size/base alignment; `layout_hazards(layout)` is a brute-force oracle that enumerates
  every byte and every admissible base shift.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import strategies as st

from hazards.static.layout import ACCESSES, Layout, Slot

ADDRESS_MODES = ("inputs", "base", "derived")


@dataclasses.dataclass(frozen=True)
class AsmBlockSpec:
    """One generated asm block: `early_clobber[k]` for load output k, `temp_clobber[k]` for
    the address temporary of load k+1 in `derived` mode."""

    loads: int
    early_clobber: tuple[bool, ...]
    mode: str
    temp_clobber: tuple[bool, ...] = ()

    def source(self, kernel: str = "hz_gen") -> str:
        """A complete HIP kernel (static build: attribute shim, no headers)."""
        n, outs, ins, lines = self.loads, [], [], []
        for k in range(n):
            outs.append(f'[o{k}] "{"=&v" if self.early_clobber[k] else "=v"}"(r{k})')
        if self.mode == "inputs":
            ins = [f'[a{k}] "v"(p + {k})' for k in range(n)]
            lines = [f"global_load_dwordx4 %[o{k}], %[a{k}], off" for k in range(n)]
        elif self.mode == "base":
            ins = ['[b] "v"(p)']
            lines = [f"global_load_dwordx4 %[o{k}], %[b], off offset:{16 * k}" for k in range(n)]
        else:
            ins = ['[b] "v"(p)']
            for k in range(1, n):
                outs.append(f'[t{k}] "{"=&v" if self.temp_clobber[k - 1] else "=v"}"(t{k})')
                lines.append(f"v_lshl_add_u64 %[t{k}], %[b], 0, {16 * k}")
            lines.append("global_load_dwordx4 %[o0], %[b], off")
            lines += [f"global_load_dwordx4 %[o{k}], %[t{k}], off" for k in range(1, n)]
        lines.append("s_waitcnt vmcnt(0)")
        template = "\n".join(f'      "{ln}\\n"' for ln in lines)
        decl_t = "".join(f"  const f4* t{k};\n" for k in range(1, n)) if self.mode == "derived" else ""
        stores = "".join(f"  q[{k}] = r{k};\n" for k in range(n))
        return (
            "#define __global__ __attribute__((global))\n"
            "typedef float f4 __attribute__((ext_vector_type(4)));\n"
            f"__global__ void {kernel}(const f4* __restrict__ src, f4* __restrict__ dst) {{\n"
            "  const unsigned tid = __builtin_amdgcn_workitem_id_x();\n"
            f"  const f4* p = src + {n} * tid;\n"
            f"  f4 {', '.join(f'r{k}' for k in range(n))};\n{decl_t}"
            f"  asm volatile(\n{template}\n"
            f"      : {', '.join(outs)}\n      : {', '.join(ins)}\n      : \"memory\");\n"
            f"  f4* q = dst + {n} * tid;\n{stores}}}\n")


def block_hazard(spec: AsmBlockSpec) -> bool:
    """Oracle: may an output be written before a later instruction reads a register input?

    inputs/base: load k writes output k and load k+1 (later) reads an input, so any of the
    first n-1 outputs without `&` is a hazard. derived: the temporaries are written first
    and the base input is read again afterwards (by later temporaries and by load 0), so a
    temporary without `&` is a hazard; later loads read only temporaries, which are
    outputs, so the load outputs themselves are safe.
    """
    if spec.mode == "derived":
        return not all(spec.temp_clobber)
    return not all(spec.early_clobber[:spec.loads - 1])


@st.composite
def asm_blocks(draw: Any, max_loads: int = 5) -> AsmBlockSpec:
    """A random multi-load asm block spec."""
    n = draw(st.integers(1, max_loads))
    ec = tuple(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    mode = draw(st.sampled_from(ADDRESS_MODES))
    tc = tuple(draw(st.lists(st.booleans(), min_size=n - 1, max_size=n - 1))) if mode == "derived" else ()
    return AsmBlockSpec(n, ec, mode, tc)


@st.composite
def layouts(draw: Any, max_slots: int = 8) -> Layout:
    """A random non-overlapping barrier layout on a random platform/alignment."""
    platform = draw(st.sampled_from(["amd", "nvidia"]))
    line = 64 if platform == "amd" else 128
    align = draw(st.sampled_from([line, line // 2, 16, 4]))
    n = draw(st.integers(1, max_slots))
    slots, cursor = [], 0
    for k in range(n):
        size = draw(st.sampled_from([4, 8]))
        cursor += draw(st.sampled_from([0, 4, 8, 24, 60, 64, 128, 200]))
        cursor = (cursor + size - 1) // size * size
        slots.append(Slot(f"s{k}", cursor, size, draw(st.sampled_from(ACCESSES)),
                          draw(st.sampled_from(["A", "B", "C"]))))
        cursor += size
    return Layout(tuple(slots), platform, base_align=align)


def layout_hazards(layout: Layout) -> set[str]:
    """Oracle: failing layout check ids, by enumerating every byte under every base shift
    the alignment admits."""
    line, align = layout.line, layout.base_align or layout.line
    found: set[str] = set()
    for s in layout.slots:
        if s.access == "atomic" and s.offset % s.size:
            found.add("layout-misaligned")
    for shift in range(0, line, align) if align < line else [0]:
        lines: dict[int, list[Slot]] = {}
        for s in layout.slots:
            for b in range(s.offset, s.end):
                bucket = lines.setdefault((b + shift) // line, [])
                if s not in bucket:
                    bucket.append(s)
            if s.access == "atomic" and align % line == 0 and \
                    (s.offset + shift) // line != (s.end - 1 + shift) // line:
                found.add("layout-misaligned")
        for members in lines.values():
            kinds = {s.access for s in members}
            if "write_through" in kinds and kinds & {"atomic", "plain"}:
                found.add("layout-wt-l2-line")
            if len({s.barrier for s in members}) > 1 and layout.platform != "nvidia":
                found.add("layout-false-sharing")  # a perf finding on NVIDIA: never fails
    return found
