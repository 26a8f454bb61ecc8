"""NACL (Chen et al., ACL 2024): proxy-token eviction plus random eviction, once, at the end of the prefill.

Reproduces PaddlePaddle/Research ``NLP/ACL2024-NACL/src/llama_nacl_patch.py`` (``kvcache_eviction``, which the
patched ``LlamaAttention.forward`` calls after the prefill's attention at every layer) with the defaults of
``src/args.py``:

* **Proxy tokens**: the last ``P = int(proxy_tokens_ratio x S)`` prompt queries (1 %; kvbench takes at least one).
  A token's proxy score is the sum over them of the float32 softmax attention it receives, **not causal**: the code
  calls FlashAttention with ``causal=False`` and reduces its rows with ``calc_reduced_attention_scores`` (the
  paper's ``F_score = sum_{x_p in P} Softmax(A(x_p, *))``).  ``params.proxy_attention: causal`` masks each proxy
  row's future (kvbench's variant).
* **Protected**: the first ``sink_tokens`` (256) and the ``protect - sinks`` most recent tokens.
* **Proxy-tokens eviction**: each head keeps the top ``C_p`` candidates (the tokens in between) by proxy score.
* **Random eviction**: each head then draws ``C_r`` more of the remaining candidates, without replacement, with
  probabilities ``softmax`` of their proxy scores (``scipy.special.softmax`` + ``np.random.choice(replace=False,
  p=...)``, i.e. successive sampling); every head and layer draws on its own.  ``params.random_distribution:
  uniform`` is the paper's "- Probability Sampling" ablation (Table 3).
* Nothing is evicted while decoding (the paper's Algorithm 1 evicts every ``m`` generation steps, with ``m`` and
  the generation-time proxy rows left open; the code never does).  A prompt of at most ``min_eviction_seqlen``
  (2048) tokens is not compressed (the code's trigger; with ``<n>/layer`` budgets, which bypass layer allocators,
  every prompt longer than the budget is compressed).

**Budget split.**  The code's budgets are ratios of the prompt length ``S``: protect 1 % (the sinks included),
proxy keep 12 %, random keep 7 %: 20 % in all.  kvbench gives a layer ``B`` tokens per head and splits them in the
same proportions: ``protect = floor(B x 1/20)``, ``C_p = floor(B x 12/20)``, ``C_r = B - protect - C_p``, the sinks
``min(sink_tokens, protect)``.  At ``budget=0.2x`` this is the code's split (up to one token of rounding).  Below
``B = 5120`` the code's recent count ``protect - 256`` is negative and its slicing fails; kvbench keeps ``protect``
sinks and no recent token there.  The paper's Appendix Table 4 splits (20 %: protect 2 %, proxy 6 %, random 12 %,
with 20 % of the prompt as proxy rows) are other values of the same ratios.

**GQA.**  ``gqa_granularity: query_head`` (the preset) is the patch's ``repeat_kv`` path (no FlashAttention, or
Paddle <= 2.6): KV repeated per query head, each evicted with its own scores.  With ``kv_head`` (FlashAttention on
Paddle 3, the README's set-up) the code loops over the KV heads and takes the proxy scores of the *query head with
the same index* (``params.kv_head_scores: head_index``); ``group`` reduces each KV group's query heads with
``method.params.gqa_agg`` (kvbench's variant).  Identical for models without GQA (the paper's LLaMA-2).

**Randomness.**  The code draws from NumPy's unseeded global generator.  kvbench gives every layer of every sample
its own ``torch.Generator`` seeded from ``params.seed``, the layer index and a hash of the sample's prompt tokens
(:attr:`~kvbench.eviction.base.WindowObservation.sample_key`), and draws on the CPU: two runs select the same
tokens, whatever order the samples run in.  Averaging over seeds (as the NACL and AhaKV papers do):
``method.params.seed=<k> run.tag=seed<k>``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar

import torch

from kvbench.eviction.base import (
    AllocatorState,
    EvictionMethod,
    PromptRows,
    TokenScorer,
    UniformLayerAllocator,
    WindowObservation,
    common_knobs,
)
from kvbench.eviction.family import FamilyMethod
from kvbench.eviction.params import bounded, choice
from kvbench.eviction.seeding import layer_generator
from kvbench.eviction.token_scores import aggregate_groups

PROXY_ATTENTIONS = ("full", "causal")
RANDOM_DISTRIBUTIONS = ("softmax", "uniform")
KV_HEAD_SCORES = ("head_index", "group")

#: Score tiers the scorer hands to the session (exactly ``B`` tokens per head rank above 0).
_PROTECTED, _PROXY, _RANDOM = 3.0, 2.0, 1.0


# ---------------------------------------------------------------------------------------------------- budget
def proxy_row_count(context_length: int, ratio: float) -> int:
    """Proxy queries: the code's ``int(proxy_tokens_ratio * q_len)``, at least one and at most ``S``."""
    return min(context_length, max(1, int(ratio * context_length)))


