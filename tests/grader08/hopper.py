"""hopper_plan.py (lab08.10, lab08.11), no GPU needed: the Hopper forward's shared-memory plan, and its
ring's mbarrier parities driven through a simulation of the ring."""
from __future__ import annotations

import importlib.util
import random

import harness
from coursekit import trees
from grader08.common import FLASH_HEAD_DIMS, LAB, constants
from harness.check import first_line, run_student

__all__ = ["test_hopper_plan_is_the_kernels", "test_hopper_ring_plan", "test_hopper_ring_waits",
           "test_ring_simulation_catches_wrong_parities"]


# ---------------------------------------------------------------- hopper_plan.py (lab08.10, lab08.11), no GPU needed
# The Hopper forward (flash_forward_hopper.cu) is the reference's; these two tasks are its bookkeeping in Python. The
# grader's reference for the shared-memory plan is the solutions tree's hopper_plan.py (never the graded copy, as
# harness.attention's MODEL), and test_hopper_plan_is_the_kernels checks that reference against the kernel's own
# constants(); the ring's parities are checked against a simulation of its mbarriers.
PLAN_HINT = (
    "hopper_plan.py (lab08.10): from the aligned base, Q's tile (BLOCK_M x head_dim elements) at 0, then stages K "
    "tiles and stages V tiles (BLOCK_N x head_dim each), then 1 + 3 x stages mbarriers of BARRIER_BYTES (q_full; "
    "k_full, v_full and empty per stage); total = SWIZZLE_ATOM_BYTES of alignment slack + all of that; "
    "deepest_ring: the most stages whose total <= limit")
WAITS_HINT = (
    "hopper_plan.py (lab08.11): key block j uses stage j % stages in lap j // stages; the consumers wait on the full "
    "barriers with the lap's parity (lap & 1), the producer on the empty barrier with the other one ((lap & 1) ^ 1): "
    "it waits for the consumers' release of lap - 1, and a fresh barrier's wait on parity 1 returns at once")
HOPPER_PLAN_CASES = [(d, s) for d in FLASH_HEAD_DIMS for s in range(1, 9)] + [(32, 3), (256, 1), (256, 2)]


def hopper_plan_module():
    """The graded tree's hopper_plan.py (lab08.10 and lab08.11)."""
    return LAB.python("hopper_plan")


