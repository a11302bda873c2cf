"""Writes tests/trainer/verl_sft_keys.json: every key of verl's SFT configs, composed as verl
composes them (defaults lists included), with its default, per verl source.

    python tests/trainer/make_verl_sft_keys.py <verl>/verl/trainer/config "verl 0.9.1 (PyPI wheel)"

adds (or replaces) that source's configs (``sft_trainer.yaml`` when the folder has it: verl's
``fsdp_sft_trainer``; ``sft_trainer_engine.yaml``: its engine SFT trainer). ``_target_`` keys
(verl's class names) are left out; interpolations stay as written.
"""

from __future__ import annotations

import json
import os
import sys

OUT = os.path.join(os.path.dirname(__file__), "verl_sft_keys.json")
CONFIGS = {"sft_trainer": "verl.trainer.fsdp_sft_trainer", "sft_trainer_engine": "verl.trainer.sft_trainer"}


def leaves(node, prefix: str = "") -> dict:
    from omegaconf import OmegaConf

    out = {}
    for key in node.keys():
        child, name = node._get_node(key), f"{prefix}{key}"
        if OmegaConf.is_dict(child):
            out.update(leaves(child, name + ".") if len(child) else {name: {}})
        elif OmegaConf.is_list(child):
            out[name] = OmegaConf.to_container(child)
        elif not name.endswith("_target_"):
            out[name] = child._value()
    return out


def compose(config_dir: str, name: str) -> dict:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=os.path.abspath(config_dir), version_base=None):
        return leaves(hydra_compose(config_name=name))


def main(config_dir: str, source: str) -> None:
    data = {"sources": []}
    if os.path.exists(OUT):
        with open(OUT) as f:
            data = json.load(f)
    data["sources"] = [s for s in data["sources"] if s["source"] != source]
    for name, entry in CONFIGS.items():
        if os.path.exists(os.path.join(config_dir, f"{name}.yaml")):
            keys = compose(config_dir, name)
            data["sources"].append({"source": source, "config": f"{name}.yaml", "entry": entry, "keys": keys})
    with open(OUT, "w") as f:
        json.dump(data, f, indent=1, sort_keys=False, default=str)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
