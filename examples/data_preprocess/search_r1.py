"""QA (NQ-open, FlashRAG) -> verl RL parquet for a search agent; see hybridrl/agents/search_r1_data.py."""

from hybridrl.agents.search_r1_data import main

if __name__ == "__main__":
    main()
