# A quarter of the example's model: the ladder checks the machinery, and CPUs without native
# 16-bit matrix units run low-precision convolutions several times slower than fp32. The batch,
# learning rate and schedule are the example's own, whatever the planner chose for the model
# size this project was rendered at.
TEST_SETTINGS: dict[str, object] = {"model_size": "25K", "micro_batch_size": 64, "lr": 2e-3}
TEST_SETTINGS |= {"grad_accum_steps": 1, "warmup_steps": 40, "activation_checkpointing": False}
# Ranks draw their own random shifts and dropout: off where runs of 1 and 2 processes compare.
RANDOMNESS_OFF = ["augment=false", "dropout=0.0"]
# Libraries a run imports besides the project's modules (tests/launcher.py preloads them).
RUN_IMPORTS: list[str] = ["sklearn.datasets"]  # build_datasets imports it
