"""The house counts of issue 29, measured on the source tree (no imports of hybridrl).

    python benchmarks/house_counts.py [--root .]

Prints one JSON line:
- ``dotted_config_reads``: calls that read a config by a dotted-string key (``_get``,
  ``_int_at_least``, ``OmegaConf.select`` with an f-string or a key holding a dot) in the package;
- ``meta_info_settings``: places in ``hybridrl/workers`` that read a run setting from a batch's
  ``meta_info`` or write one into it (``metrics`` and ``global_steps`` travel as data, not settings);
- ``private_cross_module_imports``: ``from x import _name`` where ``x`` is another module of the package;
- ``trainer_modules``: ``.py`` files directly in ``hybridrl/trainer``;
- ``noqa``: ``# noqa`` comments in the package and the tests.
"""

from __future__ import annotations

import argparse
import ast
import json
import pathlib

DOTTED_READERS = {"_get", "_int_at_least", "select"}
DATA_KEYS = {"metrics", "global_steps", "global_token_num", "validate", "do_sample"}


def _python_files(folder: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def _called_name(node: ast.Call) -> str | None:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _is_key(node: ast.expr) -> bool:
    """A dotted config key: an f-string, or a string literal with a dot (``"data.seed"``, not a batch key)."""
    return isinstance(node, ast.JoinedStr) or (
        isinstance(node, ast.Constant) and isinstance(node.value, str) and "." in node.value
    )


def dotted_config_reads(tree: ast.AST) -> int:
    return sum(
        1
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and _called_name(node) in DOTTED_READERS
        and len(node.args) >= 2
        and _is_key(node.args[1])
    )


def _meta_key(node: ast.AST) -> str | None:
    """The key of ``x.meta_info["key"]`` / ``x.meta_info.get("key")``, else None."""
    if isinstance(node, ast.Subscript) and _is_meta(node.value) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("get", "pop")
        and _is_meta(node.func.value)
        and node.args
        and isinstance(node.args[0], ast.Constant)
    ):
        return str(node.args[0].value)
    return None


def _is_meta(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "meta_info") or (
        isinstance(node, ast.Name) and node.id in ("meta", "meta_info")
    )


def meta_info_settings(tree: ast.AST) -> int:
    count = 0
    for node in ast.walk(tree):
        key = _meta_key(node)
        if key is not None and key not in DATA_KEYS:
            count += 1
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "update"
            and _is_meta(node.func.value)
        ):
            count += 1
    return count


def private_imports(tree: ast.AST, module: str) -> int:
    count = 0
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            source = package.rsplit(".", node.level - 1)[0] + ("." + node.module if node.module else "")
        else:
            source = node.module or ""
        if not source.startswith("hybridrl") or source == module:
            continue
        count += sum(1 for alias in node.names if alias.name.startswith("_") and not alias.name.startswith("__"))
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=".")
    root = pathlib.Path(parser.parse_args().root)
    counts = dict.fromkeys(("dotted_config_reads", "meta_info_settings", "private_cross_module_imports"), 0)
    for path in _python_files(root / "hybridrl"):
        tree = ast.parse(path.read_text())
        module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        counts["dotted_config_reads"] += dotted_config_reads(tree)
        counts["private_cross_module_imports"] += private_imports(tree, module)
        if path.parts[-2] == "workers" or "workers" in path.relative_to(root).parts:
            counts["meta_info_settings"] += meta_info_settings(tree)
    counts["trainer_modules"] = sum(1 for p in (root / "hybridrl" / "trainer").glob("*.py") if p.name != "__init__.py")
    counts["noqa"] = sum(
        path.read_text().count("# noqa") for folder in ("hybridrl", "tests") for path in _python_files(root / folder)
    )
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
