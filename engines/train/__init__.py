"""Training the shared LoRA adapter on stored rows: the rows and their Parquet file (`rows`), one TRR++
policy-gradient step (`step`) through a TRL `GRPOTrainer` subclass (`trainer`) that scores each row's completion
at its own sampling temperature (`logprobs`, with the CPU training attention of `attention`), run in this
process, in its own or under `accelerate launch` (`launch`, which starts `python -m sage.engines.train`), and
merging an adapter into its base model for serving (`merge`).

Importing this package, `rows` or `launch` loads neither torch nor TRL; `step` and `trainer` load both."""
