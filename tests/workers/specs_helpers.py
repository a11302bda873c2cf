"""Pass specs for tests that drive PPOActor / PPOCritic directly, built as the workers build them
(:mod:`hybridrl.workers.pass_specs`) from a section and its per-worker batch sizes."""

from hybridrl.config.batch_sizes import worker_batch_sizes
from hybridrl.workers.pass_specs import UpdateSpec, update_spec


def update_spec_of(section, rollout_n: int = 1, world_size: int = 1, **options) -> UpdateSpec:
    """The update spec of an actor or critic ``section`` on one of ``world_size`` workers;
    ``options``: ``temperature``, ``use_remove_padding``."""
    prefix = "critic" if "cliprange_value" in section else "actor_rollout_ref.actor"
    return update_spec(section, worker_batch_sizes(section, rollout_n, world_size), prefix, **options)
