"""Generation job: ``python -m hybridrl.trainer.main_generation key=value ...`` (``hybridrl generate``).

Samples ``data.n_samples`` responses for every prompt of a verl RL parquet and writes the input
rows plus a ``responses`` column (a list of ``n_samples`` strings) to ``data.output_path``, as
verl's ``main_generation`` does. Keys: ``hybridrl/config/generation.yaml``.

Resuming: each finished batch of ``data.batch_size`` prompts is written (atomically) as a part
file in ``<data.output_path>.parts/``, with a manifest of the settings that decide its content.
Started again with the same config, the job skips the batches found there; batch ``b`` samples
with the seed ``data.seed + b``, so a resumed run writes what an uninterrupted one would; a
damaged part is removed with a warning and generated again. The final parquet is written
atomically, then the parts folder is removed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time

from hybridrl.controller.worker import resolve_device
from hybridrl.data import RLHFDataset
from hybridrl.data.collate import collate_fn
from hybridrl.data.errors import DataError
from hybridrl.errors import ConfigError
from hybridrl.models import load_causal_lm, load_tokenizer, resolve_model_path
from hybridrl.models.external import import_external_lib
from hybridrl.protocol import DataProto
from hybridrl.trainer.jobs.generation_config import generation_config
from hybridrl.trainer.ppo.stages import GEN_BATCH_KEYS, trim_left_padding
from hybridrl.workers.rollout import RolloutEngineError, get_rollout_cls

_MANIFEST = "manifest.json"


def check_generation_config(config) -> None:
    """Start-up checks of the generation config.

    Raises:
        ConfigError: a size below 1, no output path, an output path that is an input file, or
            greedy decoding with ``data.n_samples > 1``.
    """
    data, rollout = config.data, config.rollout
    for key, value in (
        ("data.n_samples", data.n_samples),
        ("data.batch_size", data.batch_size),
        ("rollout.response_length", rollout.response_length),
    ):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"{key}={value!r} must be a whole number >= 1")
    if not data.output_path:
        raise ConfigError("data.output_path is empty; set it to the parquet file to write")
    inputs = [data.path] if isinstance(data.path, str) else list(data.path)
    if os.path.abspath(os.path.expanduser(data.output_path)) in {
        os.path.abspath(os.path.expanduser(p)) for p in inputs
    }:
        raise ConfigError(f"data.output_path={data.output_path!r} is also data.path; write the responses to a new file")
    greedy = not rollout.do_sample or rollout.temperature == 0
    if greedy and data.n_samples > 1:
        raise ConfigError(
            f"data.n_samples={data.n_samples} with greedy decoding (rollout.do_sample=false or "
            "rollout.temperature=0) gives identical responses; set data.n_samples=1 or sample"
        )


def parts_dir(output_path: str) -> str:
    """The folder holding the finished batches of ``output_path``."""
    return os.path.expanduser(output_path) + ".parts"


def _part_path(folder: str, batch: int) -> str:
    return os.path.join(folder, f"batch-{batch:06d}.parquet")


def _write_atomic_table(table, path: str) -> None:
    import pyarrow.parquet as pq

    tmp = f"{path}.tmp-{os.getpid()}"
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def open_parts(folder: str, manifest: dict, num_batches: int) -> set[int]:
    """Prepare ``folder`` for this run; return the batches already finished there.

    A folder left by a run with another manifest (other data, model, sampling or batching)
    is not reused.

    Raises:
        ConfigError: ``folder`` holds parts of a run with different settings.
    """
    manifest_path = os.path.join(folder, _MANIFEST)
    if os.path.isfile(manifest_path):
        try:
            with open(manifest_path, encoding="utf-8") as f:
                old = json.load(f)
        except (ValueError, OSError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise ConfigError(
                f"data.output_path: {manifest_path} is damaged ({type(exc).__name__}), so the batches "
                f"in {folder} cannot be checked against this run; delete {folder} to start over"
            ) from None
        if not isinstance(old, dict):
            old = {"manifest": old}
        if old != manifest:
            changed = sorted(k for k in set(old) | set(manifest) if old.get(k) != manifest.get(k))
            raise ConfigError(
                f"data.output_path: {folder} holds batches of an earlier run with other settings "
                f"({', '.join(changed)} changed); start that run again with its settings, or delete "
                "the folder (or pick another data.output_path) to start over"
            )
        return {b for b in range(num_batches) if _intact_part(folder, b, manifest)}
    os.makedirs(folder, exist_ok=True)
    tmp = manifest_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    os.replace(tmp, manifest_path)
    return set()


def _intact_part(folder: str, batch: int, manifest: dict) -> bool:
    """Whether batch ``batch`` is finished: its part file reads as parquet and holds its rows with
    ``n_samples`` responses each. A damaged part (cut, overwritten: parts are written atomically,
    so only the disk or a person damages one) is removed with a one-line warning and generated
    again; its seed is the batch's own, so the output is the same."""
    import pyarrow.parquet as pq

    path = _part_path(folder, batch)
    if not os.path.isfile(path):
        return False
    size = int(manifest["batch_size"])
    rows = list(range(batch * size, min((batch + 1) * size, int(manifest["num_prompts"]))))
    try:
        table = pq.read_table(path)
        ok = table.column("row").to_pylist() == rows and all(
            len(r) == int(manifest["n_samples"]) for r in table.column("responses").to_pylist()
        )
        problem = "does not hold the responses of its rows"
    except (OSError, ValueError, KeyError, TypeError) as exc:  # pyarrow's errors are ValueError/OSError
        ok, problem = False, f"cannot be read ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})"
    if not ok:
        print(f"hybridrl: warning: {path} {problem}; generating batch {batch} again", flush=True)
        os.remove(path)
    return ok


