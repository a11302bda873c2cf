"""GSM8K -> verl RL parquet; see hybridrl/data/preprocess/gsm8k.py for the options."""

from hybridrl.data.preprocess.gsm8k import main

if __name__ == "__main__":
    main()
