"""What a hazard family is, read from the one table that describes it.

Every family is written down once, in `standalone/<family>/family.toml` (schema:
docs/family-table.md): its parameters (kind, default, range or choices, doc), its variants
(role, description, parameter preset, which oracle detects a broken one), its counters,
default launches, timeout and harness anomalies. More in docs/family-table.md.
"""
from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path
from typing import Any, Callable, Literal, Mapping

from hazards.engine.errors import UserError

Role = Literal["reference", "fixed", "broken"]
Oracle = Literal["static", "sanitizer", "stress"]
ROLES: tuple[str, ...] = ("reference", "fixed", "broken")
ORACLES: tuple[str, ...] = ("static", "sanitizer", "stress")
PLATFORMS: tuple[str, ...] = ("cuda", "amd")
KINDS: tuple[str, ...] = ("int", "bool", "str")
TABLE_FILE = "family.toml"
HEADER_NAME = "hz_family_table.h"
# Request keys the harness owns; they are not parameters (standalone/common/harness.h).
HARNESS_KEYS: tuple[str, ...] = ("variant", "seed")
MAX_COUNTERS = 8  # hz::kNumCounters in standalone/common/check.cuh
_JSON_INT_LIMIT = 2 ** 53  # the harness stores numbers as doubles
_RAW_DELIMITER = "hz_table"  # C++ raw string literal R"hz_table(...)hz_table"


class FamilyTableError(UserError):
    """A family.toml that breaks the schema (docs/family-table.md)."""


class BadPoint(UserError):
    """A parameter point the family's binary would refuse (bad name, type, range, variant)."""


@dataclasses.dataclass(frozen=True)
class Param:
    """One declared parameter: a request field of the binary and/or a -D of a point build."""

    name: str
    kind: str                          # int | bool | str
    default: Any
    doc: str
    min: int | None = None             # inclusive range of an int
    max: int | None = None
    choices: tuple[Any, ...] = ()      # allowed values (str: required; int: optional)
    define: str | None = None          # the -D name of the point build (static families)
    why: str = ""

    def check(self, value: Any, where: str) -> Any:
        """`value` as the harness stores it; BadPoint with the harness's message if refused."""
        if self.kind == "int":
            integral = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
            if isinstance(value, bool) or not integral or abs(value) >= _JSON_INT_LIMIT:
                raise BadPoint(f"parameter '{self.name}' must be an integer ({where})")
            value = int(value)
            if not self.min <= value <= self.max:  # type: ignore[operator]
                raise BadPoint(f"parameter '{self.name}' = {value} outside [{self.min}, {self.max}] ({where})")
        elif self.kind == "bool":
            if not isinstance(value, bool):
                raise BadPoint(f"parameter '{self.name}' must be true or false ({where})")
        elif not isinstance(value, str):
            raise BadPoint(f"parameter '{self.name}' must be a string ({where})")
        if self.choices and value not in self.choices:
            shown = value if self.kind == "int" else f"'{value}'"
            raise BadPoint(f"parameter '{self.name}' = {shown} is not one of the allowed values "
                           f"{list(self.choices)} ({where})")
        return value

    def summary(self) -> str:
        """The doc with the allowed values, for listings (`hazards list --params`)."""
        if self.choices:
            return " | ".join(str(c) for c in self.choices) + ": " + self.doc
        if self.kind == "int":
            return f"{self.doc} [{self.min}..{self.max}]"
        return self.doc

    def harness_json(self) -> dict[str, Any]:
        """The parameter as the binary lists it (`--list`)."""
        d: dict[str, Any] = {"name": self.name, "kind": self.kind, "default": self.default, "doc": self.doc}
        if self.kind == "int":
            d.update(min=self.min, max=self.max)
        if self.choices:
            d["choices"] = list(self.choices)
        return d


@dataclasses.dataclass(frozen=True)
class Variant:
    """One named configuration of a family: a parameter preset with a role.

    `role == "broken"` makes the variant a *canary*: it must be detected by every oracle in
    `detected_by` within the family's budget, or the check has gone blind.
    """

    name: str
    role: Role
    description: str
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    detected_by: tuple[Oracle, ...] = ()
    why: str = ""

    @property
    def is_canary(self) -> bool:
        return self.role == "broken"