def write_part(folder: str, batch: int, rows: range, responses: list[list[str]]) -> None:
    """Write the responses of one finished batch (columns ``row``, ``responses``) atomically."""
    import pyarrow as pa

    table = pa.table({"row": pa.array(list(rows), pa.int64()), "responses": pa.array(responses, pa.list_(pa.string()))})
    _write_atomic_table(table, _part_path(folder, batch))


def generate_batch(rollout, tokenizer, dataset, rows: range, n_samples: int) -> list[list[str]]:
    """``n_samples`` decoded responses for each prompt ``dataset[i]``, ``i`` in ``rows``.

    Prompts are collated as in training, trimmed of all-padding columns and repeated
    ``n_samples`` times (interleaved: the responses of a prompt are adjacent); each response
    is decoded up to and including its EOS, special tokens skipped (as the reward manager does).
    """
    collated = collate_fn([dataset[i] for i in rows])
    prompts = DataProto.from_dict(tensors={key: collated[key] for key in GEN_BATCH_KEYS})
    output = rollout.generate_sequences(trim_left_padding(prompts).repeat(n_samples, interleave=True))
    lengths = output.batch["response_mask"].sum(-1).tolist()
    texts = [
        tokenizer.decode(ids[: int(n)], skip_special_tokens=True) for ids, n in zip(output.batch["responses"], lengths)
    ]
    return [texts[i * n_samples : (i + 1) * n_samples] for i in range(len(rows))]


