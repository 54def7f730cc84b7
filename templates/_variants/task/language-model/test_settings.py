# A smaller corpus and decoder than the example's: the ladder checks the machinery, and CPUs
# without native 16-bit matrix units run low-precision matmuls many times slower than fp32.
TEST_SETTINGS: dict[str, object] = {"corpus_bytes": 60_000, "model_size": "100K"}
# Ranks draw their own dropout: off where runs of 1 and 2 processes compare.
RANDOMNESS_OFF = ["dropout=0.0"]
