"""Verification: the main model's rows for a draft (one pass, two sequences for a runner-up) and the
speculative rule that accepts a prefix of it and adds one token of the main model's own."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from speclocal.engine.drafting.base import Proposal
from speclocal.engine.sampling import Dist, Sampling, accept_or_resample, distribution, sample

if TYPE_CHECKING:
    from speclocal.engine.llama import LoadedModel, Rows


def evaluate(main: "LoadedModel", pending: int, draft: Proposal) -> "Rows":
    """The main model's rows for the pending token and the drafted ones, in one pass (with the runner-up as a
    second sequence)."""
    if draft.runner_up:
        return main.eval_branches([pending] + draft.tokens, draft.runner_up.at, draft.runner_up.tokens)
    return main.eval([pending] + draft.tokens, outputs="all")


def accept(main: "LoadedModel", rows: "Rows", draft: Proposal, s: Sampling,
           rng: np.random.Generator) -> tuple[list[int], int, bool]:
    """The new tokens, how many of them were accepted drafts, and whether they followed the runner-up (whose
    cache sequence the main model then keeps)."""
    if not draft.runner_up:
        return *accept_one(rows, draft, s, rng), False
    new, n_acc, on_branch = accept_branches(rows, draft, s, rng)
    main.keep_branch(on_branch)
    return new, n_acc, on_branch


def accept_one(rows: "Rows", draft: Proposal, s: Sampling, rng: np.random.Generator) -> tuple[list[int], int]:
    """Verify drafted tokens against the main model's rows; return the new tokens and how many of them
    were accepted drafts (the last new token always comes from the main model)."""
    drafted = draft.tokens
    if s.greedy:  # row by row: the rows after the first miss are never read
        for i, x in enumerate(drafted):
            tok = int(rows[i].argmax())
            if tok != x:
                return drafted[:i] + [tok], i
        return drafted + [int(rows[len(drafted)].argmax())], len(drafted)
    for i, x in enumerate(drafted):
        q = draft.q[i] if draft.q is not None else Dist.point(x)
        ok, tok = accept_or_resample(distribution(rows[i], s), q, x, rng)
        if not ok:
            return drafted[:i] + [tok], i
    return drafted + [sample(distribution(rows[len(drafted)], s), rng)], len(drafted)


def accept_branches(rows: "Rows", draft: Proposal, s: Sampling,
                     rng: np.random.Generator) -> tuple[list[int], int, bool]:
    """Verify a draft with a second candidate (point masses, rows from `eval_branches`): at each position the
    main model's token (greedy: its argmax; else a sample of its distribution) is kept, and the walk goes on
    down the candidate that drafted that token, if one did. For point-mass drafts this is the speculative
    rule itself (accept x with probability p(x), else resample from p without x) applied to each candidate
    in turn (SpecInfer's multi-candidate rule), so the output follows p exactly. Returns the new tokens, how
    many were accepted drafts, and whether they followed the second candidate."""
    main, at, branch = draft.tokens, draft.runner_up.at, draft.runner_up.tokens
    new, row, on_branch = [], 0, False
    while True:
        tok = int(rows[row].argmax()) if s.greedy else sample(distribution(rows[row], s), rng)
        new.append(tok)
        d = len(new) - 1  # depth of the drafted token this one is checked against
        if not on_branch and d < len(main) and tok == main[d]:
            row = 1 + d
        elif not on_branch and d == at and tok == branch[0]:
            on_branch, row = True, 1 + len(main)
        elif on_branch and d - at < len(branch) and tok == branch[d - at]:
            row = 1 + len(main) + d - at
        else:
            return new, len(new) - 1, on_branch
        # an accepted draft: its row says what follows it

