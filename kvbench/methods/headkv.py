"""HeadKV (Fu et al., arXiv 2410.19258, "Not All Heads Matter"): per-head budgets from retrieval-reasoning scores.

Reproduces FYYFU/HeadKV ``headkv/snapkv_utils.py`` (``ReasonSnapKVCluster``, run as ``run_longbench.py``'s
``ReasonKV`` method: window 8, max pooling 7, ``head_choice=reason``, ``temp`` 1, ``beta`` 1.5 by default):

* Head scores: the released format, one JSON line ``{"<layer>-<head>": [scores per probe sample]}``
  (``Important_Head/head_score/<model>_retrieval_reasoning_heads.json``); each head's score is the mean of its list,
  taken **in the file's key order** and reshaped to ``[layers, query heads]`` (layer-major in the released files).
  ``params.head_scores`` is that file, downloaded on the user's machine (absolute, relative to the working
  directory, or to kvbench's shipped files); the default is the file shipped for the embedded tiny model
  (``models/head_patterns/tiny-niah/headkv_retrieval_reasoning_heads.json``, estimated by
  ``scripts/estimate_headkv_scores.py``, whose docstring says how it relates to the paper's detection).
* Head budgets (float64, as the reference's ``torch.tensor`` of numpy means): ``a = s / sum(s)``, ``a = a^temp /
  sum(a^temp)``; ``base = budget - window``; ``pool = (base // beta) L H``; ``c_{l,h} = round(a_{l,h} pool + base -
  base // beta)`` (half to even).  Every head keeps its top ``c_{l,h}`` candidates plus the window; the layer's mean
  is about the budget (the rounding moves it by a few tokens; ``achieved_per_head`` records it).  Nothing is evicted
  when ``base > S - window``.
* Scores: SnapKV-style window votes (:class:`~kvbench.methods.snapkv.WindowVoteScorer`, mean over the window rows of
  the float32 softmax cast to the model dtype, max pooling 7, candidates ``[0, S - W)``), per query head: the
  reference repeats the KV heads before compressing (``params.gqa_granularity: query_head``).  Candidates are ranked
  by ``torch.sort(descending=True)`` as the reference (not stable: max pooling makes plateaus of exactly tied votes,
  and the reference keeps the tied tokens that sort's comparisons order first; the same call reproduces that order
  on CPU, CUDA may order ties otherwise).

Parity: ``tests/methods/test_headkv.py`` (recordings ``tests/fixtures/reference/heads/HeadKV.json``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from kvbench.eviction.base import EvictionMethod, TokenScorer, WindowObservation, common_knobs
from kvbench.eviction.family import FamilyMethod
from kvbench.eviction.kept_sets import HeadFileMismatch, KeepScoredTokens, files_digest, keep_only, resolve_data_path
from kvbench.eviction.params import bounded
from kvbench.eviction.token_scores import PoolingKnobs, ScoreDtypeKnob, ScoreOptions
from kvbench.methods.snapkv import WindowVoteScorer

ESTIMATE_HINT = (
    "give method.params.head_scores=<FYYFU/HeadKV's Important_Head/head_score/<model>_retrieval_reasoning_heads.json, "
    "downloaded on your machine>, or estimate one with "
    "`python scripts/estimate_headkv_scores.py --model <model> --probes <probes.jsonl> --out <file>`"
)


def load_head_scores(path: str) -> tuple[torch.Tensor, str]:
    """``[N]`` float64 mean score per head in the file's key order, and the file's digest (16 hex)."""
    file = resolve_data_path(path, "method.params.head_scores", ESTIMATE_HINT)
    try:
        with open(file) as handle:
            table = json.loads(handle.readline())
        means = [sum(map(float, values)) / len(values) for values in table.values()]
    except (ValueError, TypeError, ZeroDivisionError, AttributeError) as err:
        raise ValueError(
            f"method.params.head_scores {path!r}: unreadable head scores ({err}); {ESTIMATE_HINT}"
        ) from None
    return torch.tensor(means, dtype=torch.float64), files_digest(file)


def head_shares(scores: torch.Tensor, temp: float) -> torch.Tensor:
    """``[N]`` float64 shares: normalised, raised to ``temp``, normalised again (the reference's order)."""
    shares = scores / scores.sum()
    shares = torch.pow(shares, temp)
    return shares / shares.sum()


def head_capacities(shares: torch.Tensor, base: int, beta: float, layers: int, heads: int) -> torch.Tensor:
    """``[layers, heads]`` int candidate counts ``round(a pool + base - base // beta)`` (module docstring)."""
    pool = (base // beta) * layers * heads
    floor = base - base // beta
    return torch.round(shares.reshape(layers, heads) * pool + floor).int()


class HeadKVScorer(TokenScorer):
    """Window votes, then each head's top ``c_{l,h}`` candidates plus the window (kept sets as scores)."""

    def __init__(self, votes: WindowVoteScorer, shares: torch.Tensor, beta: float, source: str) -> None:
        self.votes = votes
        self.shares = shares
        self.beta = beta
        self.source = source

    def score(self, observation: WindowObservation) -> torch.Tensor:
        """``[H_q, S]``: the votes of the kept candidates, 0 on the window, ``-inf`` on the dropped tokens."""
        layers, heads, length = observation.num_layers, observation.num_heads, observation.context_length
        if layers * heads != self.shares.numel():
            raise HeadFileMismatch(
                f"HeadKV head scores {self.source} hold {self.shares.numel()} heads; the model has {layers} "
                f"compressible layers x {heads} stored heads ({layers * heads}). {ESTIMATE_HINT}"
            )
        window = observation.window
        votes = self.votes.score(observation)  # [H, S], window columns 0
        budget = length if observation.layer_budget is None else int(observation.layer_budget)
        base = budget - window
        candidates = length - window
        if base > candidates:
            return votes
        capacity = head_capacities(self.shares, base, self.beta, layers, heads)[observation.layer_idx]
        # The reference's (unstable) sort: on CPU its tie order follows from the comparisons alone, so the same call on
        # scores that compare alike gives its order; on CUDA the tie order may differ (only among exactly tied votes).
        order = torch.sort(votes[:, :candidates], dim=-1, descending=True).indices
        rank = torch.empty_like(order)
        rank.scatter_(1, order, torch.arange(candidates, device=order.device).expand(heads, candidates))
        keep = torch.ones(heads, length, dtype=torch.bool, device=votes.device)
        keep[:, :candidates] = rank < capacity.to(votes.device)[:, None]
        return keep_only(votes, keep)


@dataclass(frozen=True)
class HeadKV(PoolingKnobs, ScoreDtypeKnob, FamilyMethod, family="headkv"):
    """HeadKV's knobs (module docstring)."""

    #: Its scores and budgets are per query head (gqa_granularity=query_head).
    unused_knobs: ClassVar[frozenset[str]] = frozenset({"gqa_agg"})

    #: Head-score file in the released format (one JSON line ``{"<layer>-<head>": [scores]}``).
    head_scores: str = "models/head_patterns/tiny-niah/headkv_retrieval_reasoning_heads.json"
    #: Share of the budget that is pooled and redistributed by score: ``base // beta`` per head.
    beta: float = bounded(1.5, 1.0, low_open=True)
    #: Sharpening of the shares (``a^temp``).
    temp: float = bounded(1.0, 0.0, low_open=True)

    def build(self, method_cfg: Any) -> EvictionMethod:
        """SnapKV-style votes with per-head budgets from the head scores (module docstring)."""
        if str(self.gqa_granularity) != "query_head":
            raise ValueError(
                f"method.params.gqa_granularity={self.gqa_granularity!r}: HeadKV's scores and budgets are per query "
                "head (the reference repeats the KV heads); valid: query_head"
            )
        scores, digest = load_head_scores(self.head_scores)
        options = ScoreOptions(
            kernel_size=self.kernel_size,
            pooling=self.pooling,
            gqa_agg=str(self.gqa_agg),
            gqa_reduce="before_pool",
            pool_padding=self.pool_padding,
            score_dtype=self.score_dtype,
        )
        scorer = HeadKVScorer(
            WindowVoteScorer(options, row_reduce="mean"), head_shares(scores, self.temp), self.beta, self.head_scores
        )
        return EvictionMethod(
            scorer=scorer,
            head_allocator=KeepScoredTokens(),
            settings={
                "head_scores": self.head_scores,
                "head_scores_sha256": digest,
                "beta": self.beta,
                "temp": self.temp,
            },
            ignored_knobs=frozenset({"gqa_agg"}),
            **{**common_knobs(method_cfg, self), "keep_window": False},
        )
