"""MATH-500 -> verl RL parquet; see hybridrl/data/preprocess/math500.py for the options."""

from hybridrl.data.preprocess.math500 import main

if __name__ == "__main__":
    main()