@dataclasses.dataclass(frozen=True)
class StaticVerdict:
    """The static model's prediction for one parameter point.

    `rate` is the chance per launch that the point fails on the GPU the family runs on here
    (the H200: NVIDIA), as the model predicts it: 1.0 every launch, 0 < p < 1 intermittent,
    0.0 for a point that is hazardous in the source but is not expected to show on this
    platform (an AMD-only mechanism, a race the compiler repairs, a weak outcome the memory
    model allows but the hardware was never seen to produce), None where the model makes no
    prediction (a timing-dependent race it cannot rate). A safe point's rate is 0.
    `hazards explore` holds the model to it: a point predicted to fail must fail within the
    launches its rate implies, a point predicted not to fail must run clean.
    """

    hazardous: bool
    reason: str
    rate: float | None = None

    def __post_init__(self) -> None:
        if self.rate is not None and not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"a predicted rate is a probability, got {self.rate!r}")

    @property
    def expected_rate(self) -> float | None:
        """The per-launch failure rate predicted here: 0 for a safe point, else `rate`."""
        return 0.0 if not self.hazardous else self.rate


def combined_rate(rates: list[float | None]) -> float | None:
    """The per-launch rate of a point with several independent hazards: 1 - prod(1 - r)
    over the rated ones (a lower bound when some are not rated, which can only add
    failures); None when none is rated above 0 and some is not rated."""
    rated = [r for r in rates if r is not None]
    if len(rated) == 1 and len(rates) == 1:
        return rated[0]
    clean = 1.0
    for r in rated:
        clean *= 1.0 - r
    if len(rated) < len(rates) and clean == 1.0:
        return None
    return 1.0 - clean


