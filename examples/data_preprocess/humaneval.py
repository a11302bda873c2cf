"""HumanEval -> verl RL parquet; see hybridrl/data/preprocess/humaneval.py for the options."""

from hybridrl.data.preprocess.humaneval import main

if __name__ == "__main__":
    main()
