# A smaller corpus, context and decoder than the example's: the ladder checks the machinery,
# and CPUs without native 16-bit matrix units run low-precision matmuls many times slower. The
# batch, learning rate and schedule are the example's own, whatever the planner chose for the
# model size this project was rendered at.
TEST_SETTINGS: dict[str, object] = {"corpus_bytes": 30_000, "block_size": 32, "model_size": "30K"}
# The tests' corpus, prepared by the first test that reads it (wherever a test runs from).
# Byte tokens whatever the planned tokenizer: no BPE to train, and a corpus this small in bytes
# still holds the validation batches the ladder reads (NUM_CLASSES holds them at any plan).
TEST_SETTINGS |= {"data_dir": str(PROJECT_ROOT / "data" / "stdlib-tests"), "tokenizer": "bytes"}
TEST_SETTINGS |= {"micro_batch_size": 32, "grad_accum_steps": 1, "lr": 2e-3, "warmup_steps": 50}
TEST_SETTINGS |= {"activation_checkpointing": False}
# Ranks draw their own dropout: off where runs of 1 and 2 processes compare.
RANDOMNESS_OFF = ["dropout=0.0"]
# Libraries a run imports besides the project's modules (tests/launcher.py preloads them).
RUN_IMPORTS: list[str] = []
