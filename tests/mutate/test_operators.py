"""Every mutation operator finds its sites and leaves the look-alikes alone (comments, strings,
branches a `#if` drops), its diffs apply with git, and `hazards mutate --list` needs no compiler."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hazards.mutate.conditionals import evaluate, inactive_lines
from hazards.mutate.mutants import mutants_of_text
from hazards.mutate.operators import OPERATORS

REPO = Path(__file__).resolve().parents[2]

# (operator, a source with exactly one site of it, the text its mutant must contain, a
# source where the same spelling is a look-alike: comment, string or a disabled branch)
CASES = [
    ("remove-fence", "void f(int* d){ d[0]=1; __threadfence(); }", "d[0]=1;  }",
     'void f(){ /* __threadfence(); */ const char* s = "__threadfence();"; }'),
    ("remove-fence", 'void f(){ asm volatile("fence.acq_rel.gpu;" ::: "memory"); }', 'asm volatile("" :::',
     '#if 0\nvoid f(){ asm volatile("fence.acq_rel.gpu;" ::: "memory"); }\n#endif\n'),
    # wgmma.fence.sync.aligned is not a `fence.*` instruction: cutting its tail left "wgmma." (ptxas refused)
    ("remove-fence", 'void f(){ asm volatile("fence.proxy.async;" ::: "memory"); }', 'asm volatile("" :::',
     'void f(){ asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }'),
    ("remove-fence", 'void f(){ __atomic_thread_fence(__ATOMIC_SEQ_CST); }', "void f(){  }",
     "// __atomic_thread_fence(__ATOMIC_SEQ_CST);\n"),
    ("remove-fence", 'void f(){ asm volatile("buffer_wbl2 sc1\\n\\t" "global_store_dword %0, %1, off" :: "v"(0), "v"(1)); }',
     'asm volatile("" "global_store_dword', 'const char* doc = "buffer_wbl2 is a fence";\n'),
    ("weaken-order", "int g(int* p){ return __atomic_load_n(p, __ATOMIC_ACQUIRE); }", "__ATOMIC_RELAXED",
     "// __atomic_load_n(p, __ATOMIC_ACQUIRE)\n"),
    ("weaken-order", "void f(cuda::atomic_ref<int, cuda::thread_scope_device> r){ r.store(1, cuda::std::memory_order_release); }",
     "memory_order_relaxed", 'const char* s = "memory_order_release";\n'),
    ("weaken-order", 'int g(int* p){ int v; asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p)); return v; }',
     "ld.relaxed.gpu.u32", "// ld.acquire.gpu.u32 in a comment\n"),
    ("weaken-order", 'void f(int* p){ asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(p)); }',
     "red.relaxed.gpu", '#ifdef NEVER_DEFINED_HERE\n#else\n#endif\n'),
    ("narrow-scope", "void f(int* p){ __hip_atomic_store(p, 1, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM); }",
     "__HIP_MEMORY_SCOPE_AGENT", "/* __HIP_MEMORY_SCOPE_SYSTEM */\n"),
    ("narrow-scope", 'void f(int* p){ asm volatile("st.relaxed.sys.u32 [%0], 1;" :: "l"(p)); }', "st.relaxed.gpu.u32",
     'const char* s = "st.relaxed.sys.u32";\n'),
    ("remove-barrier", "__global__ void k(){ __syncthreads(); }", "__global__ void k(){  }",
     "#if 0\n__global__ void k(){ __syncthreads(); }\n#endif\n"),
    ("remove-barrier", "__global__ void k(unsigned m){ __syncwarp(m); }", "__global__ void k(unsigned m){  }",
     "// __syncwarp(m);\n"),
    ("remove-barrier", '__global__ void k(){ asm volatile("bar.sync 1, 128;"); }', 'asm volatile("")',
     'const char* s = "bar.sync 0";\n'),
    ("remove-barrier", "__global__ void k(int* c){ int n = __syncthreads_count(c[0]); c[1] = n; }", None, None),
    ("deepen-wait", '__global__ void k(){ asm volatile("cp.async.wait_group 1;" ::: "memory"); }', "cp.async.wait_group 2;",
     '// asm volatile("cp.async.wait_group 1;")\n'),
    ("deepen-wait", '__global__ void k(){ asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }',
     "wgmma.wait_group.sync.aligned 1;", 'const char* s = "wgmma.wait_group.sync.aligned 0;";\n'),
    ("deepen-wait", 'void k(){ asm volatile("s_waitcnt vmcnt(2)" ::: "memory"); }', "s_waitcnt vmcnt(3)",
     "// s_waitcnt vmcnt(2)\n"),
    ("deepen-wait", "void k(){ __pipeline_wait_prior(0); }", "__pipeline_wait_prior(1)", "// __pipeline_wait_prior(0);\n"),
    ("drop-earlyclobber", 'void k(float* p){ float a; asm volatile("v_mov_b32 %0, %1" : "=&v"(a) : "v"(p[0])); p[1] = a; }',
     '"=v"(a)', 'const char* s = "=&v";\n'),
    ("drop-earlyclobber", '#define HZ_OUT "=&v"\nvoid k(){}\n', '#define HZ_OUT "=v"',
     '#if 0\n#define HZ_OUT "=&v"\n#endif\n'),
    ("flag-before-data", textwrap.dedent("""\
        __global__ void k(int* data, int* flag) {
          data[threadIdx.x] = 42;
          __threadfence();
          atomicExch(flag, 1);
        }
        """), "atomicExch(flag, 1);\n  data[threadIdx.x] = 42;\n  __threadfence();",
     "// data[0] = 1; __threadfence(); atomicExch(flag, 1);\n"),
    ("reduce-nop", 'void k(){ asm volatile("v_mfma_f32_32x32x8f16 a[0:15], v[0:1], v[2:3], a[0:15]\\n s_nop 7"); }',
     "s_nop 6", 'const char* s = "s_nop 7";\n'),
]


@pytest.mark.parametrize("op, source, expect, lookalike", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_an_operator_finds_its_site_and_leaves_look_alikes_alone(op, source, expect, lookalike):
    found = mutants_of_text(source, "k.cu", operators=[op])
    if expect is None:  # the barrier used as a value: no statement to delete
        assert found == []
        return
    assert len(found) == 1, [m.description for m in found]
    assert expect in found[0].apply(source), found[0].apply(source)
    assert mutants_of_text(lookalike, "k.cu", operators=[op]) == []


def test_every_operator_has_a_case():
    assert {c[0] for c in CASES} == set(OPERATORS)


def test_a_define_given_decides_a_branch_and_an_unknown_one_keeps_both():
    src = "#ifdef HZ_FENCE\nvoid f(){ __threadfence(); }\n#else\nvoid g(){ __threadfence(); }\n#endif\n"
    assert [m.line for m in mutants_of_text(src, "k.cu")] == [2, 4]  # HZ_FENCE unknown: both branches
    assert [m.line for m in mutants_of_text(src, "k.cu", defines={"HZ_FENCE": "1"})] == [2]
    assert inactive_lines("#define MODE 2\n#if MODE == 3\nx\n#elif MODE == 2\ny\n#else\nz\n#endif\n") == {3, 7}
    assert evaluate("defined(A) && B > 1", {"A": "1", "B": "2"}) is True
    assert evaluate("C", {}) is None


def test_the_diffs_apply_with_git_and_give_the_mutant(tmp_path):
    source = (REPO / "standalone" / "deadlock" / "deadlock.cu").read_text()
    mutants = mutants_of_text(source, "deadlock.cu")
    assert len(mutants) >= 5
    for m in mutants:
        work = tmp_path / m.id
        work.mkdir()
        (work / "deadlock.cu").write_text(source)
        patch = work / "m.diff"
        patch.write_text(m.diff(source))
        subprocess.run(["git", "apply", "-p1", "m.diff"], cwd=work, check=True, capture_output=True)
        assert (work / "deadlock.cu").read_text() == m.apply(source), m.id


def test_list_prints_mutants_without_a_compiler(tmp_path):
    src = tmp_path / "k.cu"
    src.write_text("__global__ void k(int* d, int* f){ d[0] = 1; __threadfence(); atomicExch(f, 1); __syncthreads(); }\n")
    env_path = "/nonexistent"  # no nvcc, no clang on PATH
    res = subprocess.run([sys.executable, "-m", "hazards", "mutate", str(src), "--list", "--json"], capture_output=True,
                         text=True, env={"PATH": env_path, "PYTHONPATH": str(REPO)}, cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)["mutants"]
    assert {m["operator"] for m in got} == {"remove-fence", "remove-barrier", "flag-before-data"}
    assert all(m["id"] and m["description"] and m["diff"].startswith("---") for m in got)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.cu"]  # nothing written


@pytest.mark.parametrize("args, words", [
    (["--operators", "remove-fnce"], "no mutation operator 'remove-fnce'"),
    (["--lines", "9-3"], "--lines must be A-B"),
    ([], "give --test CMD"),
    (["--family", "pipeline", "--launches", "0"], "--launches must be at least 1"),
    (["--variant", "fixed", "--test", "true"], "--variant names a variant of --family F"),
    # C's -DNAME= defines NAME as empty: it used to read as 1 (the other branch of `#if NAME`) and list
    # another build's mutants; an empty item (`-D ,`, `A,,B`) used to be dropped without a word
    (["--list", "-D", "HZ_X="], "-D/--define: 'HZ_X=' has no value"),
    (["--list", "-D", ","], "-D/--define: an empty item"),
    (["--list", "-D", "HZ_A,,HZ_B"], "-D/--define: an empty item"),
    (["--list", "-D", "1BAD=2"], "-D/--define: not a macro name"),
    # an item without a name is said so (it used to say "'=' has no value")
    (["--list", "-D", "="], "-D/--define: '=' has no name"),
    (["--list", "-D", "=5"], "-D/--define: '=5' has no name"),
    # -U reads its items as -D does: NAME=VALUE used to undefine NAME without a word, an empty item to
    # read as a bad name
    (["--list", "-U", "HZ_X=1"], "-U/--undefine: 'HZ_X=1': -U takes a macro name alone"),
    (["--list", "-U", "HZ_A,,HZ_B"], "-U/--undefine: an empty item"),
    (["--list", "-U", "="], "-U/--undefine: '=' has no name"),
    (["--list", "-U", "1BAD"], "-U/--undefine: not a macro name"),
])
def test_bad_input_is_one_line(tmp_path, args, words):
    src = tmp_path / "k.cu"
    src.write_text("void f(){ __threadfence(); }\n")
    res = subprocess.run([sys.executable, "-m", "hazards", "mutate", str(src), *args], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}, cwd=tmp_path, timeout=120)
    assert res.returncode == 2 and words in res.stderr and res.stderr.count("\n") == 1, res.stderr


@pytest.mark.parametrize("item", ["HZ_X=", ",", "HZ_A,,HZ_B", "1BAD=2", "=", "=5"])
def test_mutate_and_repro_read_a_bad_define_item_alike(tmp_path, item):
    """One reading of -D for both commands (hazards.cli.options.parse_define_items): the same
    one-line error, exit 2."""
    src = tmp_path / "k.cu"
    src.write_text("void f(){ __threadfence(); }\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    errors = []
    for argv in (["mutate", str(src), "--list"], ["repro", "--family", "deadlock", "--binary", "/bin/true"]):
        res = subprocess.run([sys.executable, "-m", "hazards", *argv, "-D", item], capture_output=True, text=True,
                             env=env, cwd=tmp_path, timeout=120)
        assert res.returncode == 2 and res.stderr.count("\n") == 1, (argv, res.stderr)
        errors.append(res.stderr)
    assert errors[0] == errors[1], errors


def test_comma_separated_defines_are_read_as_separate_names():
    """-D A=1,B (comma-separated, NAME alone is 1, items stripped) is two defines."""
    from hazards.cli.options import parse_define_items

    assert parse_define_items(["A=1,B", " C=x "]) == {"A": "1", "B": "1", "C": "x"}


def test_comma_separated_undefines_are_read_as_separate_names():
    """-U A,B (comma-separated, items stripped, as -D) is two names, each once."""
    from hazards.cli.options import parse_undefine_items

    assert parse_undefine_items(["HZ_A,HZ_B", " HZ_C ", "HZ_A"]) == ["HZ_A", "HZ_B", "HZ_C"]


def test_a_comma_separated_undefine_decides_both_branches_as_repeated_ones_do(tmp_path):
    """`-U HZ_A,HZ_B` leaves both macros undefined, as `-U HZ_A -U HZ_B` does: neither guarded site is
    mutated (it used to be refused as "not a macro name: 'HZ_A,HZ_B'")."""
    src = tmp_path / "k.cu"
    src.write_text("__global__ void k(int* d, int* f){\n d[0] = 1;\n#ifdef HZ_A\n __threadfence();\n#endif\n"
                   "#ifdef HZ_B\n __syncthreads();\n#endif\n atomicExch(f, 1);\n}\n")
    ops = []
    for undefine in (["-U", "HZ_A,HZ_B"], ["-U", "HZ_A", "-U", "HZ_B"], []):
        res = subprocess.run([sys.executable, "-m", "hazards", "mutate", str(src), "--list", "--json", "--no-preprocess",
                              *undefine], capture_output=True, text=True,
                             env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}, cwd=tmp_path, timeout=120)
        assert res.returncode == 0, res.stderr
        ops.append(sorted(m["operator"] for m in json.loads(res.stdout)["mutants"]))
    assert ops[0] == ops[1] == ["flag-before-data"], ops
    assert ops[2] == ["flag-before-data", "remove-barrier", "remove-fence"], ops


def test_a_source_with_a_non_utf8_byte_lists_its_mutants(tmp_path):
    # A Latin-1 name in a comment is common in old sources; the file's sha must hash it as it is.
    src = tmp_path / "k.cu"
    src.write_bytes(b"// author: Jos\xe9\n__global__ void k(int* d, int* f){ d[0] = 1; __threadfence(); atomicExch(f, 1); }\n")
    res = subprocess.run([sys.executable, "-m", "hazards", "mutate", str(src), "--list"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}, cwd=tmp_path, timeout=120)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert "remove-fence@2" in res.stdout


def test_a_static_only_familys_mutants_can_be_listed_but_not_run(tmp_path):
    """earlyclobber has no runtime binary: --list shows its mutants (with its fixed variant's
    define, the early-clobber of its constraint macro among them); a kill loop on it is
    refused in one line."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-m", "hazards", "mutate", "--family", "earlyclobber", "--list", "--json",
                          "-D", "HZ_EARLY_CLOBBER=1"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "drop-earlyclobber" in {m["operator"] for m in json.loads(res.stdout)["mutants"]}
    res = subprocess.run([sys.executable, "-m", "hazards", "mutate", "--family", "earlyclobber"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert res.returncode == 2 and "no runtime binary" in res.stderr and res.stderr.count("\n") == 1, res.stderr


def test_sources_with_family_pick_among_the_familys_files(tmp_path):
    # SOURCE with --family used to be taken silently (a foreign file mutated in the family's
    # tree); now it picks which of the family's files to mutate, by path or by name
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}

    def mutate(*args):
        return subprocess.run([sys.executable, "-m", "hazards", "mutate", "--family", "ordering", "--list", "--json",
                               *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)

    foreign = tmp_path / "k.cu"
    foreign.write_text("void f(){ __threadfence(); }\n")
    res = mutate(str(foreign))
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert f"{foreign} is not one of family ordering's files (ordering.cu, compat.h)" in res.stderr, res.stderr
    res = mutate("ordering.cu")
    assert res.returncode == 0, res.stderr
    assert {Path(m["path"]).name for m in json.loads(res.stdout)["mutants"]} == {"ordering.cu"}
    res = mutate(str(REPO / "standalone" / "common" / "compat.h"))
    assert {Path(m["path"]).name for m in json.loads(res.stdout)["mutants"]} == {"compat.h"}, res.stderr


def test_a_flag_store_mid_line_moves_before_its_data_on_that_line():
    # The data store after a `{` on the function's own line: the moved flag must not copy the
    # function's head (it did: the line's text before the store was taken as indentation).
    source = "__global__ void k(int* d, int* f){ d[0] = 1; __threadfence(); atomicExch(f, 1); }\n"
    (m,) = mutants_of_text(source, "k.cu", operators=["flag-before-data"])
    assert m.apply(source) == "__global__ void k(int* d, int* f){ atomicExch(f, 1); d[0] = 1; __threadfence(); }\n"


NOT_UTF8 = b"// author: Jos\xe9\n__global__ void k(int* d, int* f){ d[0] = 1; __threadfence(); atomicExch(f, 1); }\n"


def _no_lone_surrogate(text: str) -> bool:
    return not any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def test_json_of_a_non_utf8_source_has_no_lone_surrogate_and_round_trips_the_bytes(tmp_path):
    src = tmp_path / "k.cu"
    src.write_bytes(NOT_UTF8)
    res = subprocess.run([sys.executable, "-m", "hazards", "mutate", str(src), "--list", "--json"],
                         capture_output=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO),
                                                   "PYTHONIOENCODING": "utf-8:strict"}, cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    out = res.stdout.decode("utf-8")  # strict: the JSON itself is valid UTF-8
    got = json.loads(out)["mutants"]
    assert got and all(_no_lone_surrogate(json.dumps(m, ensure_ascii=False)) for m in got)
    fence = next(m for m in got if m["operator"] == "remove-fence")
    assert "\ufffd" in fence["diff"] and "not valid UTF-8" in fence["encoding"]
    patch = base64.b64decode(fence["diff_base64"])
    assert b"Jos\xe9" in patch
    work = tmp_path / "apply"
    work.mkdir()
    (work / "k.cu").write_bytes(NOT_UTF8)
    (work / "m.diff").write_bytes(patch.replace(str(src).encode(), b"k.cu"))
    subprocess.run(["git", "apply", "-p1", "m.diff"], cwd=work, check=True, capture_output=True)
    assert (work / "k.cu").read_bytes() == NOT_UTF8.replace(b"__threadfence();", b"")


def test_survivors_of_a_non_utf8_source_print_their_exact_bytes_and_store_clean_json(tmp_path):
    from hazards.engine.store import Store
    from hazards.mutate.mutants import json_value

    project = tmp_path / "p"
    project.mkdir()
    (project / "k.cu").write_bytes(NOT_UTF8)
    res = subprocess.run([sys.executable, "-m", "hazards", "mutate", "k.cu", "--operators", "remove-fence",
                          "--test", "true", "-n", "2", "--timeout", "30", "--store", str(tmp_path / "r.db")],
                         capture_output=True, cwd=project, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO), "HZ_FAKE_GPUS": "",
                              "PYTHONIOENCODING": "utf-8:strict"})
    assert res.returncode == 1 and b"Traceback" not in res.stderr, res.stderr[-2000:]
    assert b" // author: Jos\xe9\n-__global__" in res.stdout  # the diff, byte for byte
    with Store(tmp_path / "r.db", create=False) as store:
        (camp,) = [c for c in store.campaigns(kind="mutate") if not c.spec.get("baseline")]
    mutant = camp.spec["mutant"]
    assert _no_lone_surrogate(json.dumps(camp.spec, ensure_ascii=False))
    assert "Jos\udce9" in json_value(mutant, "diff")  # the exact bytes, back through surrogateescape


def test_a_fence_after_a_newline_tab_escape_in_the_asm_literal_is_a_site():
    text = 'void f(int* p){ asm volatile("st.u32 [%0], 1;\\n\\tfence.acq_rel.gpu;" :: "l"(p) : "memory"); }\n'
    found = [m for m in mutants_of_text(text, "k.cu", operators=["remove-fence"])]
    assert len(found) == 1 and "fence.acq_rel.gpu" in found[0].diff(text)
