"""Which rows go to which data-parallel rank and into which micro-batch (pure planning).

With `policy.maxTokensPerMicroBatch` a micro-batch is a token budget instead of a row count: rows
(prompt + response) of very different lengths are laid end to end in one sequence
(`network.PackedRows`), so no position is spent on padding, and the ranks get about the same
number of tokens instead of the same number of rows (a rank with the long rows would otherwise
make every other rank wait at the gradient all-reduce). verl's dynamic batch size
(ppo_max_token_len_per_gpu) and its sequence-length balancing do the same.

The plan never changes the step's loss or gradient: `StepAccumulator` sums unnormalized per-row
terms and divides once by the global count, so any grouping of the rows gives the same update.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

BUDGET_FIELD = "spec.trainer.policy.maxTokensPerMicroBatch"


def balanced_shards(lengths: Sequence[int], parts: int) -> list[list[int]]:
    """Row indices for each of `parts` ranks with token totals as even as the longest-first rule
    makes them (each row to the rank with the fewest tokens so far; within 4/3 of the best split).
    Each rank's indices are ascending, so a rank still sees its rows in arrival order."""
    heap = [(0, rank) for rank in range(parts)]
    shards: list[list[int]] = [[] for _ in range(parts)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        tokens, rank = heapq.heappop(heap)
        shards[rank].append(i)
        heapq.heappush(heap, (tokens + lengths[i], rank))
    return [sorted(s) for s in shards]


def token_budget_batches(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Row indices per micro-batch, each batch's total at most `budget` tokens (first fit, longest
    rows first: few batches, few wasted tokens). A row longer than the budget cannot be packed;
    admission refuses a budget below the longest possible row, so this names that field."""
    too_long = [n for n in lengths if n > budget]
    if too_long:
        raise ValueError(
            f"{BUDGET_FIELD} = {budget} is below a row of {max(too_long)} tokens (prompt + response); "
            "raise it to at least data.maxPromptLength + generation.maxNewTokens"
        )
    batches: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        slot = next((b for b, free in enumerate(room) if lengths[i] <= free), None)
        if slot is None:
            batches.append([])
            room.append(budget)
            slot = len(batches) - 1
        batches[slot].append(i)
        room[slot] -= lengths[i]
    return batches


def micro_batches(
    lengths: Sequence[int], *, rows_per_batch: int, token_budget: int | None
) -> list[list[int]]:
    """Row indices per micro-batch: consecutive runs of `rows_per_batch` rows, or with a token
    budget `token_budget_batches`."""
    if token_budget is not None:
        return token_budget_batches(lengths, token_budget)
    return [
        list(range(i, min(i + rows_per_batch, len(lengths)))) for i in range(0, len(lengths), rows_per_batch)
    ]
