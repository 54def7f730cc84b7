# A smaller corpus, context and decoder than the example's: the ladder checks the machinery,
# and CPUs without native 16-bit matrix units run low-precision matmuls many times slower.
TEST_SETTINGS: dict[str, object] = {"corpus_bytes": 30_000, "block_size": 32, "model_size": "30K"}
# Ranks draw their own dropout: off where runs of 1 and 2 processes compare.
RANDOMNESS_OFF = ["dropout=0.0"]
