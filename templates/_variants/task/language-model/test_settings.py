TEST_SETTINGS: dict[str, object] = {"corpus_bytes": 60_000}
# Ranks draw their own dropout: off where runs of 1 and 2 processes compare.
RANDOMNESS_OFF = ["dropout=0.0"]