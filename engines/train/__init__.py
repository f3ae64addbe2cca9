"""Training the shared LoRA adapter on stored rows: the rows and their Parquet file (`rows`), one TRR++
policy-gradient step (`step`) through a TRL `GRPOTrainer` subclass (`trainer`) that scores each row's completion
at its own sampling temperature (`logprobs`, with the CPU training attention of `attention`), run in this
process, in its own or under `accelerate launch` (`launch`, which starts `python -m sage.engines.train`), and
merging an adapter into its base model for serving (`merge`).

Importing this package, `rows` or `launch` loads neither torch nor TRL; `step` and `trainer` load both."""

#: File written next to the adapter weights, with the metrics of the step that produced them.
METRICS_FILE = "sage_train_metrics.json"
#: File written next to the adapter weights: AdamW's state (moments, step count) and the scheduler's, which the
#: next iteration's step loads (SAGE.md step 11: the optimizer state carries from iteration to iteration). Not
#: part of what serves the adapter: `sage export` leaves it out, checkpoint retention deletes it first.
OPTIMIZER_FILE = "sage_optimizer.pt"