def write_output(data_files, folder: str, num_batches: int, output_path: str) -> str:
    """Join the input rows with the responses of every part; write ``output_path`` atomically.

    An input ``responses`` column is replaced. Returns the written path.

    Raises:
        DataError: the parts do not cover the input rows one to one (the input changed).
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    files = [data_files] if isinstance(data_files, str) else list(data_files)
    table = pa.concat_tables([pq.read_table(os.path.expanduser(f)) for f in files], promote_options="default")
    parts = pa.concat_tables([pq.read_table(_part_path(folder, b)) for b in range(num_batches)])
    parts = parts.take(pc.sort_indices(parts, [("row", "ascending")]))
    if parts.column("row").to_pylist() != list(range(table.num_rows)):
        raise DataError(
            f"data.path: the input has {table.num_rows} rows but the batches in {folder} hold "
            f"{parts.num_rows}; the input changed during the run: delete {folder} and start over"
        )
    responses = parts.column("responses")
    if "responses" in table.column_names:
        print("hybridrl generate: note: the input's 'responses' column is replaced", flush=True)
        table = table.drop_columns(["responses"])
    table = table.append_column("responses", responses)
    path = os.path.expanduser(output_path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    _write_atomic_table(table, path)
    return path


def _manifest(config, dataset, model_path: str) -> dict:
    """What decides the content of the parts: a resumed run must match it exactly."""
    prompts = hashlib.sha256("\x00".join(dataset.full_prompts).encode()).hexdigest()
    rollout = {
        k: getattr(config.rollout, k)
        for k in ("name", "temperature", "top_k", "top_p", "do_sample", "response_length", "ignore_eos", "dtype")
    }
    return {
        "prompts_sha256": prompts,
        "num_prompts": len(dataset),
        "batch_size": int(config.data.batch_size),
        "n_samples": int(config.data.n_samples),
        "seed": int(config.data.seed),
        "model_path": model_path,
        "rollout": rollout,
    }


def _build_rollout(config, model_path: str, tokenizer):
    try:
        rollout_cls = get_rollout_cls(config.rollout.name)
    except ValueError as exc:
        raise ConfigError(str(exc).replace("actor_rollout_ref.rollout.name", "rollout.name")) from exc
    import_external_lib(config.model.external_lib)
    module = load_causal_lm(model_path, dtype=config.rollout.dtype, trust_remote_code=config.model.trust_remote_code)
    module.to(resolve_device(config.trainer.device))
    try:
        return rollout_cls(module, config.rollout, tokenizer, getattr(module, "generation_config", None))
    except RolloutEngineError as exc:  # the engines name training's keys; this job's are rollout.*, model.*
        text = str(exc).replace("actor_rollout_ref.rollout.", "rollout.").replace("actor_rollout_ref.model.", "model.")
        raise RolloutEngineError(text) from exc


def run_generation(config) -> str:
    """Runs the generation job with a resolved config; returns the written parquet path.

    Raises:
        a :class:`~hybridrl.errors.UserError` (ConfigError, DataError, ModelPathError, ...).
    """
    import torch
    from omegaconf import OmegaConf

    config = OmegaConf.structured(generation_config(config))  # every key present, typed
    check_generation_config(config)
    data = config.data
    model_path = resolve_model_path(config.model.path, config_key="model.path")
    tokenizer = load_tokenizer(
        model_path, trust_remote_code=config.model.trust_remote_code, chat_template=config.model.custom_chat_template
    )
    dataset = RLHFDataset(
        data.path,
        tokenizer,
        {
            "prompt_key": data.prompt_key,
            "max_prompt_length": data.max_prompt_length,
            "truncation": data.truncation,
            "apply_chat_template_kwargs": data.apply_chat_template_kwargs,
        },
        config_key="data.path",
    )
    batch_size, n_samples = int(data.batch_size), int(data.n_samples)
    num_batches = -(-len(dataset) // batch_size)
    folder = parts_dir(data.output_path)
    done = open_parts(folder, _manifest(config, dataset, model_path), num_batches)
    if done:
        print(f"hybridrl generate: resuming: {len(done)} of {num_batches} batches already in {folder}", flush=True)
    todo = [b for b in range(num_batches) if b not in done]
    rollout = _build_rollout(config, model_path, tokenizer) if todo else None
    for b in todo:
        rows = range(b * batch_size, min((b + 1) * batch_size, len(dataset)))
        start = time.perf_counter()
        torch.manual_seed(int(data.seed) + b)
        write_part(folder, b, rows, generate_batch(rollout, tokenizer, dataset, rows, n_samples))
        print(
            f"hybridrl generate: batch {b + 1}/{num_batches}: {len(rows)} prompts x {n_samples} "
            f"responses in {time.perf_counter() - start:.1f} s",
            flush=True,
        )
    path = write_output(data.path, folder, num_batches, data.output_path)
    shutil.rmtree(folder)
    print(f"hybridrl generate: wrote {len(dataset)} rows x {n_samples} responses to {path}", flush=True)
    return path


def main(argv: list[str] | None = None) -> int:
    """``hybridrl generate key=value ...`` (see :func:`hybridrl.cli.run_cli`)."""
    from hybridrl.cli import run_cli  # the entry point hands over to the command line (see .importlinter)

    return run_cli(run_generation, "generation", argv)


if __name__ == "__main__":
    sys.exit(main())
