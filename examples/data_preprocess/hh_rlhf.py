"""Anthropic HH-RLHF pairs -> parquet; see hybridrl/data/preprocess/hh_rlhf.py for the options."""

from hybridrl.data.preprocess.hh_rlhf import main

if __name__ == "__main__":
    main()
