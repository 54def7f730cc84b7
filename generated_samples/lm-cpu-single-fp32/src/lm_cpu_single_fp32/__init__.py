"""lm-cpu-single-fp32: language model training project rendered by scaffold."""
