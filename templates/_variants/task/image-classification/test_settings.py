# A quarter of the example's model: the ladder checks the machinery, and CPUs without native
# 16-bit matrix units run low-precision convolutions several times slower than fp32.
TEST_SETTINGS: dict[str, object] = {"model_size": "25K"}
# Ranks draw their own random shifts and dropout: off where runs of 1 and 2 processes compare.
RANDOMNESS_OFF = ["augment=false", "dropout=0.0"]
