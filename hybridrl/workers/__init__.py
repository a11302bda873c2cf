"""Workers. Importing the package registers the judge reward manager (``reward_model.reward_manager=judge``)."""

from hybridrl.workers import llm_judge  # noqa: F401