@dataclasses.dataclass(frozen=True)
class Family:
    """One hazard class of the catalog.

    `static_model(params)` predicts from the parameters alone whether a point is
    hazardous. `strategy()` returns a hypothesis strategy of parameter dicts (always with
    a `variant` key). `binary` names the harness binary built from
    `standalone/<source_dir>/<binary>.cu`; None for static-only families (checked on
    emitted code). Families from a table (`load_family`) carry `params` and `counters`.
    """

    name: str
    summary: str
    variants: tuple[Variant, ...]
    static_model: Callable[[dict[str, Any]], StaticVerdict]
    strategy: Callable[[], Any]
    source_dir: str = ""
    binary: str | None = None
    platforms: tuple[str, ...] = ("cuda",)
    default_launches: int = 200
    timeout_s: float = 20.0
    runtime_params: dict[str, str] = dataclasses.field(default_factory=dict)  # name -> doc
    # Metrics that, when > 0 in a failing run, mean the harness's own machinery went wrong
    # rather than the seeded hazard (e.g. ordering: a bounded spin that gave up, a litmus slot
    # never written). Such a run does not count as detecting a canary. Families whose seeded
    # hazard *is* a spin that never ends (barrier_layout's lost release) leave it empty.
    harness_anomalies: tuple[str, ...] = ()
    params: tuple[Param, ...] = ()
    counters: tuple[str, ...] = ()
    table_path: Path | None = None
    # What the family module adds beyond its table (`load_family`'s keywords): a static check
    # of a point's emitted code (its Findings), the check ids a canary's static check must
    # report, the targets the catalog judges it on (the first is the primary listing) and
    # which of them a point builds for, and a sentence for a hang its tripwire caught
    # (explain_hang(snapshot, params[, defines]): the build's -D defines, None for the default build).
    static_check: Callable[..., list[Any]] | None = None
    predicted_checks: Callable[..., set[str]] | None = None
    static_archs: tuple[str | None, ...] = (None,)
    static_targets: Callable[[dict[str, Any]], tuple[str | None, ...]] | None = None
    explain_hang: Callable[..., str | None] | None = None

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        known = ", ".join(v.name for v in self.variants)
        raise UserError(f"family {self.name!r} has no variant {name!r} (known: {known})")

    @property
    def canaries(self) -> tuple[Variant, ...]:
        return tuple(v for v in self.variants if v.is_canary)

    @property
    def clean_variants(self) -> tuple[Variant, ...]:
        return tuple(v for v in self.variants if not v.is_canary)

    @property
    def source_path(self) -> Path:
        from hazards.kernel_sources import family_dir

        return family_dir(self.source_dir or self.name)

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise BadPoint(f"unknown parameter '{name}' (known: {', '.join(p.name for p in self.params)})")

    @property
    def defaults(self) -> dict[str, Any]:
        """Every declared parameter's default, in declaration order."""
        return {p.name: p.default for p in self.params}

    def resolve(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The full parameter point a request `params` runs, as the harness resolves it:
        defaults <- the named variant's preset (default: the first variant) <- explicit
        fields; `variant` and `seed` are not parameters. BadPoint, with the message the
        binary would answer, for an unknown name, a wrong type or a value out of range."""
        if not isinstance(params, Mapping):
            raise BadPoint(f"{self.name}: params must be an object")
        name = params.get("variant", self.variants[0].name if self.variants else None)
        if not isinstance(name, str):
            raise BadPoint(f"{self.name}: variant must be a string")
        if name not in {v.name for v in self.variants}:
            known = ", ".join(v.name for v in self.variants)
            raise BadPoint(f"{self.name}: unknown variant '{name}' (known: {known})")
        out = self.defaults
        for source, where in ((self.variant(name).params, "variant preset"), (params, "request")):
            for key, value in source.items():
                if key in HARNESS_KEYS:
                    continue
                spec = next((p for p in self.params if p.name == key), None)
                if spec is None:
                    raise BadPoint(f"{self.name}: unknown parameter '{key}' in {where}")
                out[key] = spec.check(value, where)
        return out

    def defines(self, params: Mapping[str, Any]) -> dict[str, int]:
        """The -D parameters of the point build for `params` (params with a `define`)."""
        point = self.resolve(params)
        return {p.define: int(point[p.name]) for p in self.params if p.define}

    def build_label(self, params: Mapping[str, Any]) -> str:
        """A build label naming every define (readable file names in the build cache)."""
        return self.name + "-" + "-".join(f"{k}{v}" for k, v in sorted(self.defines(params).items()))

    def harness_json(self) -> dict[str, Any]:
        """The table as the harness parses it and lists it (`BIN --list`, less `hz_protocol`)."""
        return _harness_json(self.name, self.summary, self.params, self.variants, self.counters)

    def table_header(self) -> str:
        """The generated C++ header embedding this table (`hz_family_table.h`)."""
        return _table_header(self.name, self.source_dir, self.harness_json())

    def build_binary(self, *, target: str | None = None, defines: Mapping[str, Any] | None = None) -> Path:
        """Build (or take from the per-user cache) this family's harness binary for `target`
        (default sm_90a); `defines` are extra -D flags (HZ_PROFILER for a profiled build),
        part of the cache key. UserError for a family with no runtime binary."""
        return build_harness(self.source_dir or self.name, target=target, defines=defines)


def _harness_json(name: str, summary: str, params: tuple[Param, ...], variants: tuple[Variant, ...],
                  counters: tuple[str, ...]) -> dict[str, Any]:
    return {"family": name, "summary": summary, "params": [p.harness_json() for p in params],
            "variants": [{"name": v.name, "role": v.role, "description": v.description, "params": dict(v.params)}
                         for v in variants],
            "counters": list(counters)}


def _table_header(name: str, source_dir: str, harness_json: dict[str, Any]) -> str:
    text = json.dumps(harness_json, separators=(",", ":"))
    if f"){_RAW_DELIMITER}\"" in text:
        raise FamilyTableError(f"{name}: the table text contains the raw-string delimiter")
    origin = f"standalone/{source_dir or name}/{TABLE_FILE}"
    return (f"// {HEADER_NAME} -- GENERATED from {origin} by hazards.family; do not edit.\n"
            "// The harness parses it at startup (hz::FamilyTable, standalone/common/harness.h).\n"
            "#pragma once\n"
            "namespace hz {\n"
            f'inline constexpr const char* kFamilyTableJson = R"{_RAW_DELIMITER}({text}){_RAW_DELIMITER}";\n'
            "}  // namespace hz\n")


def build_harness(folder: str, *, target: str | None = None, defines: Mapping[str, Any] | None = None,
                  standalone: Path | None = None) -> Path:
    """Build (or take from the per-user cache) the harness binary of the table in
    `standalone/<folder>/`, its table embedded as the generated header: what a family's
    binary is, needing only the table (a reference megakernel's package builds through
    this without the catalog above it). `standalone`: another source tree than the
    checkout's (a git revision's, `kernel_sources.revision_sources`); its table and sources."""
    from hazards.engine import toolchain
    from hazards.engine.build import build_family
    from hazards.kernel_sources import standalone_dir

    root = Path(standalone) if standalone is not None else standalone_dir()
    t = read_table(root / folder / TABLE_FILE)
    if not t["binary"]:
        raise UserError(f"family {t['name']!r} has no runtime binary (static checks only)")
    header = _table_header(t["name"], t["source_dir"],
                           _harness_json(t["name"], t["summary"], t["params"], t["variants"], t["counters"]))
    return build_family(root, t["source_dir"], t["binary"], target=target or toolchain.SM90A,
                        defines=dict(defines) if defines else None, generated={HEADER_NAME: header})


# ------------------------------------------------------------------- the table file --
_TOP_KEYS = {"name", "summary", "why", "binary", "platforms", "default_launches", "timeout_s",
             "harness_anomalies", "counters", "param_sets", "params", "variants"}
_PARAM_KEYS = {"kind", "default", "doc", "why", "min", "max", "choices", "define"}
_VARIANT_KEYS = {"role", "description", "why", "params", "param_sets", "detected_by"}
_SET_KEYS = {"why", "params"}


def _fail(path: Path, msg: str) -> FamilyTableError:
    return FamilyTableError(f"{path}: {msg}")


def _keys(path: Path, where: str, got: Mapping[str, Any], allowed: set[str], required: set[str]) -> None:
    unknown = sorted(set(got) - allowed)
    if unknown:
        raise _fail(path, f"{where}: unknown key(s) {', '.join(unknown)} (allowed: {', '.join(sorted(allowed))})")
    missing = sorted(required - set(got))
    if missing:
        raise _fail(path, f"{where}: missing key(s) {', '.join(missing)}")


def _text(path: Path, where: str, value: Any, *, empty: bool = False) -> str:
    if not isinstance(value, str) or (not empty and not value.strip()):
        raise _fail(path, f"{where} must be a{'' if empty else ' non-empty'} string")
    return value.strip()


def _strings(path: Path, where: str, value: Any, allowed: tuple[str, ...] | None = None) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise _fail(path, f"{where} must be a list of strings")
    if allowed is not None:
        bad = [x for x in value if x not in allowed]
        if bad:
            raise _fail(path, f"{where}: {', '.join(bad)} not one of {', '.join(allowed)}")
    if len(set(value)) != len(value):
        raise _fail(path, f"{where} lists a name twice")
    return tuple(value)


def _param(path: Path, name: str, raw: Any) -> Param:
    where = f"params.{name}"
    if not isinstance(raw, dict):
        raise _fail(path, f"{where} must be a table")
    _keys(path, where, raw, _PARAM_KEYS, {"kind", "default", "doc"})
    kind = raw["kind"]
    if kind not in KINDS:
        raise _fail(path, f"{where}.kind must be one of {', '.join(KINDS)}, not {kind!r}")
    lo, hi, choices = raw.get("min"), raw.get("max"), tuple(raw.get("choices", ()))
    if kind == "int":
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (lo, hi)) or lo > hi:
            raise _fail(path, f"{where}: an int needs integer min <= max")
    elif lo is not None or hi is not None:
        raise _fail(path, f"{where}: only an int has min/max")
    if kind == "str" and not choices:
        raise _fail(path, f"{where}: a str needs its choices")
    if kind == "bool" and choices:
        raise _fail(path, f"{where}: a bool has no choices")
    define = raw.get("define")
    if define is not None and not (isinstance(define, str) and define.isidentifier()):
        raise _fail(path, f"{where}.define must be a C identifier")
    p = Param(name, kind, raw["default"], _text(path, f"{where}.doc", raw["doc"]), lo, hi, choices,
              define, _text(path, f"{where}.why", raw.get("why", ""), empty=True))
    for c in choices:
        try:
            Param(name, kind, c, p.doc, lo, hi).check(c, "choices")
        except BadPoint as e:
            raise _fail(path, f"{where}.choices: {e}") from None
    try:
        p.check(p.default, "default")
    except BadPoint as e:
        raise _fail(path, f"{where}: {e}") from None
    return p


def _variant(path: Path, name: str, raw: Any, sets: Mapping[str, dict[str, Any]]) -> Variant:
    where = f"variants.{name}"
    if not isinstance(raw, dict):
        raise _fail(path, f"{where} must be a table")
    _keys(path, where, raw, _VARIANT_KEYS, {"role", "description"})
    role = raw["role"]
    if role not in ROLES:
        raise _fail(path, f"{where}.role must be one of {', '.join(ROLES)}, not {role!r}")
    detected_by = _strings(path, f"{where}.detected_by", raw.get("detected_by", []), ORACLES)
    if role == "broken" and not detected_by:
        raise _fail(path, f"{where}: a broken variant (canary) names the oracle(s) that detect it (detected_by)")
    if role != "broken" and detected_by:
        raise _fail(path, f"{where}: only a broken variant is detected (detected_by on a {role} variant)")
    own = raw.get("params", {})
    if not isinstance(own, dict):
        raise _fail(path, f"{where}.params must be a table")
    params = dict(own)  # the variant's own fields win over its param_sets (earlier sets win)
    for s in _strings(path, f"{where}.param_sets", raw.get("param_sets", [])):
        if s not in sets:
            raise _fail(path, f"{where}.param_sets: no param_sets.{s} (known: {', '.join(sets) or 'none'})")
        for key, value in sets[s].items():
            params.setdefault(key, value)
    description = _text(path, f"{where}.description", raw["description"])
    if "\n" in description:
        raise _fail(path, f"{where}.description is one line (the long story goes in `why`)")
    return Variant(name, role, description, params, detected_by,  # type: ignore[arg-type]
                   _text(path, f"{where}.why", raw.get("why", ""), empty=True))


def read_table(path: Path) -> dict[str, Any]:
    """A family.toml checked against the schema, as the keyword arguments of `Family`
    (less the static model and strategy). FamilyTableError names the file and the key."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as e:
        raise FamilyTableError(f"cannot read family table {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise _fail(path, f"not TOML: {e}") from None
    _keys(path, "table", raw, _TOP_KEYS, {"name", "summary", "variants"})
    name = _text(path, "name", raw["name"])
    binary = raw.get("binary")
    if binary is not None:
        binary = _text(path, "binary", binary)
        if not (path.parent / f"{binary}.cu").is_file():
            raise _fail(path, f"binary = {binary!r} but there is no {binary}.cu beside the table")
    raw_params = raw.get("params", {})
    if not isinstance(raw_params, dict):
        raise _fail(path, "params must be a table of tables")
    params = tuple(_param(path, k, v) for k, v in raw_params.items())
    sets: dict[str, dict[str, Any]] = {}
    for set_name, s in raw.get("param_sets", {}).items():
        if not isinstance(s, dict) or not isinstance(s.get("params"), dict):
            raise _fail(path, f"param_sets.{set_name} must be a table with a params table")
        _keys(path, f"param_sets.{set_name}", s, _SET_KEYS, {"params"})
        sets[set_name] = s["params"]
    if not isinstance(raw["variants"], dict) or not raw["variants"]:
        raise _fail(path, "variants must be a non-empty table of tables")
    variants = tuple(_variant(path, k, v, sets) for k, v in raw["variants"].items())
    roles = {v.role for v in variants}
    if "broken" not in roles or not roles - {"broken"}:
        raise _fail(path, "a family needs at least one broken variant and one reference or fixed variant")
    counters = _strings(path, "counters", raw.get("counters", []))
    if len(counters) > MAX_COUNTERS:
        raise _fail(path, f"counters: at most {MAX_COUNTERS} (hz::kNumCounters)")
    anomalies = _strings(path, "harness_anomalies", raw.get("harness_anomalies", []))
    if set(anomalies) - set(counters):
        raise _fail(path, f"harness_anomalies must be counters the binary reports: "
                          f"{', '.join(sorted(set(anomalies) - set(counters)))} is not")
    platforms = _strings(path, "platforms", raw.get("platforms", ["cuda"]), PLATFORMS)
    launches, timeout = raw.get("default_launches", 200), raw.get("timeout_s", 20.0)
    if not isinstance(launches, int) or isinstance(launches, bool) or launches < 1:
        raise _fail(path, "default_launches must be a positive integer")
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
        raise _fail(path, "timeout_s must be a positive number")
    return dict(name=name, summary=" ".join(_text(path, "summary", raw["summary"]).split()),
                variants=variants, source_dir=path.parent.name, binary=binary, platforms=platforms,
                default_launches=launches, timeout_s=float(timeout),
                runtime_params={p.name: p.summary() for p in params} if binary else {},
                harness_anomalies=anomalies, params=params, counters=counters, table_path=path)


def family_from_table(path: Path, *, static_model: Callable[[dict[str, Any]], StaticVerdict],
                      strategy: Callable[[], Any], **capabilities: Any) -> Family:
    """The Family described by the table at `path`, with its Python behaviour. Every
    variant's preset is resolved once here, so a table whose preset the binary would refuse
    never loads."""
    fam = Family(static_model=static_model, strategy=strategy, **read_table(path), **capabilities)
    for v in fam.variants:
        try:
            fam.resolve({"variant": v.name})
        except BadPoint as e:
            raise _fail(path, f"variants.{v.name}: {e}") from None
    return fam


def load_family(folder: str, *, static_model: Callable[[dict[str, Any]], StaticVerdict],
                strategy: Callable[[], Any], **capabilities: Any) -> Family:
    """The Family described by `standalone/<folder>/family.toml`, with its behaviour on the
    Python side (the static model, the hypothesis strategy, and `capabilities`: the
    optional `Family` fields static_check, predicted_checks, static_archs, static_targets,
    explain_hang)."""
    from hazards.kernel_sources import family_dir

    return family_from_table(family_dir(folder) / TABLE_FILE, static_model=static_model, strategy=strategy,
                             **capabilities)
