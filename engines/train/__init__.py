"""Training the shared LoRA adapter on stored rows: the rows and their Parquet file (`rows`), one TRR++
policy-gradient step (`step`) through a TRL `GRPOTrainer` subclass (`trl_trainer`, configured for one pass by
`build`) that scores each row's completion at its own sampling temperature (`logprobs`) and reports each
optimizer update as it ends (`updates`), in this process or as `python -m sage.engines.train` in its own
(`__main__`), and merging an adapter into its base model for serving (`merge`)."""
