"""Write ~/data/arithmetic/{train,test}.parquet: see hybridrl/data/preprocess/arithmetic.py."""

from hybridrl.data.preprocess.arithmetic import main

if __name__ == "__main__":
    main()
