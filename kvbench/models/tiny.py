"""The tiny retrieval model's vocabulary, tokenizer and architecture (shared by training, tasks and tests).

The tiny model (``models/tiny-niah``) is a small Llama-architecture model trained by ``scripts/train_tiny.py`` on
the synthetic needle-in-a-haystack data of :mod:`kvbench.tasks.tiny_niah`.  Its tokenizer is word-level: every
whitespace-separated word (and every punctuation mark) is one token, so a 4K-token prompt is 4K words and sizing
samples is exact.  The vocabulary is small and fully deterministic:

* special tokens ``<pad> <unk> <s> </s>``;
* the template words of the task prompts (with the ordinals ``first`` ... ``fourth`` of multi-value needles) and
  the filler words of the haystack;
* :data:`NUM_KEYS` synthetic key words (``"bakodi"``-like, three syllables);
* the :data:`NUM_VALUES` number tokens ``10`` ... ``99``; a needle value is two of them (``"57 83"``).

Keys and values are few on purpose: every key and value token recurs often in training, which is what lets
retrieval emerge within a CPU budget.
"""

from __future__ import annotations

import itertools
from typing import Any

from kvbench import resources

#: Special tokens: padding, unknown, begin/end of sequence.
PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<s>", "</s>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, UNK, BOS, EOS)

#: Punctuation tokens (written space-separated in prompts).
PUNCTUATION: tuple[str, ...] = (".", ",", "?", ":")


def _words(text: str) -> tuple[str, ...]:
    """The whitespace-separated words of ``text``."""
    return tuple(text.split())


#: Words of the prompt templates (header, needle, question, answer prefix).
TEMPLATE_WORDS: tuple[str, ...] = _words(
    """a some special magic number numbers is are hidden within the following text make sure to memorize it them
    i will quiz you about afterwards one of for what all mentioned in provided first second third fourth"""
)

#: Filler words of the haystack: plain English, no digits, disjoint from the key words.
FILLER_WORDS: tuple[str, ...] = _words(
    """grass sky sun moon river tree stone cloud wind rain snow field road house door window garden bird dog cat
    horse boat ship town city hill valley forest lake sea shore bridge tower market book letter song story voice
    light shadow morning evening night day year winter summer spring autumn friend child teacher farmer king queen
    green blue yellow red white black old young small large quiet loud warm cold bright dark slow fast happy calm
    long short deep high soft hard new early late gentle walks runs sings reads writes waits sleeps grows falls
    rises flows shines stands sits looks finds keeps brings carries opens closes turns leaves comes goes returns
    and but then so while when where here there again always never often slowly quietly together alone away
    back around over under near far before after across along through into upon with without from by at on
    this that these those every each many few most other same another such only also still even just very"""
)

#: Number of synthetic key words and of needle values.
NUM_KEYS = 200
NUM_VALUES = 90
#: Needle values: the two-digit numbers as strings.
VALUE_WORDS: tuple[str, ...] = tuple(str(v) for v in range(10, 10 + NUM_VALUES))

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


def _make_key_words(count: int) -> tuple[str, ...]:
    """Deterministic pronounceable key words (consonant-vowel syllables), disjoint from every other word."""
    syllables = [c + v for c in _CONSONANTS for v in _VOWELS]
    taken = set(TEMPLATE_WORDS) | set(FILLER_WORDS)
    words: list[str] = []
    # Interleave 3-syllable words (many) in a fixed, well-mixed order: stride through the product.
    product = [a + b + c for a, b, c in itertools.product(syllables, repeat=3)]
    stride = 7919  # prime, coprime with len(product) = 70**3
    index = 0
    while len(words) < count:
        word = product[index % len(product)]
        index += stride
        if word not in taken:
            taken.add(word)
            words.append(word)
    return tuple(words)


#: The key words (needle keys), in a fixed order.
KEY_WORDS: tuple[str, ...] = _make_key_words(NUM_KEYS)


def vocabulary() -> list[str]:
    """The full word list in id order (special tokens first)."""
    words = [*SPECIAL_TOKENS, *PUNCTUATION, *TEMPLATE_WORDS, *FILLER_WORDS, *KEY_WORDS, *VALUE_WORDS]
    if len(set(words)) != len(words):
        duplicates = sorted({w for w in words if words.count(w) > 1})
        raise AssertionError(f"tiny vocabulary has duplicate words: {duplicates}")
    return words


def build_tokenizer() -> Any:
    """A word-level ``PreTrainedTokenizerFast`` over :func:`vocabulary` (no BOS/EOS added on encode).

    Pre-tokenisation splits on whitespace and punctuation (``"is:"`` -> ``"is" ":"``); decoding joins tokens with
    single spaces, so ``decode(encode(text)) == " ".join(text.split())`` for in-vocabulary space-separated text.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {word: index for index, word in enumerate(vocabulary())}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        model_max_length=8192,
        clean_up_tokenization_spaces=False,
    )


def build_config(
    vocab_size: int,
    hidden_size: int = 192,
    num_layers: int = 3,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 512,
    rope_theta: float = 100_000.0,
    max_position_embeddings: int = 8192,
    initializer_range: float = 0.02,
) -> Any:
    """The tiny model's ``LlamaConfig`` (GQA: ``num_kv_heads < num_heads``; tied input/output embeddings)."""
    from transformers import LlamaConfig

    if num_kv_heads >= num_heads or num_heads % num_kv_heads:
        raise ValueError(f"GQA needs num_kv_heads < num_heads and dividing it, got {num_kv_heads}/{num_heads}")
    special = {word: index for index, word in enumerate(SPECIAL_TOKENS)}
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        tie_word_embeddings=True,
        bos_token_id=special[BOS],
        eos_token_id=special[EOS],
        pad_token_id=special[PAD],
        initializer_range=initializer_range,
        torch_dtype="float32",
    )


#: Where the trained tiny model lives (``models/tiny-niah``, shipped: :mod:`kvbench.resources`).
DEFAULT_MODEL_DIR = resources.models_dir() / "tiny-niah"
