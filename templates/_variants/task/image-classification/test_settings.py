TEST_SETTINGS: dict[str, object] = {}  # the digits are small already
# Ranks draw their own random shifts and dropout: off where runs of 1 and 2 processes compare.
RANDOMNESS_OFF = ["augment=false", "dropout=0.0"]