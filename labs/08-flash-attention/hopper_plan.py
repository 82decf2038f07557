# Lab skeleton generated from solutions/08-flash-attention/hopper_plan.py by `./course labs` [lab-hash e5a424c18923].
# Students: fill in the TODO(lab08.k) blocks, then run `./course grade 08`.
# Instructors: edit the solution file instead, then run `./course labs`.
"""Lab 08, parts 10 and 11: the arithmetic the reference's Hopper forward (flash_forward_hopper.cu) rests on.

The Hopper kernel is not a task (lesson 08, section 11: read it after rung 3 passes). These two functions are the
parts of it that are bookkeeping rather than instructions, small enough to write and to check on any machine:

  - ring_plan and deepest_ring (lab08.10): where Q's tile, the K and V stages of the ring and the mbarriers sit in
    a block's shared memory, how many bytes the block asks for, and how many stages 227 KiB could hold;
  - ring_waits (lab08.11): for key block j, its stage in the ring and the phase parity the consumers wait on
    (the stage's "full" barrier: its tiles landed) and the producer waits on (its "empty" barrier: the consumers
    are done with the block it held before).

The grader (tests/test_08_flash_attention.py, test_hopper_*) checks ring_plan against the kernel's own numbers
(its constants(): hopper_shared_bytes_d64, _d128) and ring_waits against a simulation of the mbarriers with a
producer, a copy engine and consumers scheduled in random orders; neither needs a GPU.

The kernel's inputs, given (its constexprs, same names without the k):
"""
from __future__ import annotations

from typing import NamedTuple

BLOCK_M = 128  # query rows a block: 2 consumer warpgroups x wgmma's M of 64 (kBlockM)
BLOCK_N = 128  # keys a key block: wgmma's N of S = Q K^T (kBlockN)
ELEMENT_BYTES = 2  # bfloat16 / float16
SWIZZLE_ATOM_BYTES = 1024  # the 128-byte swizzle repeats every 8 rows of 128 B: tiles start on 1024-byte boundaries
BARRIER_BYTES = 8  # an mbarrier is one 64-bit word of shared memory
SHARED_LIMIT = 227 * 1024  # the dynamic shared memory a block may opt in to on an H100 or H200


# --8<-- [start:ring_plan]
class RingPlan(NamedTuple):
    """Byte offsets from the block's 1024-aligned base, and what the block asks for at launch."""

    q: int  # Q's tile: BLOCK_M rows of head_dim elements
    k: int  # stage s's K tile starts at k + s * kv_tile_bytes
    v: int  # stage s's V tile starts at v + s * kv_tile_bytes
    barriers: int  # q_full, k_full[stages], v_full[stages], empty[stages], BARRIER_BYTES each
    kv_tile_bytes: int  # one K (or V) tile: BLOCK_N rows; what a full barrier's phase waits for
    total: int  # the launch's dynamic shared memory: the tiles, the barriers and the alignment slack


def ring_plan(head_dim: int, stages: int) -> RingPlan:
    """The kernel's shared-memory layout (HopperTiles in flash_forward_hopper.cu) for a ring of `stages` stages."""
    # TODO(lab08.10): Q's tile, then the stages' K tiles, then their V tiles, then 1 + 3 x stages
    #   mbarriers; total adds SWIZZLE_ATOM_BYTES, the slack that lets the kernel align the base up to 1024
    raise NotImplementedError("lab08.10: ring_plan is not written yet")


def deepest_ring(head_dim: int, limit: int = SHARED_LIMIT) -> int:
    """The most stages whose ring_plan fits `limit` bytes (0 if not even one does)."""
    # TODO(lab08.10): the largest stages with ring_plan(head_dim, stages).total <= limit
    raise NotImplementedError("lab08.10: deepest_ring is not written yet")
# --8<-- [end:ring_plan]


# --8<-- [start:ring_waits]
def ring_waits(j: int, stages: int) -> tuple[int, int, int]:
    """Key block j (0, 1, 2, ...) in a ring of `stages` stages: (stage, full_parity, empty_parity).

    The consumers wait on the stage's full barriers with full_parity (K_j and V_j have landed); the producer waits
    on its empty barrier with empty_parity before it copies K_j and V_j in (the consumers released block j - stages).
    An mbarrier counts completed phases; a wait names the parity of the phase it waits for, and returns once that
    phase has completed. A fresh barrier is in phase 0, so a wait on parity 1 returns at once.
    """
    # TODO(lab08.11): block j sits in stage j % stages during lap j // stages; the full barrier's phase of
    #   that lap has the lap's parity; the producer waits for the empty barrier's phase of the lap before (the
    #   opposite parity: in lap 0 that is the "previous" phase of a fresh barrier, which passes)
    raise NotImplementedError("lab08.11: ring_waits is not written yet")
# --8<-- [end:ring_waits]
