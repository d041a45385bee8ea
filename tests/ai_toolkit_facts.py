"""What ai-toolkit's source at the pinned commit accepts in a job file, as names only: read from
its source folder (tests/ai_toolkit_env.py builds it) and printed as JSON, the facts
tests/fixtures/export/ai_toolkit_27a03a91.json holds for the tests that run without a clone.

    python ai_toolkit_facts.py   (in that folder, with its PYTHONPATH; ai_toolkit_env.facts())

Most facts are read from the syntax tree (which keys a class reads, which names a function
compares its argument with); the qtype tables of ai-toolkit's own quantizers are built by code,
so they are imported, and optimum-quanto's qtype names come from its qtype module at the version
ai-toolkit pins (installed beside the source, loaded alone).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import re
from pathlib import Path

CONFIG_MODULES = Path("toolkit/config_modules.py")
# The config class each section of an sd_trainer process is read into
# (jobs/process/BaseSDTrainProcess.py __init__), and train.ema_config's.
CLASSES = ("NetworkConfig", "TrainConfig", "ModelConfig", "SaveConfig", "SampleConfig",
           "DatasetConfig", "EMAConfig")  # fmt: skip
# The classes an sd_trainer process is (SDTrainer and its bases): their get_conf keys.
PROCESS_CLASSES = ("jobs/process/BaseProcess.py", "jobs/process/BaseTrainProcess.py",
                   "jobs/process/BaseSDTrainProcess.py", "extensions_built_in/sd_trainer/SDTrainer.py")  # fmt: skip
QUANTO_QTYPE = Path("quanto_pin/optimum/quanto/tensor/qtype.py")


def _tree(path: str | Path) -> ast.Module:
    return ast.parse(Path(path).read_text())


def _function(path: str | Path, name: str) -> ast.FunctionDef:
    return next(
        node
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.FunctionDef) and node.name == name
    )


def _strings(nodes: list[ast.expr]) -> list[str]:
    return [n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def class_keys(source: str) -> dict[str, set[str]]:
    """Every key each config class reads from its kwargs (`kwargs.get('key', ...)`): a key no
    class reads would be ignored by ai-toolkit without a word."""
    keys: dict[str, set[str]] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef):
            found = keys.setdefault(node.name, set())
            for call in ast.walk(node):
                if (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "get"
                    and isinstance(call.func.value, ast.Name)
                    and call.func.value.id == "kwargs"
                ):
                    found.update(_strings(call.args[:1]))
    return keys


def process_keys() -> list[str]:
    """The keys of a process an sd_trainer job reads: its classes' `self.get_conf('key', ...)`
    and what jobs/BaseJob.py reads from each process (`process['type']`)."""
    keys: set[str] = set()
    for path in PROCESS_CLASSES:
        for call in ast.walk(_tree(path)):
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "get_conf"
            ):
                keys.update(_strings(call.args[:1]))
    for node in ast.walk(_function("jobs/BaseJob.py", "load_processes")):
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id == "process"
        ):
            keys.update(_strings([node.slice]))
    return sorted(keys)


def compared(path: str, function: str, variable: str) -> list[str]:
    """The names a function compares its argument with (`variable == 'name'`)."""
    names: set[str] = set()
    for node in ast.walk(_function(path, function)):
        if (
            isinstance(node, ast.Compare)
            and isinstance(node.left, ast.Name)
            and node.left.id == variable
            and all(isinstance(op, ast.Eq) for op in node.ops)
        ):
            names.update(_strings(node.comparators))
    return sorted(names)


def literal(path: Path, alias: str) -> list[str]:
    """The names of a `Name = Literal[...]` alias."""
    for node in _tree(path).body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == alias
        ):
            assert isinstance(node.value, ast.Subscript)
            return _strings(list(getattr(node.value.slice, "elts", [node.value.slice])))
    raise AssertionError(f"{path} has no {alias}")


def class_attribute(path: Path, cls: str, attribute: str) -> str:
    for node in _tree(path).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for statement in node.body:
                if (
                    isinstance(statement, ast.Assign)
                    and isinstance(statement.targets[0], ast.Name)
                    and statement.targets[0].id == attribute
                ):
                    return _strings([statement.value])[0]
    raise AssertionError(f"{path} has no {cls}.{attribute}")


def _listed(path: Path, variable: str) -> list[str]:
    """The class names a module-level `variable = [A, B]` lists."""
    for node in _tree(path).body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == variable
        ):
            assert isinstance(node.value, ast.List)
            return [element.id for element in node.value.elts if isinstance(element, ast.Name)]
    return []


def registered_arches() -> list[str]:
    """The `arch` of each model class toolkit/util/get_model.py registers (its BUILT_IN_MODELS
    and each extensions_built_in package's AI_TOOLKIT_MODELS): get_model_class picks that class
    for the arch, and the legacy StableDiffusion class for any other."""
    classes = _listed(Path("toolkit/util/get_model.py"), "BUILT_IN_MODELS")
    for package in sorted(Path("extensions_built_in").glob("*/__init__.py")):
        classes += _listed(package, "AI_TOOLKIT_MODELS")
    arches: dict[str, set[str]] = {}
    for path in [*Path("toolkit").rglob("*.py"), *Path("extensions_built_in").rglob("*.py")]:
        try:
            tree = _tree(path)
        except SyntaxError:  # a file Python cannot compile defines no class it registers
            continue
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                for statement in node.body:
                    if (
                        isinstance(statement, ast.Assign)
                        and isinstance(statement.targets[0], ast.Name)
                        and statement.targets[0].id == "arch"
                    ):
                        arches.setdefault(node.name, set()).update(_strings([statement.value]))
    found = []
    for cls in classes:
        assert len(arches.get(cls, ())) == 1, f"model class {cls}: arch {arches.get(cls)}"
        found += arches[cls]
    return sorted(found)


def _rule(test: ast.expr) -> dict[str, str]:
    """One test of get_optimizer's chain on `lower_type`: equals, startswith or endswith."""
    if isinstance(test, ast.Compare) and isinstance(test.ops[0], ast.Eq):
        return {"equals": _strings(test.comparators)[0]}
    assert isinstance(test, ast.Call) and isinstance(test.func, ast.Attribute), ast.dump(test)
    assert test.func.attr in ("startswith", "endswith"), ast.dump(test)
    return {test.func.attr: _strings(test.args)[0]}


def _on_lower_type(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "lower_type" in ast.unparse(node.test)


def _chain(statements: list[ast.stmt]) -> list[dict]:
    """The if/elif chains on `lower_type` among these statements as ordered rules: the first that
    holds decides (each branch returns or ends the function). A rule with `then` accepts only when
    one of its own rules holds; a branch that only raises accepts none."""
    rules: list[dict] = []
    for first in [s for s in statements if _on_lower_type(s)]:
        branch: ast.stmt | None = first
        while branch is not None:
            assert isinstance(branch, ast.If)
            rule: dict = _rule(branch.test)
            nested = _chain(branch.body)
            if nested:
                rule["then"] = nested
            if not all(isinstance(s, ast.Raise) for s in branch.body):
                rules.append(rule)
            orelse = branch.orelse
            branch = orelse[0] if len(orelse) == 1 and _on_lower_type(orelse[0]) else None
    return rules


def optimizers() -> dict:
    """How toolkit/optimizer.py get_optimizer matches train.optimizer: the name lower-cased
    (`lower_type`), then its if/elif chain in order."""
    function = _function("toolkit/optimizer.py", "get_optimizer")
    lowered = any(
        "lower_type = optimizer_type.lower()" == ast.unparse(node) for node in function.body
    )
    assert lowered, "get_optimizer no longer lower-cases the name"
    return {"lowercased": lowered, "chain": _chain(function.body)}


def qtypes() -> dict[str, list[str]]:
    """The qtype names toolkit/util/quantize.py get_qtype resolves, in its order: torchao's
    (its torchao_qtypes), ai-toolkit's own quantizers' (get_ostris_quantizer's tables), and
    optimum-quanto's qtypes at ai-toolkit's pin."""
    torchao = next(
        node.value
        for node in _tree("toolkit/util/quantize.py").body
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "torchao_qtypes"
    )
    assert isinstance(torchao, ast.Dict)
    own: set[str] = set()
    for node in ast.walk(_function("toolkit/util/ostris_quant.py", "get_ostris_quantizer")):
        if isinstance(node, ast.ImportFrom):
            module = importlib.import_module(node.module or "")
            for alias in node.names:
                if alias.name.endswith("_QTYPES"):
                    own.update(getattr(module, alias.name))
    spec = importlib.util.spec_from_file_location("quanto_qtype", QUANTO_QTYPE)
    assert spec is not None and spec.loader is not None
    quanto = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quanto)
    return {
        "torchao": _strings(list(torchao.keys)),  # type: ignore[arg-type]
        "ai_toolkit": sorted(own),
        "optimum_quanto": sorted(quanto.qtypes),
    }


def quanto_pin() -> str:
    pins = Path("requirements_base.txt").read_text()
    found = re.search(r"^optimum-quanto==(\S+)$", pins, re.MULTILINE)
    assert found, "requirements_base.txt pins no optimum-quanto"
    installed = QUANTO_QTYPE.parents[3] / f"optimum_quanto-{found.group(1)}.dist-info"
    assert installed.is_dir(), f"the source folder holds no optimum-quanto {found.group(1)}"
    return found.group(1)


def facts(commit: str) -> dict:
    keys = class_keys(CONFIG_MODULES.read_text())
    return {
        "_source": f"ostris/ai-toolkit at {commit}: names read from its source by "
        "tests/ai_toolkit_facts.py (regenerate: AUTOFIT_REGENERATE_GOLDEN=1 pytest -m long "
        "tests/test_export_ai_toolkit.py -k facts, with a clone)",
        "job_types": compared("toolkit/job.py", "get_job", "job"),
        "process_type": class_attribute(
            Path("extensions_built_in/sd_trainer/__init__.py"), "SDTrainerExtension", "uid"
        ),
        "process_keys": process_keys(),
        "class_keys": {cls: sorted(keys[cls]) for cls in CLASSES},
        "arch": {
            "registered": registered_arches(),
            "model_arch": literal(CONFIG_MODULES, "ModelArch"),
        },
        "network_types": literal(CONFIG_MODULES, "NetworkType"),
        "dtypes": compared("toolkit/train_tools.py", "get_torch_dtype", "dtype_str"),
        "noise_schedulers": compared("toolkit/sampler.py", "get_sampler", "sampler"),
        "optimizers": optimizers(),
        "qtypes": qtypes(),
        "optimum_quanto": quanto_pin(),
    }


if __name__ == "__main__":
    import sys

    print(json.dumps(facts(sys.argv[1]), indent=1, sort_keys=True))
