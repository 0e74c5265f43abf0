"""The force seam: what every force method (all-pairs kernel, tree code, several devices, MPI ranks) is.

    acc[targets] = F(pos[targets]; pos[sources])

A `ForceEvaluator` is one kernel record bound to one backend's device (the CPU, one GPU): it evaluates
the accelerations of a range of targets against a range of sources, on arrays of that device (numpy
arrays for the CPU, device pointers for CUDA), and returns the `ForceWork` it did. The integrator
(app/engine/integrator.py), the multi-device driver and `validate` only ever talk to this contract.

A `KernelRecord` is the descriptor of one variant: its name and one-line doc, where its code lives,
its typed tunables (an int from a set, a float in a range, a choice of strings), its error budget
against the float64 reference, whether the tuner sweeps it, and its backend's launch policy object
(for CUDA the policy builds the launch; for the CPU it names the numba kernel family). Adding a variant
is one source file plus one record: nothing dispatches on a name or a "kind" string.

Indexing: targets and sources are `Span`s of one position array; `acc` is indexed like the positions
(row i of acc belongs to body i), so K devices each writing their share of targets into their own copy
of acc never disagree about which row is whose.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.core.errors import ConfigError
from app.core.values import AUTO, Choice, FloatRange, IntChoice

# --- typed tunables: their types are the settings' too (app/core/values.py) ---------------------------------
Tunable = IntChoice | FloatRange | Choice


def unread_reason(spec: Tunable, values: Mapping[str, Any]) -> str | None:
    """Why `spec` does nothing at these tunable `values` (its read_when not met: the panel greys it), or
    None when the kernel reads it."""
    if spec.read_when is None:
        return None
    other, wanted = spec.read_when
    if values.get(other) in wanted:
        return None
    return f"read only when {other} is {' or '.join(map(str, wanted))} (now {values.get(other)})"


def format_tunables(values: Mapping[str, Any]) -> str:
    """'block_size=128 k=4 slices=0': tunable values as the logs, tune and the panel print them."""
    return " ".join(f"{k}={v}" for k, v in sorted(values.items()))


# --- ranges and work ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Span:
    """Bodies [start, start + count) of a position array."""

    start: int
    count: int

    @property
    def stop(self) -> int:
        return self.start + self.count

    @classmethod
    def all(cls, n: int) -> Span:
        return cls(0, int(n))

    def check_within(self, n: int, what: str = "span") -> Span:
        if self.start < 0 or self.count < 0 or self.stop > n:
            raise ValueError(f"{what} [{self.start}, {self.stop}) is not within the {n} bodies")
        return self

    def contains(self, other: Span) -> bool:
        return self.start <= other.start and other.stop <= self.stop

    def as_slice(self) -> slice:
        return slice(self.start, self.stop)


@dataclass(frozen=True)
class ForceWork:
    """What force evaluations did.

    `interactions` are the ones actually evaluated (body-body plus body-cell for a tree: `body_cell`
    says how many of them were cells); `pair_equivalent` is targets x sources, the all-pairs work that
    gives the same answer. Rates computed from the second are labelled "equivalent all-pairs".
    """

    interactions: int = 0
    pair_equivalent: int = 0
    body_cell: int = 0
    evaluations: int = 0

    def __add__(self, other: ForceWork) -> ForceWork:
        return ForceWork(
            self.interactions + other.interactions,
            self.pair_equivalent + other.pair_equivalent,
            self.body_cell + other.body_cell,
            self.evaluations + other.evaluations,
        )


def all_pairs_work(targets: Span, sources: Span) -> ForceWork:
    """The work of an all-pairs evaluation: every target meets every source. The one place N² is written."""
    pairs = int(targets.count) * int(sources.count)
    return ForceWork(interactions=pairs, pair_equivalent=pairs, evaluations=1)


# the stages of a tree evaluation, in order (ForceEvaluator.stage_ms)
STAGES = ("keys", "sort", "build", "moments", "walk")


# --- error budgets -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ErrorBudget:
    """How far a record's accelerations may be from the float64 reference (per-body relative error,
    app.model.physics.relative_error's floor): `max_rel` on the maximum; `p99_rel`, when set, on the 99th
    percentile (a tree is judged on its percentiles, an all-pairs kernel on its worst body)."""

    max_rel: float
    p99_rel: float | None = None

    def judge(self, errors: Mapping[str, float]) -> list[str]:
        """What exceeds the budget in `errors` ({'max': .., 'p99': ..}); [] when within it."""
        out = []
        if errors.get("max", 0.0) > self.max_rel:
            out.append(f"max relative error {errors['max']:.3e} > {self.max_rel:g}")
        if self.p99_rel is not None and errors.get("p99", 0.0) > self.p99_rel:
            out.append(f"99th-percentile relative error {errors['p99']:.3e} > {self.p99_rel:g}")
        return out

    def describe(self) -> str:
        text = f"max {self.max_rel:g}"
        return text + (f", p99 {self.p99_rel:g}" if self.p99_rel is not None else "")


FP32_BUDGET = ErrorBudget(max_rel=1e-4)
FP64_BUDGET = ErrorBudget(max_rel=1e-10)
_BUDGETS = {"fp32": FP32_BUDGET, "fp64": FP64_BUDGET}


# A tree walk's flops, counted as Ryoanji counts its P2P (23 per body-body: arXiv:2307.06345's benchmark
# driver) and, per body-cell, the operations of the softened monopole + quadrupole as written in
# kernels/tree/walk.cu `body_cell` (gravity; an FMA counts 2, rsqrt 1): the offset 3, r^2 5, + eps^2 1,
# rsqrt 1, inv^2 inv^3 inv^5 3, Q d 15, d.Q.d 5, the radial factor 6, the update 12 = 51.
TREE_WALK_FLOPS = (23, 51)


# --- the descriptor ----------------------------------------------------------------------------------------
# What a record is for beside being a force method of its own (KernelRecord.roles): a caller asks a
# backend's records for a role, never for a name
ROLES = {
    "default": "the backend's kernel when none is named",
    "exact": "the all-pairs sum in its precision that the live force error judges approximate records "
    "against",
    "reference": "the float64 all-pairs sum: validate's reference on this backend",
    "baseline": "NVIDIA's CUDA samples kernel: what speed-ups are quoted against, tune's fp32 check",
    "block-steps": "the tree block time steps walk (only the active groups)",
}


@dataclass(frozen=True)
class KernelRecord:
    """One selectable force variant (REBOUND's integrator-table pattern), its own descriptor."""

    name: str  # unique across all backends: the CLI's --kernel, the panel's combo entry
    doc: str  # one line: what the variant does differently
    backend: str  # "cpu" or "cuda"
    precision: str = "fp32"  # "fp32" or "fp64"
    source: str | None = None  # file under kernels/ (CUDA) or the Python module (CPU)
    entry: str | None = None  # kernel symbol prefix / function name
    tunables: tuple[Tunable, ...] = ()
    max_n: int | None = None  # largest N the variant accepts (None: any)
    origin: str = ""  # which write-up it comes from
    budget: ErrorBudget | None = None  # None: the precision's (FP32_BUDGET / FP64_BUDGET)
    tuned: bool = True  # whether `tune` sweeps it (not: the chooser itself, fp64, the heatmap kernel)
    # True for a method that approximates the all-pairs sum (a tree): the viewer then samples its live
    # force error (app/engine/force_error.py) and `validate` reports its percentiles
    approximate: bool = False
    policy: Any = field(default=None, compare=False, repr=False)  # the backend's launch policy object
    # how K devices split it (app/parallel/decomposition.py: targets, pairs, domains); None: targets
    decomposition: Any = field(default=None, compare=False, repr=False)
    # the tunable whose value is the number of steps over which the method's work repeats (a tree's
    # rebuild_every: one build, then refits): `bench` times such a method in whole cycles; None: every step
    # does the same work
    period_tunable: str | None = None
    # a tree's walk: (flops per body-body, flops per body-cell interaction), so that `bench` reports the
    # walk's FP32 throughput (docs/tree.md, "Counts"); None for a method without a walk stage
    walk_flops: tuple[int, int] | None = None
    roles: frozenset[str] = frozenset()  # ROLES it plays for its backend
    # an fp32 all-pairs sum kept as kernels/common.cuh's two-level one (partial sums of NBODY_PARTIAL_LEN
    # sources added to the running total): such a record keeps a distant cluster's pull (tests/summation.py)
    partial_sums: bool = False
    # `tune`'s phase-1 order among the swept records (0 first: the most promising); None: after them
    tune_rank: int | None = None

    def __post_init__(self):
        unknown = sorted(set(self.roles) - set(ROLES))
        if unknown:
            raise ValueError(f"{self.name}: unknown roles {unknown}; the roles are {', '.join(ROLES)}")

    @property
    def error_budget(self) -> ErrorBudget:
        return self.budget or _BUDGETS[self.precision]

    def period(self, values: Mapping[str, Any]) -> int:
        """Steps per cycle of its work at these tunable values (1 without a period tunable)."""
        return int(self.with_tunables(values)[self.period_tunable]) if self.period_tunable else 1

    def tunable(self, name: str) -> Tunable:
        for spec in self.tunables:
            if spec.name == name:
                return spec
        names = ", ".join(t.name for t in self.tunables) or "none"
        raise ConfigError(f"{self.name}: no tunable {name!r} (tunables: {names})")

    def default_tunables(self) -> dict[str, Any]:
        return {spec.name: spec.default for spec in self.tunables}

    def validate_tunables(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """`values` checked against the specs (ConfigError naming record.key and the allowed values)."""
        return {key: self.tunable(key).validate(value, self.name) for key, value in values.items()}

    def with_tunables(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The defaults overridden by validated `values`."""
        return {**self.default_tunables(), **self.validate_tunables(values)}

    def value_at(self, name: str, value: Any, n: int) -> Any:
        """Tunable `name`'s `value` as a run of N = n bodies uses it: auto (FloatRange.by_n) is its number
        for n; any other value is itself, whether or not this record has `name` (`best`'s backend reports
        the tunables of the variant it resolved to, which `best` itself does not have)."""
        if value != AUTO:
            return value
        spec = self.tunable(name)
        return spec.value_at(value, n) if isinstance(spec, FloatRange) else value

    def tunables_at(self, values: Mapping[str, Any], n: int) -> dict[str, Any]:
        """`values` as a run of N = n bodies uses them (`value_at`): what the logs, `validate` and bench's
        tunables_used report."""
        return {key: self.value_at(key, value, n) for key, value in values.items()}


def target_chunks(k: int, size: int):
    """Spans of at most `size` targets covering [0, k) (evaluations in pieces, so a progress bar moves)."""
    for start in range(0, k, size):
        yield Span(start, min(size, k - start))


def with_role(records, role: str, precision: str | None = None) -> KernelRecord:
    """The record among `records` that plays `role` (in `precision`, when given); ConfigError when none
    does (a backend without, e.g., a tree for block steps)."""
    for rec in records:
        if role in rec.roles and (precision is None or rec.precision == precision):
            return rec
    where = f" in {precision}" if precision else ""
    raise ConfigError(f"no kernel plays the role {role!r}{where} ({ROLES[role]})")


# --- the evaluator -----------------------------------------------------------------------------------------
def drain(phases):
    """Run an evaluation given in phases to its end: `phases` is a generator that yields where it would
    wait for its device (before a host read) and returns the result. One caller drains it at once; the
    single multi-device driver takes several devices' phases in turns instead
    (app/parallel/multidevice.py)."""
    while True:
        try:
            next(phases)
        except StopIteration as done:
            return done.value


class ForceEvaluator(ABC):
    """One record on one device: accelerations of targets against sources, written into acc[targets].

    `pos` holds [x, y, z, m] rows in the record's precision and `acc` rows [ax, ay, az, *] on the
    evaluator's device. `tunables` are applied from the next `evaluate`. Implementations must give the
    same rows for a span of targets as the full evaluation does (tests/test_force_seam.py checks every
    record), and count their own work.
    """

    record: KernelRecord

    def __init__(self, record: KernelRecord):
        self.record = record
        self._tunables = record.default_tunables()

    @property
    def tunables(self) -> dict[str, Any]:
        return dict(self._tunables)

    def set_tunables(self, **values) -> None:
        self._tunables = {**self._tunables, **self.record.validate_tunables(values)}

    @abstractmethod
    def evaluate(self, pos, acc, targets: Span, sources: Span, stream=None) -> ForceWork:
        """acc[targets] = the accelerations of pos[targets] due to pos[sources] (asynchronous on a GPU)."""

    def wants_totals(self) -> bool:
        """Whether this evaluator decides something from the whole evaluation's interaction count
        (a tree's adaptive rebuild, app/engine/refit_cadence.py): under a domain split the run then sums the
        devices' counts after each evaluation and gives it every device (`observe_evaluation`)."""
        return False

    def observe_evaluation(self, interactions: int) -> None:  # noqa: B027 - a hook: most evaluators ignore it
        """The whole evaluation's interaction count, summed over the devices of a domain split."""

    def stage_ms(self) -> dict[str, float]:
        """Milliseconds per stage of the evaluations since the last call, then reset: a method with
        stages (a tree: `STAGES`, in that order, plus any of its own such as `gather`) reports them; the
        backends put them into StepTimings.extra as "stage:<name>" (app.engine.timing.stage_entries). {} for a
        method with one kernel."""
        return {}

    def bytes_per_body(self, n: int) -> int | None:
        """Memory this evaluator holds per body for N = n beyond the state (host bytes on the CPU, device
        bytes on a GPU), for `info --kernels`; None when it holds none worth stating (all-pairs)."""
        return None