def _reference_hopper_plan():
    path = trees.SOLUTIONS / LAB.lab.name / "hopper_plan.py"
    spec = importlib.util.spec_from_file_location("course_lab08_hopper_plan_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@harness.reference_check  # the reference's plan against the kernel it describes
def test_hopper_plan_is_the_kernels():
    """The reference hopper_plan.py describes flash_forward_hopper.cu as built: its given constants are the kernel's
    tile (constants(): hopper_block_m, hopper_block_n), and at the kernel's stage count per head dim (hopper_stages)
    its total is the dynamic shared memory the kernel launches with (hopper_shared_bytes, HopperTiles::kSharedBytes)
    and fits 227 KiB."""
    ref, c = _reference_hopper_plan(), constants()
    for d in FLASH_HEAD_DIMS:
        key = f"d{d}"
        assert (c.get(f"hopper_block_m_{key}"), c.get(f"hopper_block_n_{key}")) == (ref.BLOCK_M, ref.BLOCK_N), (
            f"constants(): the Hopper tile for {key} is not hopper_plan.py's ({ref.BLOCK_M}, {ref.BLOCK_N}): {c}")
        stages = c.get(f"hopper_stages_{key}")
        plan = ref.ring_plan(d, stages)
        assert plan.total == c.get(f"hopper_shared_bytes_{key}"), (
            f"hopper_plan.ring_plan({d}, {stages}).total = {plan.total}, the kernel's kSharedBytes = "
            f"{c.get(f'hopper_shared_bytes_{key}')}: the page and the task describe another kernel")
        assert plan.total <= ref.SHARED_LIMIT and stages <= ref.deepest_ring(d)
        for s in range(1, ref.deepest_ring(d) + 1):  # TMA's swizzled boxes: every tile on a 1024-byte boundary
            tiles = ref.ring_plan(d, s)
            offsets = (tiles.q, tiles.k, tiles.v, tiles.kv_tile_bytes)
            assert all(offset % ref.SWIZZLE_ATOM_BYTES == 0 for offset in offsets), (d, s, tiles)


@harness.tasks("lab08.10")
def test_hopper_ring_plan():
    """ring_plan's offsets and total equal the kernel's layout for head dims 64 and 128 (and 32, 256: the rule, not
    a table) at 1 to 8 stages; deepest_ring is the most stages that fit, at
    227 KiB and at other limits."""
    module, ref = hopper_plan_module(), _reference_hopper_plan()
    for d, stages in HOPPER_PLAN_CASES:
        got = run_student(f"hopper_plan.ring_plan({d}, {stages})", lambda: module.ring_plan(d, stages),
                          hint=PLAN_HINT)
        want = ref.ring_plan(d, stages)
        fields = want._fields
        try:
            got_fields = tuple(getattr(got, name) for name in fields)
        except AttributeError:
            raise harness.GradeFailure(f"hopper_plan.ring_plan({d}, {stages}) returned {got!r}, not a RingPlan "
                                       f"(fields {', '.join(fields)})\n  hint: {PLAN_HINT}") from None
        wrong = [f"{name} = {g} (the kernel: {w})" for name, g, w in zip(fields, got_fields, want) if g != w]
        if wrong:
            raise harness.GradeFailure(
                f"hopper_plan.ring_plan({d}, {stages}): " + "; ".join(wrong) + " (flash_forward_hopper.cu's "
                f"HopperTiles<{d}>: kSharedBytes, the q_tile / k_tiles / v_tiles / q_full offsets)\n"
                f"  hint: {PLAN_HINT}")
    for d in (*FLASH_HEAD_DIMS, 256):
        for limit in (ref.SHARED_LIMIT, 100 * 1024, 48 * 1024, 1024):
            got = run_student(f"hopper_plan.deepest_ring({d}, {limit})", lambda: module.deepest_ring(d, limit),
                              hint=PLAN_HINT)
            want = ref.deepest_ring(d, limit)
            if got != want:
                totals = ", ".join(f"{s} stages {ref.ring_plan(d, s).total} B" for s in range(max(want, 1), want + 2))
                raise harness.GradeFailure(
                    f"hopper_plan.deepest_ring({d}, limit={limit}) = {got!r}, expected {want} ({totals})\n"
                    f"  hint: {PLAN_HINT}")


class _Mbarrier:
    """An mbarrier's phases (PTX ISA, mbarrier): a phase completes when `expected` arrivals have been made and the
    bytes announced by expect-tx arrivals have landed; a wait on parity p returns once the phase of parity p has
    completed, i.e. while the current phase's parity is not p. A fresh barrier is in phase 0."""

    def __init__(self, expected: int):
        self.expected, self.arrivals, self.bytes, self.phase = expected, 0, 0, 0

    def arrive(self, expect_bytes: int = 0) -> None:
        self.arrivals += 1
        self.bytes += expect_bytes
        self._complete()

    def landed(self, count: int) -> None:
        self.bytes -= count
        self._complete()

    def _complete(self) -> None:
        if self.arrivals == self.expected and self.bytes == 0:
            self.phase, self.arrivals = self.phase + 1, 0

    def passes(self, parity: int) -> bool:
        return self.phase % 2 != parity


class RingFailure(Exception):
    pass


def _ring_position(waits, j: int, stages: int):
    """waits(j, stages) (ring_waits), checked: (stage in 0..stages - 1, full_parity 0 or 1, empty_parity 0 or 1)."""
    answer = waits(j, stages)
    ok = (isinstance(answer, tuple) and len(answer) == 3 and 0 <= answer[0] < stages
          and answer[1] in (0, 1) and answer[2] in (0, 1))
    if not ok:
        raise RingFailure(f"ring_waits({j}, {stages}) = {answer!r}: expected (stage in 0..{stages - 1}, "
                          "full_parity 0 or 1, empty_parity 0 or 1)")
    return answer


def simulate_ring(waits, stages: int, blocks: int, consumers: int, seed: int) -> None:
    """The kernel's ring with `waits` (ring_waits) as its bookkeeping: one producer thread (waits on empty, arms the
    stage's full barriers with the tile bytes, issues the K and V copies), a copy engine landing the copies in any
    order, `consumers` warps (wait for K_j, then V_j, read them, arrive on empty: kEmptyArrivals of them). Each step
    runs one actor that can move, chosen at random. RingFailure says what went wrong: a wait that let a consumer
    read a stage before its block landed or after it was refilled, a producer refilling a stage still being read, or
    every actor waiting (a deadlock)."""
    rng = random.Random(seed)
    tile = 1  # bytes a tile: the simulation counts copies, not bytes
    k_full, v_full = [_Mbarrier(1) for _ in range(stages)], [_Mbarrier(1) for _ in range(stages)]
    empty = [_Mbarrier(consumers) for _ in range(stages)]
    held = [[None, None] for _ in range(stages)]  # the key block whose K (0) and V (1) a stage holds; None: in flight
    in_flight: list[tuple[int, int, int]] = []  # (stage, 0 K / 1 V, key block)
    producer = 0  # the next key block the producer loads
    consumer_next = [0] * consumers  # each consumer's next key block
    consumer_step = [0] * consumers  # 0: waits for K, 1: waits for V

    position = lambda j: _ring_position(waits, j, stages)

    def producer_move():
        nonlocal producer
        stage, _, parity = position(producer)
        if not empty[stage].passes(parity):
            return False
        late = [c for c in range(consumers) if consumer_next[c] <= producer - stages]
        if late:
            raise RingFailure(f"the producer's wait on empty[{stage}] with parity {parity} let it copy key block "
                              f"{producer} into stage {stage} while consumer {late[0]} had not released key block "
                              f"{producer - stages} from it")
        for kind, barrier in ((0, k_full[stage]), (1, v_full[stage])):
            barrier.arrive(expect_bytes=tile)
            held[stage][kind] = None
            in_flight.append((stage, kind, producer))
        producer += 1
        return True

    def copy_lands():
        stage, kind, block = in_flight.pop(rng.randrange(len(in_flight)))
        held[stage][kind] = block
        (k_full if kind == 0 else v_full)[stage].landed(tile)
        return True

    def consumer_move(c):
        j = consumer_next[c]
        stage, parity, _ = position(j)
        kind = consumer_step[c]
        if not (k_full if kind == 0 else v_full)[stage].passes(parity):
            return False
        name = "KV"[kind]
        if held[stage][kind] != j:
            what = "still in flight" if held[stage][kind] is None else f"key block {held[stage][kind]}'s"
            raise RingFailure(f"consumer {c}'s wait on {name.lower()}_full[{stage}] with parity {parity} returned "
                              f"for key block {j}, but stage {stage}'s {name} tile is {what}: it has not landed")
        if kind == 0:
            consumer_step[c] = 1
        else:
            empty[stage].arrive()
            consumer_step[c], consumer_next[c] = 0, j + 1
        return True

    while producer < blocks or in_flight or min(consumer_next) < blocks:
        movers = ([producer_move] if producer < blocks else []) + ([copy_lands] if in_flight else [])
        movers += [lambda c=c: consumer_move(c) for c in range(consumers) if consumer_next[c] < blocks]
        rng.shuffle(movers)
        if not any(move() for move in movers):
            parts = []
            if producer < blocks:
                stage, _, parity = position(producer)
                parts.append(f"the producer waits on empty[{stage}] (phase {empty[stage].phase}) with parity "
                             f"{parity} to load key block {producer}")
            for c in range(consumers):
                if consumer_next[c] < blocks:
                    j = consumer_next[c]
                    stage, parity, _ = position(j)
                    name = "kv"[consumer_step[c]]
                    barrier = (k_full if consumer_step[c] == 0 else v_full)[stage]
                    parts.append(f"consumer {c} waits on {name}_full[{stage}] (phase {barrier.phase}) with parity "
                                 f"{parity} for key block {j}")
            raise RingFailure(f"deadlock with {stages} stages, {blocks} key blocks: " + "; ".join(parts))


RING_CASES = [(stages, blocks) for stages in (1, 2, 3, 4) for blocks in (0, 1, 2, 3, 5, 8, 13)]


@harness.tasks("lab08.11")
def test_hopper_ring_waits():
    """ring_waits drives a simulated ring (a producer, a copy engine landing copies in any order, 4 consumer warps
    scheduled at random, 20 orders a case) at 1 to 4 stages over 0 to 13 key blocks: no consumer reads a tile before
    it lands or after it is refilled, the producer never refills a stage still being read, and nothing deadlocks."""
    module = hopper_plan_module()
    for stages, blocks in RING_CASES:
        for seed in range(20):
            try:
                simulate_ring(lambda j, s: module.ring_waits(j, s), stages, blocks, consumers=4, seed=seed)
            except RingFailure as failure:
                raise harness.GradeFailure(f"hopper_plan.ring_waits, ring of {stages} stages, {blocks} key blocks "
                                           f"(schedule {seed}): {failure}\n  hint: {WAITS_HINT}") from None
            except Exception as error:
                raise harness.GradeFailure(f"hopper_plan.ring_waits raised {type(error).__name__}: "
                                           f"{first_line(error)}\n  hint: {WAITS_HINT}") from None


@harness.reference_check  # the grader's own simulation
def test_ring_simulation_catches_wrong_parities():
    """The simulation passes the reference's ring_waits and fails three classic slips, each with its own words: the
    producer waiting on the lap's own parity (deadlock at its first wait), the consumers waiting on j's parity
    instead of the lap's (a read before the copy landed), and no wait on empty at all (a refill under a reader)."""
    ref = _reference_hopper_plan()
    for stages, blocks in RING_CASES:
        for seed in range(5):
            simulate_ring(ref.ring_waits, stages, blocks, consumers=4, seed=seed)
    slips = {  # what each must fail with, in at least one schedule; every schedule must fail
        "deadlock": lambda j, s: (j % s, (j // s) & 1, (j // s) & 1),  # the producer waits on its own lap's phase
        "has not landed": lambda j, s: (j % s, j & 1, ((j // s) & 1) ^ 1),  # consumers: j's parity, not the lap's
        "had not released": lambda j, s: (j % s, (j // s) & 1, 1),  # the producer's parity never changes
    }
    for phrase, waits in slips.items():
        caught = []
        for seed in range(20):
            try:
                simulate_ring(waits, 2, 8, consumers=4, seed=seed)
            except RingFailure as failure:
                caught.append(str(failure))
        assert len(caught) == 20 and any(phrase in text for text in caught), (phrase, len(caught), caught[:2])