@dataclass(frozen=True)
class BudgetSplit:
    """One head's kept tokens, as NACL's code splits them (module docstring)."""

    sinks: int
    recent: int
    proxy: int
    random: int

    @property
    def total(self) -> int:
        return self.sinks + self.recent + self.proxy + self.random


def split_budget(
    budget: int, protect_ratio: float, proxy_ratio: float, random_ratio: float, sink_tokens: int
) -> BudgetSplit:
    """Split ``budget`` tokens in the proportions of the code's ratios (exact decimal arithmetic).

    ``protect = floor(B r_protect / r)``, ``proxy = floor(B r_proxy / r)``, ``random = B - protect - proxy`` with
    ``r`` the sum of the three ratios; the protected tokens are ``min(sink_tokens, protect)`` sinks and the rest
    recent.
    """
    protect_share, proxy_share, random_share = (Fraction(str(r)) for r in (protect_ratio, proxy_ratio, random_ratio))
    whole = protect_share + proxy_share + random_share
    protect = math.floor(budget * protect_share / whole)
    proxy = math.floor(budget * proxy_share / whole)
    sinks = min(sink_tokens, protect)
    return BudgetSplit(sinks=sinks, recent=protect - sinks, proxy=proxy, random=budget - protect - proxy)


# ---------------------------------------------------------------------------------------------------- scores
def proxy_scores(
    queries: torch.Tensor, keys: torch.Tensor, scaling: float, causal: bool = False, max_block_bytes: int = 64 << 20
) -> torch.Tensor:
    """Attention each key receives from the proxy rows: column sums of their float32 softmax over all keys.

    Parameters
    ----------
    queries:
        ``[H_q, P, D]`` post-RoPE queries of the last ``P`` prompt tokens (row ``i`` sits at ``S - P + i``).
    keys:
        ``[H, S, D]``; ``H`` divides ``H_q`` (consecutive query heads share a key head).
    scaling:
        Logit scale.
    causal:
        Mask each row's future keys; ``False`` = the code's non-causal reduction (every row sees all ``S`` keys).
    max_block_bytes:
        Rows are processed per KV head in blocks whose ``groups x rows x S`` float32 logits fit this size (extra
        memory: one head's float32 keys and a few such blocks).

    Returns
    -------
    ``[H_q, S]`` float32 sums.
    """
    num_q, rows, dim = queries.shape
    num_heads, length, key_dim = keys.shape
    if key_dim != dim or num_q % num_heads or rows > length:
        raise ValueError(f"proxy queries {tuple(queries.shape)} do not match keys {tuple(keys.shape)}")
    groups = num_q // num_heads
    sums = torch.zeros((num_q, length), dtype=torch.float32, device=keys.device)
    block = max(1, max_block_bytes // max(1, groups * length * 4))
    positions = torch.arange(length, device=keys.device)
    for head in range(num_heads):  # one KV head at a time: a float32 copy of one head's keys, not of all
        keys_t = keys[head].float().t()  # [D, S]
        heads = slice(head * groups, (head + 1) * groups)
        for start in range(0, rows, block):
            stop = min(start + block, rows)
            grouped = queries[heads, start:stop].float().reshape(groups * (stop - start), dim)
            logits = (grouped @ keys_t).reshape(groups, stop - start, length).mul_(scaling)
            if causal:
                row_positions = torch.arange(length - rows + start, length - rows + stop, device=keys.device)
                logits.masked_fill_(positions[None, :] > row_positions[:, None], float("-inf"))
            sums[heads] += torch.softmax(logits, dim=-1).sum(dim=1)
    return sums


# ---------------------------------------------------------------------------------------------------- selection
@dataclass(frozen=True)
class Selection:
    """What every head of a layer keeps: positions ``[k]`` (protected, shared) and ``[H, k]`` (per head)."""

    protected: torch.Tensor
    proxy: torch.Tensor
    random: torch.Tensor

    def kept(self, head: int) -> torch.Tensor:
        """Sorted positions ``head`` keeps."""
        return torch.sort(torch.cat([self.protected, self.proxy[head], self.random[head]])).values


def sample_without_replacement(logits: torch.Tensor, count: int, generator: torch.Generator) -> torch.Tensor:
    """Per row, ``count`` indices drawn without replacement from ``softmax(logits)`` (successive sampling).

    Gumbel-top-k: the ``count`` largest ``logits + Gumbel noise`` are distributed as successive draws from the
    renormalised softmax (the distribution of ``np.random.choice(n, count, replace=False, p=softmax(logits))``),
    without exponentiating (no underflow).  ``-inf`` logits are never drawn while a finite one is left.  The noise
    comes from ``generator`` on the CPU, so every device draws the same numbers.

    Parameters
    ----------
    logits:
        ``[R, n]`` (any device, any float dtype).
    count:
        Draws per row, ``<= n``.

    Returns
    -------
    ``[R, count]`` indices into the last dimension.
    """
    uniform = torch.rand(logits.shape, generator=generator, dtype=torch.float64)
    gumbel = -torch.log(-torch.log(uniform))
    keys = logits.double() + gumbel.to(logits.device)
    return torch.topk(keys, count, dim=-1).indices


def top_recent_first(scores: torch.Tensor, count: int) -> torch.Tensor:
    """Per row, the indices of the ``count`` largest of ``scores`` ``[R, n]``, ties going to larger indices."""
    width = scores.shape[-1]
    order = torch.argsort(scores.flip(-1), dim=-1, descending=True, stable=True)[:, :count]
    return width - 1 - order


def select_tokens(scores: torch.Tensor, split: BudgetSplit, distribution: str, generator: torch.Generator) -> Selection:
    """NACL's selection for every head of a layer (module docstring).

    Parameters
    ----------
    scores:
        ``[H, S]`` float32 proxy scores per stored head, ``S > split.total``.
    split:
        The per-head budget split.
    distribution:
        ``softmax`` (the code: softmax of the remaining candidates' scores) or ``uniform``.

    Returns
    -------
    The protected positions and, per head, the proxy-kept and the randomly kept positions.
    """
    length = scores.shape[1]
    if split.total >= length:
        raise ValueError(f"a split of {split.total} tokens leaves nothing to evict from {length}")
    device = scores.device
    first, stop = split.sinks, length - split.recent
    protected = torch.cat([torch.arange(first, device=device), torch.arange(stop, length, device=device)])
    candidates = scores[:, first:stop].float()  # [H, C]
    proxy = top_recent_first(candidates, split.proxy)  # [H, C_p], indices into the candidates
    logits = candidates if distribution == "softmax" else torch.zeros_like(candidates)
    logits = logits.scatter(1, proxy, float("-inf"))  # the proxy-kept ones are no longer candidates
    random = sample_without_replacement(logits, split.random, generator)
    return Selection(protected, proxy + first, random + first)


# ---------------------------------------------------------------------------------------------------- pieces
@dataclass(frozen=True)
class NACL(FamilyMethod, family="nacl"):
    """NACL's hyper-parameters (defaults: the code's ``src/args.py``) and kvbench's switches (module docstring).

    NACL has no observation window (``window``, ``window_in_budget`` are not its knobs); its ``sink_tokens`` is its
    own (part of its protected share, 256), not the session's protection."""

    unused_knobs: ClassVar[frozenset[str]] = frozenset({"window", "window_in_budget"})

    #: Proxy queries as a fraction of the prompt: the last ``int(ratio x S)`` (at least one).
    proxy_tokens_ratio: float = bounded(0.01, 0.0, 1.0, low_open=True)
    #: The split of the kept tokens, as the code's ratios of the prompt (kvbench applies their proportions to B).
    proxy_token_keep_ratio: float = bounded(0.12, low=0.0)
    random_token_keep_ratio: float = bounded(0.07, low=0.0)
    token_protect_ratio: float = bounded(0.01, low=0.0)
    #: Sink tokens, part of the protected share.
    sink_tokens: int = bounded(256, low=0)
    #: Prompts of at most this many tokens are not compressed (the code's ``min_eviction_seqlen``; 0 = any prompt).
    min_eviction_seqlen: int = bounded(2048, low=0)
    #: ``full``: every proxy row sees all keys (the code) | ``causal``.
    proxy_attention: str = choice("full", PROXY_ATTENTIONS)
    #: ``softmax`` of the remaining candidates' proxy scores (the code) | ``uniform`` (the paper's ablation).
    random_distribution: str = choice("softmax", RANDOM_DISTRIBUTIONS)
    #: With ``gqa_granularity: kv_head``: ``head_index`` (KV head h takes query head h's scores, the code's
    #: FlashAttention path) | ``group`` (the group's query heads reduced with ``method.params.gqa_agg``).
    kv_head_scores: str = choice("head_index", KV_HEAD_SCORES)
    #: Seed of the random eviction (combined with the layer and the sample's prompt hash).
    seed: int = 0

    def __post_init__(self) -> None:
        """The one constraint across fields (each field's own range is checked by ``parse_params``)."""
        ratios = {
            "token_protect_ratio": self.token_protect_ratio,
            "proxy_token_keep_ratio": self.proxy_token_keep_ratio,
            "random_token_keep_ratio": self.random_token_keep_ratio,
        }
        if sum(ratios.values()) <= 0:
            raise ValueError(f"method.params ratios {ratios} must not all be 0")

    def split(self, budget: int) -> BudgetSplit:
        """This configuration's split of ``budget`` tokens per head."""
        return split_budget(
            budget,
            self.token_protect_ratio,
            self.proxy_token_keep_ratio,
            self.random_token_keep_ratio,
            self.sink_tokens,
        )

    def build(self, method_cfg: Any) -> EvictionMethod:
        """NACL: proxy-token + random eviction once per layer at the end of the prefill (module docstring)."""
        if self.decode_eviction:
            raise ValueError(
                "method.params.decode_eviction=true: NACL's code evicts once, at the prefill; set it to false"
            )
        knobs = {**common_knobs(method_cfg, self), "sink_tokens": 0}  # its sinks are its own tier, not the session's
        groups_reduced = self.gqa_granularity == "kv_head" and self.kv_head_scores == "group"
        return EvictionMethod(
            scorer=NACLScorer(self, knobs["gqa_agg"]),
            layer_allocator=TriggeredUniformAllocator(self.min_eviction_seqlen),
            settings=dataclasses.asdict(self),
            # No observation window (the code's tiers decide every kept token).
            ignored_knobs=frozenset({"window", "window_in_budget", "sink_tokens"})
            | (frozenset() if groups_reduced else frozenset({"gqa_agg"})),
            **{**knobs, "keep_window": False},  # the scorer's tiers decide every kept token
        )


class NACLScorer(TokenScorer):
    """Proxy scores, then NACL's selection encoded as score tiers the session's top-``B`` reproduces exactly.

    Returns ``[H, S]``: 3 for the protected tokens, 2 for the proxy-kept, 1 for the randomly kept, 0 for the evicted
    (all 0 when the layer evicts nothing).
    """

    def __init__(self, params: NACL, gqa_agg: str = "mean") -> None:
        self.params = params
        self.gqa_agg = gqa_agg

    def prompt_rows(self, model_dtype: torch.dtype) -> PromptRows:
        """The proxy rows: the session keeps only the last ``int(ratio S)`` prompt queries (across the chunks of a
        chunked prefill)."""
        ratio = self.params.proxy_tokens_ratio
        return PromptRows(queries=True, query_rows=lambda length: proxy_row_count(length, ratio))

    def stored_head_scores(self, sums: torch.Tensor, num_heads: int) -> torch.Tensor:
        """``[H_q, S]`` proxy sums -> ``[H, S]`` per stored head (``params.kv_head_scores``)."""
        if sums.shape[0] == num_heads:
            return sums
        if self.params.kv_head_scores == "head_index":
            return sums[:num_heads]
        return aggregate_groups(sums, num_heads, self.gqa_agg)

    def score(self, observation: WindowObservation) -> torch.Tensor:
        budget, context = observation.layer_budget, observation.context_length
        if budget is None:
            raise ValueError("NACL splits the layer's budget: its layer allocator must set it before scoring")
        tiers = torch.zeros((observation.num_heads, context), dtype=torch.float32, device=observation.keys.device)
        if budget >= context:
            return tiers
        queries = observation.prompt_queries
        rows = proxy_row_count(context, self.params.proxy_tokens_ratio)
        if queries is None or queries.shape[1] < rows:
            raise ValueError(f"NACL's proxy rows need the last {rows} prompt queries (TokenScorer.prompt_rows)")
        causal = self.params.proxy_attention == "causal"
        sums = proxy_scores(queries[:, -rows:], observation.keys, observation.scaling, causal)
        scores = self.stored_head_scores(sums, observation.num_heads)
        generator = layer_generator(self.params.seed, observation.sample_key, observation.layer_idx)
        chosen = select_tokens(scores, self.params.split(budget), self.params.random_distribution, generator)
        tiers[:, chosen.protected] = _PROTECTED
        tiers.scatter_(1, chosen.proxy, _PROXY)
        tiers.scatter_(1, chosen.random, _RANDOM)
        return tiers


class TriggeredUniformAllocator(UniformLayerAllocator):
    """Uniform budgets; a prompt of at most ``min_length`` tokens keeps everything (the code's trigger)."""

    def __init__(self, min_length: int) -> None:
        self.min_length = min_length

    def on_layer(self, state: AllocatorState, observation: WindowObservation) -> dict[int, int]:
        if state.context_length <= self.min_length:
            return {observation.layer_idx: state.context_length}
        return super().on_layer(state, observation)
