"""The registry, the shared checks and method parameters validated in one place (issue #21): every error names the
key, the value and what is valid.  Pure Python, well under a second."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kvbench.checks import check_choice, check_known_keys, check_min, check_range
from kvbench.errors import KVBenchError
from kvbench.eviction.base import METHOD_FAMILIES, method_families
from kvbench.eviction.params import bounded, choice, parse_params
from kvbench.registry import Registry
from kvbench.tasks.base import DATA_PREPARERS, TASK_KINDS, task_kinds


def test_registry_registers_once_and_lists_valid_names_for_an_unknown_one() -> None:
    discovered = []
    registry: Registry[int] = Registry("test family", discover=lambda: discovered.append(True))
    registry.register("b")(2)
    registry.register("a")(1)
    assert registry.get("a") == 1 and registry.names() == ["a", "b"] and "b" in registry
    assert discovered == [True]  # discovery runs once, before the first lookup
    with pytest.raises(ValueError, match="is registered twice"):
        registry.register("a")(3)
    with pytest.raises(ValueError, match=r"unknown test family 'c'; valid families: a, b"):
        registry.get("c")


def test_registry_retries_a_discovery_that_failed() -> None:
    calls = []

    def discover() -> None:
        calls.append(True)
        if len(calls) == 1:
            raise ImportError("broken plug-in")

    registry: Registry[int] = Registry("thing", discover=discover)
    with pytest.raises(ImportError):
        registry.names()
    assert registry.names() == [] and len(calls) == 2


def test_the_three_registries_are_one_helper() -> None:
    assert all(isinstance(r, Registry) for r in (METHOD_FAMILIES, TASK_KINDS, DATA_PREPARERS))
    assert {"snapkv", "cake", "nacl", "full"} <= set(method_families())
    assert {"ruler", "needlebench", "longbench", "tiny_niah"} <= set(task_kinds())
    with pytest.raises(ValueError, match=r"unknown method family 'snapk'; valid families: .*snapkv"):
        METHOD_FAMILIES.get("snapk")


def test_checks_name_the_key_the_value_and_what_is_valid() -> None:
    assert check_choice("method.pooling", "avg", ("max", "avg")) == "avg"
    with pytest.raises(KVBenchError, match=r"^method.pooling='median' is not valid; valid: max, avg, or null"):
        check_choice("method.pooling", "median", ("max", "avg"), "or null", error=KVBenchError)
    with pytest.raises(ValueError, match=r"task.num_samples=0 is not valid: it must be an integer >= 1"):
        check_min("task.num_samples", 0, 1)
    with pytest.raises(ValueError, match=r"must be an integer"):
        check_min("run.threads", True, 1)
    with pytest.raises(ValueError, match=r"x=0 is not valid: it must be a number in \(0, 1\]"):
        check_range("x", 0, 0.0, 1.0, low_open=True)
    with pytest.raises(ValueError, match=r"x=-1 is not valid: it must be a number in \[0, inf\)"):
        check_range("x", -1, low=0)
    with pytest.raises(ValueError, match=r"unknown task.options key\(s\) \['z'\] for task 'ruler'; valid keys: a, b"):
        check_known_keys({"z": 1, "a": 2}, ("b", "a"), "task.options", "task 'ruler'")
    check_known_keys({"a": 1}, ("a",), "task.options")


@dataclass
class _Params:
    mode: str = choice("fast", ("fast", "exact"))
    ratio: float | None = bounded(None, 0.0, 1.0, low_open=True)
    kernel: int = bounded(7, low=1, odd=True)
    flag: bool = False


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"mode": "slow"}, r"method.params.mode='slow' is not valid; valid: fast, exact"),
        ({"ratio": 0}, r"method.params.ratio=0 is not valid: it must be a number in \(0, 1\]"),
        ({"ratio": "half"}, r"method.params.ratio='half' is not valid: it must be a number or null"),
        ({"kernel": 4}, r"method.params.kernel=4 is not valid: it must be odd"),
        ({"kernel": 7.0}, r"method.params.kernel=7.0 is not valid: it must be an integer"),
        ({"flag": "yes"}, r"method.params.flag='yes' is not valid: it must be a boolean"),
        ({"nope": 1}, r"unknown method.params key\(s\) \['nope'\] for family 'demo'; valid keys: flag, kernel"),
    ],
)
def test_parse_params_validates_every_given_value(given: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_params(_Params, given, "demo")


def test_parse_params_accepts_valid_values_and_keeps_defaults() -> None:
    params = parse_params(_Params, {"mode": "exact", "ratio": 1, "kernel": 3, "flag": True}, "demo")
    assert (params.mode, params.ratio, params.kernel, params.flag) == ("exact", 1, 3, True)
    assert parse_params(_Params, None, "demo") == _Params()
    assert parse_params(_Params, {"ratio": None}, "demo").ratio is None


# ---------------------------------------------------------------------------------------------------- task kinds
@pytest.fixture
def plugin_kind():
    """A task kind registered from outside kvbench, describing its datasets, a package and a shipped data folder."""
    from kvbench.tasks.base import PackageNeed, register_task

    def dataset_names(task) -> list[str]:
        return ["alpha", "beta"] if task["language"] is None else [f"alpha_{task['language']}"]

    def required_packages(task) -> list[PackageNeed]:
        if (task.options or {}).get("scorer") != "fancy":
            return []
        return [PackageNeed("kvbench_no_such_module", "task.options.scorer=fancy", "Install it with `pip install x`.")]

    register_task(
        "plugin_kind",
        dataset_names=dataset_names,
        required_packages=required_packages,
        data_dir_values={"bundled": "the plug-in's bundled files"},
        preparer="plugin_bench",
    )(lambda task_cfg, tokenizer, chat_template=False: [])
    yield "plugin_kind"
    TASK_KINDS.unregister("plugin_kind")


def plugin_config(tmp_path, *overrides: str):
    from hydra import compose, initialize_config_dir

    from kvbench import resources
    from kvbench.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(resources.conf_dir()), version_base="1.3"):
        return compose(
            "config",
            overrides=["task.kind=plugin_kind", "task.lengths=null", f"run.output_root={tmp_path}", *overrides],
        )


def test_validation_asks_the_task_kind_for_its_dataset_names(plugin_kind, tmp_path) -> None:
    """No kind is special-cased: a plug-in kind's own names are the valid choices, for its own settings."""
    from kvbench.app.validation import check_config

    check_config(plugin_config(tmp_path, "task.datasets=[beta]"))
    with pytest.raises(KVBenchError, match=r"task.datasets=\['gamma'\] are not datasets .*valid datasets: alpha, beta"):
        check_config(plugin_config(tmp_path, "task.datasets=[gamma]"))
    with pytest.raises(KVBenchError, match=r"\['beta'\] .*valid datasets: alpha_en"):
        check_config(plugin_config(tmp_path, "task.datasets=[beta]", "task.language=en"))


def test_validation_asks_the_task_kind_for_packages_and_data_folders(plugin_kind, tmp_path) -> None:
    from kvbench.app.validation import check_environment

    check_environment(plugin_config(tmp_path, "task.data_dir=bundled"), check_model=False)
    needs = r"task.options.scorer=fancy needs .*'kvbench_no_such_module'.*pip install x"
    with pytest.raises(KVBenchError, match=needs):
        check_environment(plugin_config(tmp_path, "+task.options.scorer=fancy"), check_model=False)
    missing = "task.data_dir='/nonexistent' does not exist.*prepare_data.py plugin_bench.*task.data_dir=bundled"
    with pytest.raises(KVBenchError, match=missing):
        check_environment(plugin_config(tmp_path, "task.data_dir=/nonexistent"), check_model=False)


def test_task_kinds_describe_themselves_without_torch_or_transformers() -> None:
    """Validation asks every registered kind before heavy imports: the task modules import neither."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from kvbench.tasks.base import TASK_KINDS\n"
        "kinds = TASK_KINDS.as_dict()\n"
        "print(kinds['longbench'].dataset_names({'kind': 'longbench'})[:2], kinds['lmeval'].dataset_names)\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["['narrativeqa', 'qasper'] None", "[]"]
