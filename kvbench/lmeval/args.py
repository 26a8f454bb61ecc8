"""``--model_args`` of ``--model kvbench``, checked before lm-eval loads a task or the model.

:func:`check_model_args` takes the arguments as lm-eval passes them to :class:`~kvbench.lmeval.model.KVBenchLM`
(``key=value,...`` or a mapping) and raises one :class:`~kvbench.errors.KVBenchError` for the first bad one, in
the words ``run.py`` uses for the same value: an unknown method preset, a budget string, a question mode, a dtype, a
model that is not there, a method knob or family parameter.  ``python -m kvbench.lmeval`` calls it on the command
line before handing it to lm-eval (:func:`precheck_argv`), and :class:`KVBenchLM` on its keyword arguments, so a
bad value costs a second, not a task download and a model load.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from kvbench.checks import check_choice, check_decode_batch, check_min
from kvbench.config import DTYPE_NAMES, QUESTION_MODES
from kvbench.errors import KVBenchError
from kvbench.lmeval.presets import budget_config, method_config, model_config, preset_names

LOG = logging.getLogger(__name__)

#: ``--model_args`` keys of ``--model kvbench`` besides ``method.<knob>`` / ``method.params.<key>``.
MODEL_ARG_KEYS = (
    "pretrained",
    "method",
    "budget",
    "question_mode",
    "dtype",
    "device",
    "revision",
    "max_length",
    "max_gen_toks",
    "add_bos_token",
    "prefix_token_id",
    "prefill_chunk",
    "decode_batch",
    "seed",
    "batch_size",
    "max_batch_size",
)


def parse_model_args(text: str) -> dict[str, Any]:
    """lm-eval's ``--model_args`` string (``a=1,b=x`` or a JSON object) as a dict, values typed as lm-eval does."""
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            parsed = json.loads(stripped)
        except json.JSONDecodeError as err:
            raise KVBenchError(f"--model_args {text!r} is not valid JSON ({err.msg}, column {err.colno}).") from None
        if not isinstance(parsed, dict):
            raise KVBenchError(f"--model_args {text!r}: a JSON object of key: value pairs is expected.")
        return parsed
    from lm_eval.utils import simple_parse_args_string

    try:
        return dict(simple_parse_args_string(stripped))
    except ValueError as err:
        raise KVBenchError(
            f"--model_args {text!r} cannot be parsed ({err}); the form is key=value,key=value (e.g. "
            "pretrained=tiny,method=snapkv,budget=0.2x)."
        ) from None


def check_model_args(args: Mapping[str, Any]) -> None:
    """Check every ``--model_args`` value of ``--model kvbench`` (see the module docstring)."""
    from omegaconf import OmegaConf

    from kvbench.app.validation import check_method
    from kvbench.models.source import resolve_model_source

    unknown = [key for key in args if key not in MODEL_ARG_KEYS and not str(key).startswith("method.")]
    if unknown:
        raise KVBenchError(
            f"unknown --model_args key(s) {unknown} for --model kvbench; valid: {', '.join(MODEL_ARG_KEYS)}, and "
            "method.<knob> / method.params.<key> overrides"
        )
    method_cfg = method_config(str(args.get("method", "full")))
    for key, value in args.items():
        if str(key).startswith("method."):
            set_method_key(method_cfg, str(key).removeprefix("method."), value)
    budget_config(str(args.get("budget", "full")))
    check_choice("question_mode", args.get("question_mode", "agnostic"), QUESTION_MODES, error=KVBenchError)
    if args.get("dtype") is not None:
        check_choice("dtype", args["dtype"], DTYPE_NAMES, error=KVBenchError)
    if args.get("decode_batch") is not None:
        check_decode_batch(args["decode_batch"], "decode_batch", error=KVBenchError)
    for key, minimum in (("max_length", 2), ("max_gen_toks", 1), ("prefill_chunk", 0), ("seed", 0)):
        if args.get(key) is not None:
            check_min(key, args[key], minimum, error=KVBenchError)
    pretrained = str(args.get("pretrained", "tiny"))
    try:
        resolve_model_source(model_config(pretrained))
    except KVBenchError as err:
        presets = ", ".join(preset_names("model"))
        raise KVBenchError(f"pretrained={pretrained!r}: {err} Or a kvbench model preset: {presets}.") from None
    check_method(OmegaConf.create({"method": method_cfg}))


def set_method_key(method_cfg: Any, key: str, value: Any) -> None:
    """Set ``method.<key>`` of ``method_cfg`` (a session knob spelt as before issue #57, ``window``, is
    ``params.window``: set there, with a one-line note)."""
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    from kvbench.app.validation import unknown_key_message
    from kvbench.config import SESSION_KNOBS, MethodConfig, session_knob_note

    if key in SESSION_KNOBS:
        LOG.warning(session_knob_note(key))
        key = f"params.{key}"
    if key.startswith("params."):
        with open_dict(method_cfg):
            OmegaConf.update(method_cfg, key, value, merge=True)
        return

    top = key.split(".", 1)[0]
    fields = list(OmegaConf.structured(MethodConfig))
    if top not in fields:
        raise KVBenchError(unknown_key_message(f"method.{key}", top, fields, "method.", added=False))
    try:
        OmegaConf.update(method_cfg, key, value, merge=True)
    except OmegaConfBaseException as err:
        raise KVBenchError(f"method.{key}={value!r} is not valid: {str(err).splitlines()[0]}.") from None


def precheck_argv(argv: Sequence[str]) -> None:
    """Check ``--model_args`` on lm-eval's command line when ``--model kvbench`` is chosen (nothing otherwise)."""
    model = _option(argv, "--model")
    if model != "kvbench":
        return
    check_model_args(parse_model_args(_option(argv, "--model_args") or ""))


def _option(argv: Sequence[str], name: str) -> str | None:
    """The value of ``name`` in ``argv`` (``--name value`` or ``--name=value``), the last one given."""
    value = None
    for index, arg in enumerate(argv):
        if arg == name and index + 1 < len(argv):
            value = argv[index + 1]
        elif arg.startswith(f"{name}="):
            value = arg.split("=", 1)[1]
    return value
