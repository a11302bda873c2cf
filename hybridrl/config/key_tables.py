"""Key paths of the PPO config's role sections, for messages and key lookups.

Which keys this build ignores or refuses is field metadata of the typed config
(``hybridrl.config.typed.ignored`` / ``refused``), read by the start-up check.
"""

from __future__ import annotations

ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"
REF = "actor_rollout_ref.ref"
