"""RULER's per-model prompt templates (``scripts/data/template.py``) and the choice of one for a model.

RULER wraps each task text in its own template string, chosen per model in ``scripts/config_models.sh``
(``llama2-7b-chat``: ``meta-chat``; ``llama3.1-8b-chat``: ``meta-llama3``; ...; every other model, API models
included: ``base``, the task text alone).  ``task.options.chat_template=ruler`` (the default) reproduces that: the
template is part of the sample's text and the model's own chat template is not applied; ``model`` renders the
model's published chat template instead (kvpress's RULER data, most chat pipelines).
"""

from __future__ import annotations

import re
from typing import Any

from kvbench.errors import KVBenchError

#: RULER's templates, ``{task_template}`` marking where the task text goes (the answer prefix follows the template).
RULER_TEMPLATES: dict[str, str] = {
    "base": "{task_template}",
    "meta-chat": "[INST] {task_template} [/INST]",
    "vicuna-chat": (
        "A chat between a curious user and an artificial intelligence assistant. The assistant gives helpful, "
        "detailed, and polite answers to the user's questions. USER: {task_template} ASSISTANT:"
    ),
    "lwm-chat": "You are a helpful assistant. USER: {task_template} ASSISTANT: ",
    "command-r-chat": (
        "<BOS_TOKEN><|START_OF_TURN_TOKEN|><|USER_TOKEN|>{task_template}<|END_OF_TURN_TOKEN|>"
        "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
    ),
    "chatglm-chat": "[gMASK]sop<|user|> \n {task_template}<|assistant|> \n ",
    "RWKV": (
        "User: hi\n\nAssistant: Hi. I am your assistant and I will provide expert full response in full details. "
        "Please feel free to ask any question and I will always answer it\n\nUser: {task_template}\n\nAssistant:"
    ),
    "Phi3": "<|user|>\n{task_template}<|end|>\n<|assistant|>\n",
    "meta-llama3": (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n{task_template}<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    ),
    "jamba": "<|startoftext|><|bom|><|system|> <|eom|><|bom|><|user|> {task_template}<|eom|><|bom|><|assistant|>",
    "nemotron5-instruct": "<SPECIAL_10>System\n\n<SPECIAL_11>User\n{task_template}\n<SPECIAL_11>Assistant\n",
}

CHAT_TEMPLATE_MODES = ("ruler", "model")

#: Model path/name patterns (lower-cased) -> RULER template, after ``scripts/config_models.sh``'s model list.
_BY_NAME: tuple[tuple[str, str], ...] = (
    (r"llama-?2.*chat", "meta-chat"),
    (r"llama-?3.*instruct", "meta-llama3"),
    (r"lwm.*chat", "lwm-chat"),
    (r"jamba", "jamba"),
    (r"phi-?3", "Phi3"),
)


def auto_ruler_template(tokenizer: Any, model_chat_template: bool) -> str:
    """RULER's template for a model: ``base`` when the model runs without a chat template; else from the
    tokenizer's ``name_or_path`` (the model preset's ``path``: Llama-2 chat -> ``meta-chat``, Llama-3 instruct ->
    ``meta-llama3``, LWM chat -> ``lwm-chat``), else from the published chat template it carries (the built-in
    real-vocabulary models: a Llama-3 header template -> ``meta-llama3``, Llama-2's ``<<SYS>>`` one ->
    ``meta-chat``); every other model gets ``base``, as RULER runs models it has no template for."""
    if not model_chat_template or tokenizer is None:
        return "base"
    name = str(getattr(tokenizer, "name_or_path", "") or "").lower()
    for pattern, template in _BY_NAME:
        if re.search(pattern, name):
            return template
    published = str(getattr(tokenizer, "chat_template", "") or "")
    if "<|start_header_id|>" in published:
        return "meta-llama3"
    if "<<SYS>>" in published:
        return "meta-chat"
    return "base"


def ruler_template(name: str | None, tokenizer: Any, model_chat_template: bool) -> str:
    """The name of the RULER template to use: ``name`` (``task.options.ruler_template``) when set, else
    :func:`auto_ruler_template`.  An unknown name raises a :class:`KVBenchError` listing the valid ones."""
    if name is None or name == "auto":
        return auto_ruler_template(tokenizer, model_chat_template)
    if name not in RULER_TEMPLATES:
        raise KVBenchError(
            f"task.options.ruler_template={name!r} is not a RULER template; valid: auto, {', '.join(RULER_TEMPLATES)}"
        )
    return name
