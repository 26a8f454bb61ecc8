"""Training sequences of the tiny retrieval model (``scripts/train_tiny.py``): the ``task=tiny_niah`` needle /
question layouts with the answer tokens supervised (:func:`training_example`), mixed with dense associative-recall
sequences (:func:`compact_example`)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvbench.models.tiny import KEY_WORDS, VALUE_WORDS
from kvbench.tasks.tiny_niah import (
    HEADER_PLURAL,
    HEADER_SINGULAR,
    MULTI_FOCUS_SHARE,
    NUM_MULTI_VALUES,
    ORDINALS,
    QUESTION_PLURAL,
    QUESTION_SINGULAR,
    VALUE_TOKENS,
    filler_sentence,
    multivalue_answer,
    needle_words,
)


@dataclass
class TrainingExample:
    """One training sequence: token ids plus supervised positions.

    The logits at ``positions[i]`` are trained to predict the next token, ``input_ids[positions[i] + 1]`` (every
    supervised token is an answer token the model must generate, so the target is the teacher-forced token).
    """

    input_ids: list[int]
    positions: list[int]

    def targets(self) -> list[int]:
        """The token id each supervised position must predict: ``input_ids[position + 1]``."""
        return [self.input_ids[position + 1] for position in self.positions]


class _ValuePool:
    """Values for one training sequence: :data:`VALUE_TOKENS` number tokens each, no number token repeated."""

    def __init__(self, rng: random.Random) -> None:
        self._tokens = rng.sample(VALUE_WORDS, len(VALUE_WORDS))

    def __bool__(self) -> bool:
        return len(self._tokens) >= VALUE_TOKENS

    def draw(self) -> str:
        """The next unused value (raises ``IndexError`` when the pool is empty)."""
        if not self:
            raise IndexError("no unused number tokens left in this sequence")
        value, self._tokens = self._tokens[:VALUE_TOKENS], self._tokens[VALUE_TOKENS:]
        return " ".join(value)


def compact_example(rng: random.Random, length: int, token_id: Callable[[str], int]) -> TrainingExample:
    """A dense associative-recall sequence ``is <key> <value> .`` repeated, keys recurring (warm-up data).

    Every recurrence of a key supervises its value tokens, so a short sequence holds many retrieval targets at
    varied distances; the ``is <key> <value>`` core is the same as in the needles and answer prefixes of the tasks.
    """
    words: list[str] = []
    supervised: list[int] = []
    values: dict[str, str] = {}
    pool = _ValuePool(rng)
    free_keys = rng.sample(KEY_WORDS, len(KEY_WORDS))
    while len(words) < length:
        if values and (rng.random() < 0.5 or not pool):
            key = rng.choice(list(values))
            words.extend(["is", key])
            _extend_supervised(words, supervised, values[key].split())
            words.append(".")
        else:
            key = free_keys.pop()
            values[key] = pool.draw()
            words.extend(["is", key, *values[key].split(), "."])
    return _finish(words, supervised, length, token_id)


def _extend_supervised(words: list[str], supervised: list[int], tokens: Sequence[str]) -> None:
    """Append answer ``tokens`` to ``words``, recording in ``supervised`` the position that predicts each one."""
    for token in tokens:
        supervised.append(len(words) - 1)
        words.append(token)


def _finish(words: list[str], supervised: list[int], length: int, token_id: Callable[[str], int]) -> TrainingExample:
    """Cut ``words`` to ``length`` and keep the supervised positions whose next token is inside."""
    positions = [position for position in supervised if position < length - 1]
    return TrainingExample([token_id(w) for w in words[:length]], positions)


def training_example(
    rng: random.Random,
    length: int,
    token_id: Callable[[str], int],
    compact: float = 0.0,
    multi_focus: float = MULTI_FOCUS_SHARE,
) -> TrainingExample:
    """A random training sequence of exactly ``length`` tokens in the prompt format of the eval tasks.

    With probability ``compact`` it is a :func:`compact_example` instead.  Otherwise the haystack mixes filler
    sentences and needles at a random density, holds 0-2 multi-value keys (four needles each, labelled ``first``
    ... ``fourth`` in order, spread over the sequence; 1-2 keys, asked most of the time, in a ``multi_focus``
    share of the sequences), and has questions (with their answers, which are supervised) both interleaved in the
    haystack, about earlier needles at any distance, and at the end.  Every generated answer token is supervised,
    as the model must produce it: the value tokens, the ``.`` after a single value, and the ``, <key> <ordinal>``
    between multi-value values (the position after the last multi-value value is not supervised).
    """
    if compact and rng.random() < compact:
        return compact_example(rng, length, token_id)
    words: list[str] = (HEADER_PLURAL if rng.random() < 0.5 else HEADER_SINGULAR).split()
    supervised: list[int] = []  # positions in words whose next word is a supervised answer token
    # a multi_focus share of the sequences drill multi-value answers: more multi-value keys, asked most of the time
    focus = rng.random() < multi_focus
    density = rng.choice((0.02, 0.05, 0.15, 0.4, 1.0))
    query_rate = rng.choice((0.0, 0.05, 0.15))
    num_final = max(1, length // 512) + rng.randint(0, 2)
    body_end = max(len(words) + 20, length - 30 * num_final - 8)
    free_keys = rng.sample(KEY_WORDS, len(KEY_WORDS))
    pool = _ValuePool(rng)
    answers: dict[str, list[str]] = {}  # complete keys -> values
    pending: list[tuple[int, str, str]] = []  # (word offset, key, value) of multi-value needles not placed yet
    partial: dict[str, list[str]] = {}
    for _ in range(rng.choice((1, 2) if focus else (0, 1, 1, 2))):
        key = free_keys.pop()
        partial[key] = []
        for _ in range(NUM_MULTI_VALUES):
            pending.append((rng.randint(len(words), body_end), key, pool.draw()))
    pending.sort()

    def pick_key() -> str:
        multi = [key for key, values in answers.items() if len(values) > 1]
        if multi and rng.random() < (0.8 if focus else 0.3):
            return rng.choice(multi)
        return rng.choice(list(answers))

    def ask(key: str) -> None:
        values = answers[key]
        if len(values) == 1:
            words.extend(QUESTION_SINGULAR.format(key=key).split())
            answer, unsupervised_end = [*values[0].split(), "."], []
        else:  # the last value's full stop is not supervised: generation stops after MAX_NEW_TOKENS
            words.extend(QUESTION_PLURAL.format(key=key, ordinal=ORDINALS[0]).split())
            answer, unsupervised_end = multivalue_answer(key, values), ["."]
        _extend_supervised(words, supervised, answer)
        words.extend(unsupervised_end)

    while len(words) < body_end:
        if pending and pending[0][0] <= len(words):
            _, key, value = pending.pop(0)
            words.extend(needle_words(key, value, ORDINALS[len(partial[key])]))
            partial[key].append(value)
            if len(partial[key]) == NUM_MULTI_VALUES:
                answers[key] = partial.pop(key)
        elif answers and rng.random() < query_rate:
            ask(pick_key())
        elif rng.random() < density and free_keys and pool:
            key, value = free_keys.pop(), pool.draw()
            words.extend(needle_words(key, value))
            answers[key] = [value]
        else:
            words.extend(filler_sentence(rng))
    if not answers:  # sparse and short: make sure there is something to ask about
        key, value = free_keys.pop(), pool.draw()
        words.extend(needle_words(key, value))
        answers[key] = [value]
    while len(words) < length:
        ask(pick_key())
    return _finish(words, supervised, length, token_id)
