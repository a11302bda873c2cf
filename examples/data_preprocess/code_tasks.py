"""The generated code-writing task -> verl RL parquet; see hybridrl/data/preprocess/code_tasks.py for the options."""

from hybridrl.data.preprocess.code_tasks import main

if __name__ == "__main__":
    main()
